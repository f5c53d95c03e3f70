"""Field errors as the API server reports them (apimachinery's `field.Error`), and its checks of object
names and namespaces."""

from __future__ import annotations

import re
from typing import Any


class FieldError:
    """One invalid field, rendered the way apimachinery's `field.Error` prints."""

    REASONS = {
        "Invalid value": "FieldValueInvalid",
        "Required value": "FieldValueRequired",
        "Unsupported value": "FieldValueNotSupported",
        "Forbidden": "FieldValueForbidden",
        "Duplicate value": "FieldValueDuplicate",
        "Too many": "FieldValueTooMany",
        "Too long": "FieldValueTooLong",
    }

    def __init__(
        self,
        field: str,
        kind: str,
        detail: str = "",
        value: Any = None,
        show_value: bool = True,
        *,
        type_invalid: bool = False,
    ):
        self.field = field
        self.type_invalid = type_invalid
        """A value of the wrong type (`field.ErrorTypeTypeInvalid`): CEL rules are not evaluated then."""
        self.kind = kind
        self.detail = detail
        self.value = value
        self.show_value = show_value and kind in ("Invalid value", "Unsupported value", "Duplicate value")

    @property
    def message(self) -> str:
        text = self.kind
        if self.show_value:
            text += f": {render_value(self.value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message

    def cause(self) -> dict[str, Any]:
        reason = "FieldValueTypeInvalid" if self.type_invalid else self.REASONS.get(self.kind, "FieldValueInvalid")
        return {"reason": reason, "message": self.message, "field": self.field}


_GO_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _go_quote(text: str) -> str:
    """A string as Go's `%q` writes it: control characters escaped, printable Unicode kept."""
    return (
        '"'
        + "".join(
            _GO_ESCAPES.get(c, c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
            for c in text
        )
        + '"'
    )


def render_value(value: Any) -> str:
    """Format a value the way Go's `%#v`-ish field errors show it."""
    if isinstance(value, str):
        return _go_quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return str(value)


#: RFC 1123 names as apimachinery checks them (`IsDNS1123Subdomain`, `IsDNS1123Label`).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def name_errors(name: Any, field: str = "metadata.name", *, label: bool = False) -> list[FieldError]:
    """The server's check of an object name: an RFC 1123 subdomain (at most 253), or a label (at most 63)."""
    limit, pattern, message = (63, _DNS_LABEL, _LABEL_MESSAGE) if label else (253, _DNS_SUBDOMAIN, _SUBDOMAIN_MESSAGE)
    if not isinstance(name, str):
        return [FieldError(field, "Invalid value", message, name)]
    found = []
    if len(name) > limit:
        found.append(FieldError(field, "Invalid value", f"must be no more than {limit} characters", name))
    if not pattern.fullmatch(name):
        found.append(FieldError(field, "Invalid value", message, name))
    return found


def metadata_errors(metadata: Any, *, namespaced: bool) -> list[FieldError]:
    """Problems with `metadata.name` (or `generateName`) and `metadata.namespace`, as the server reports them."""
    metadata = metadata if isinstance(metadata, dict) else {}
    found = []
    name = metadata.get("name")
    if not name and not metadata.get("generateName"):
        found.append(FieldError("metadata.name", "Required value", "name or generateName is required"))
    elif name:
        found += name_errors(name)
    namespace = metadata.get("namespace")
    if namespaced and namespace:
        found += name_errors(namespace, "metadata.namespace", label=True)
    return found
