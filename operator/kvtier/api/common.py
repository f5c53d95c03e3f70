"""Building blocks shared by every kvtier resource: the model base, metadata, conditions."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer
from pydantic.alias_generators import to_camel

GROUP = "kvtier.io"
VERSION = "v1alpha1"
API_VERSION: Final = "kvtier.io/v1alpha1"  # spelled out so the models' Literal types check
assert API_VERSION == f"{GROUP}/{VERSION}"

#: RFC 1123 label / subdomain, as Kubernetes checks names.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_SUBDOMAIN_RE = re.compile(DNS_SUBDOMAIN_PATTERN)


def _rfc3339(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: A point in time, written the way Kubernetes writes timestamps (`2026-12-02T17:00:00Z`).
Timestamp = Annotated[datetime, PlainSerializer(_rfc3339, return_type=str, when_used="json")]


class KubeModel(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, wire-format units, unset fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ObjectMeta(BaseModel):
    """The parts of `metadata` kvtier reads; everything else passes through untouched."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str | None = None
    generate_name: str | None = Field(default=None, alias="generateName")
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
    uid: str | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and bool(_DNS_SUBDOMAIN_RE.match(name))


class Condition(KubeModel):
    """A Kubernetes-shaped condition (`metav1.Condition`)."""

    type: str = Field(max_length=316)
    """What the condition is about, e.g. `Ready`."""
    status: Literal["True", "False", "Unknown"]
    """`True`, `False` or `Unknown`."""
    reason: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """CamelCase word that machines can match on."""
    message: str = Field(max_length=32768)
    """What a person needs to know, naming the field or object at fault."""
    last_transition_time: Timestamp | None = None
    """When `status` last changed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The `metadata.generation` the condition was computed from."""


class SecretReference(KubeModel):
    """A Secret by name; its keys are read by the node driver and never copied anywhere."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the Secret."""
    namespace: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Namespace of the Secret (the node driver reads it there)."""
