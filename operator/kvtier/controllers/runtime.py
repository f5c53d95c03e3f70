"""What every kvtier controller shares: operator settings, login, the API client, and error mapping.

Handlers parse a body into its model once (`parse`), talk to the API through `memo.kube`, and
let `api_errors` turn API answers into kopf's retry semantics: 409, 429 and 5xx are temporary
(retried after a delay, never slept on in the handler), other 4xx are permanent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import kopf
from pydantic import BaseModel, ValidationError

from kvtier.api.errors import Problem, problems
from kvtier.kube import APIError, Connection, KubeClient, load_configuration
from kvtier.render import RenderOptions

FIELD_MANAGER = "kvtier"
FINALIZER = "kvtier.io/finalizer"

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide settings (`kvtier run` flags)."""

    kubeconfig: Path | None = None
    """None: $KUBECONFIG, ~/.kube/config, or the in-cluster service account."""
    namespaces: tuple[str, ...] = ()
    """Namespaces whose InferenceDeployments are served (empty: all)."""
    resync_seconds: float = 10.0
    """Level-based resync period: drift is corrected and status refreshed at least this often."""
    render: RenderOptions = field(default_factory=RenderOptions)
    quota_timeout_seconds: float = 2.0
    """Per-request timeout of calls to the engines' quota API."""
    namespace: str = "kvtier-system"
    """The operator's own namespace: released static volumes are wiped there (their claim and Job)."""


class InvalidSpec(kopf.PermanentError):
    """The object does not validate; `problems` name the fields."""

    def __init__(self, found: list[Problem]):
        self.problems = found
        super().__init__("; ".join(str(problem) for problem in found))


def parse(model: type[M], body: Any) -> M:
    """The body as its model, or `InvalidSpec` naming every field at fault."""
    try:
        return model.model_validate(dict(body))
    except ValidationError as error:
        raise InvalidSpec(problems(error)) from None


@contextlib.contextmanager
def api_errors() -> Iterator[None]:
    """Map API failures to kopf: conflicts and overload are retried later, other client errors are not."""
    try:
        yield
    except APIError as error:
        if error.status == 409:
            raise kopf.TemporaryError(f"conflict, retrying: {error}", delay=1) from error
        if error.status == 429:
            raise kopf.TemporaryError(f"throttled: {error}", delay=error.retry_after or 5) from error
        if error.status >= 500 or error.status in (401, 403, 404):
            raise kopf.TemporaryError(str(error), delay=5) from error
        raise kopf.PermanentError(str(error)) from error
    except (aiohttp.ClientError, TimeoutError) as error:
        raise kopf.TemporaryError(f"API unreachable: {error}", delay=5) from error


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Startup (settings, the API client), cleanup and login handlers."""

    @kopf.on.startup(id="configure", registry=registry)
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvtier.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="kvtier.io", key="last-handled-configuration"
        )
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.error_backoffs = [1, 2, 5, 10]
        settings.posting.level = logging.WARNING
        connection = Connection.from_kubeconfig(str(config.kubeconfig) if config.kubeconfig else None)
        memo.kube = await KubeClient(connection, user_agent="kvtier-operator").open()
        memo.config = config

    @kopf.on.cleanup(id="close-client", registry=registry)
    async def close(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "kube", None) is not None:
            await memo.kube.close()

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        configuration = load_configuration(str(config.kubeconfig) if config.kubeconfig else None)
        token = configuration.api_key.get("authorization", "")
        return kopf.ConnectionInfo(
            server=configuration.host,
            ca_path=configuration.ssl_ca_cert,
            insecure=not configuration.verify_ssl,
            scheme="Bearer" if token else None,
            token=token.removeprefix("Bearer ") or None,
            certificate_path=configuration.cert_file,
            private_key_path=configuration.key_file,
        )
