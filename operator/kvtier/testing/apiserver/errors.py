"""Kubernetes `Status` errors.

Every failure the emulator reports is a :class:`StatusError`; the HTTP layer renders it as the
`Status` object the real API server sends (kind, reason, code, details with causes).
"""

from __future__ import annotations

from typing import Any

from kvtier.api.fielderrors import FieldError, render_value  # noqa: F401 - the server's errors are the API's


class StatusError(Exception):
    """An API error carrying everything needed to render a `meta.k8s.io/v1 Status`."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after = retry_after

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        details = dict(self.details or {})
        if self.retry_after is not None:
            details["retryAfterSeconds"] = int(self.retry_after)
        if details:
            status["details"] = details
        return status


def _details(name: str | None, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {"group": group, "kind": kind}
    if name:
        details["name"] = name
    return details


def not_found(group: str, resource: str, name: str) -> StatusError:
    qualified = f"{resource}.{group}" if group else resource
    return StatusError(404, "NotFound", f'{qualified} "{name}" not found', details=_details(name, group, resource))


def already_exists(group: str, resource: str, name: str) -> StatusError:
    qualified = f"{resource}.{group}" if group else resource
    return StatusError(
        409,
        "AlreadyExists",
        f'{qualified} "{name}" already exists',
        details=_details(name, group, resource),
    )


def conflict(group: str, resource: str, name: str, why: str) -> StatusError:
    qualified = f"{resource}.{group}" if group else resource
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        details=_details(name, group, resource),
    )


def stale_conflict(group: str, resource: str, name: str) -> StatusError:
    return conflict(
        group,
        resource,
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> StatusError:
    return StatusError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str, accepted: list[str]) -> StatusError:
    return StatusError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: {', '.join(accepted)}",
    )


def gone(message: str) -> StatusError:
    return StatusError(410, "Expired", message)


def forbidden(group: str, resource: str, name: str, message: str) -> StatusError:
    return StatusError(403, "Forbidden", message, details=_details(name, group, resource))


def invalid(group: str, kind: str, name: str, errors: list[FieldError]) -> StatusError:
    qualified = f"{kind}.{group}" if group else kind
    if len(errors) == 1:
        summary = str(errors[0])
    else:
        summary = "[" + ", ".join(str(e) for e in errors) + "]"
    details = _details(name, group, kind)
    details["causes"] = [e.cause() for e in errors]
    return StatusError(422, "Invalid", f'{qualified} "{name}" is invalid: {summary}', details=details)
