"""Reading manifests: multi-document YAML into kvtier models, every problem as one line.

A document is judged as the API server judges it (`admit`): its name, then the generated
CRD's OpenAPI schema and CEL rules, through the very code the embedded API server runs
(`kvtier.api.schema`), so `kvtier validate` reports the server's errors with the server's field
paths. Unknown fields are reported too (`kubectl apply` refuses them: strict field validation).
Only an object the server would accept is then parsed into its model, which adds what CEL cannot say.
YAML is read with Kubernetes' (go-yaml's) rules for plain scalars (`KubeYAMLLoader`), so numbers
such as `1e-400` or `2^63` mean to `validate` what they mean to `kubectl`.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from kvtier.api.common import API_VERSION, GROUP
from kvtier.api.errors import Problem, problems
from kvtier.api.fielderrors import metadata_errors
from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool
from kvtier.api.schema import RULES_NOT_CHECKED, process_custom

_GO_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_GO_INT = re.compile(r"^[-+]?(0b[01]+|0o?[0-7]+|0x[0-9a-fA-F]+|[0-9]+)$")
_GO_BOOL = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE"), False),
}
_INT64 = 2**63


class KubeYAMLLoader(yaml.SafeLoader):
    """PyYAML with the plain-scalar rules of the YAML reader kubectl uses (sigs.k8s.io/yaml, go-yaml v2),
    and numbers as the API server's JSON decoder keeps them.

    Differences from PyYAML's YAML 1.1 rules: `1e3` and `1e-400` are numbers (PyYAML reads them as
    strings), `y`/`n` are booleans, `_` is ignored inside numbers. Then, as the JSON that kubectl
    sends is decoded into int64 or float64: a whole float below 1e21 becomes an integer (`1e3` is
    1000, `1e-400` is 0), an integer outside int64 becomes a float (2^63 is 9.223372036854776e18).
    """


def _go_scalar(loader: KubeYAMLLoader, node: yaml.ScalarNode) -> object:
    value = loader.construct_scalar(node)
    if node.style is not None:  # quoted: always a string
        return value
    if value in ("", "~", "null", "Null", "NULL"):
        return None
    if value in _GO_BOOL:
        return _GO_BOOL[value]
    plain = value.replace("_", "")
    number: int | float | None = None
    if _GO_INT.match(plain):
        sign = -1 if plain.startswith("-") else 1
        digits = plain.lstrip("+-")
        base = (
            2
            if digits.startswith("0b")
            else 16
            if digits.startswith("0x")
            else 8
            if digits.startswith("0") and len(digits) > 1
            else 10
        )
        digits = digits[2:] if digits[:2] in ("0b", "0x", "0o") else digits
        try:
            number = sign * int(digits, base)
        except ValueError:  # `09`: not octal, so go-yaml tries it as a float
            number = None
        if number is not None and not -_INT64 <= number < 2**64:  # beyond uint64: a float (beyond float64: a string)
            number = float(plain) if math.isfinite(float(plain)) else None
    if number is None and _GO_FLOAT.match(plain):
        number = float(plain) if math.isfinite(float(plain)) else None  # an overflow is a string to go-yaml
    if number is None:  # also `.inf` and `.nan`, which cannot be sent as JSON (kubectl fails on them)
        return value
    return _as_json_number(number)


def as_decoded(value: Any) -> Any:
    """`value` as the API server decodes it from JSON: an integer outside int64 becomes a float64."""
    if isinstance(value, dict):
        return {key: as_decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_decoded(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
        return float(value)
    return value


def _as_json_number(number: int | float) -> int | float:
    """The number as the API server decodes the JSON kubectl sends: int64 when it is written as an integer."""
    if isinstance(number, float):
        if math.isfinite(number) and number.is_integer() and abs(number) < 1e21:
            number = int(number)
        else:
            return number
    return number if -_INT64 <= number < _INT64 else float(number)


def _go_mapping(loader: KubeYAMLLoader, node: yaml.MappingNode) -> dict[str, Any]:
    """A mapping whose keys are strings, as sigs.k8s.io/yaml writes them into JSON (`true`, `1`, `null`)."""
    loader.flatten_mapping(node)
    pairs = loader.construct_pairs(node, deep=True)
    return {_json_key(key): value for key, value in pairs}


def _json_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return "null" if key is None else str(key)


KubeYAMLLoader.add_constructor("tag:yaml.org,2002:str", _go_scalar)
KubeYAMLLoader.add_constructor("tag:yaml.org,2002:map", _go_mapping)
# Resolution happens in `_go_scalar`: every plain scalar is first taken as a string.
KubeYAMLLoader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag in ("tag:yaml.org,2002:merge",)]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_all(text: str) -> list[Any]:
    """Every non-empty document of a YAML (or JSON) text, read as kubectl reads it."""
    return [body for body in yaml.load_all(text, Loader=KubeYAMLLoader) if body is not None]


@functools.cache
def crd_schemas() -> dict[str, dict[str, Any]]:
    """The generated CRDs' OpenAPI schemas, by kind."""
    from kvtier.api.crd import build_crds

    return {
        crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for crd in build_crds().values()
    }


@functools.cache
def crd_replicas_paths() -> dict[str, str | None]:
    """Where each kind's scale subresource keeps its replica count (`.spec.replicas`), None without one."""
    from kvtier.api.crd import build_crds

    return {
        crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]
        .get("subresources", {})
        .get("scale", {})
        .get("specReplicasPath")
        for crd in build_crds().values()
    }


def admit(body: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """The kvtier object (`kind` known) as the API server would store it (numbers decoded, nulls and unknown
    fields dropped, defaults applied), and what it refuses in it: its 422's causes, and unknown fields."""
    model = KINDS[body["kind"]]
    body = as_decoded(body)
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        for key in ("name", "generateName", "namespace"):
            if metadata.get(key) is not None and not isinstance(metadata[key], str):
                # The server cannot even decode ObjectMeta then: a 400 naming that field, nothing else.
                return body, [Problem(f"metadata.{key}", f"unable to decode: expected a string, got {metadata[key]!r}")]
    if isinstance(metadata, dict) and not metadata.get("name") and isinstance(metadata.get("generateName"), str):
        # The server names the object (generateName + 5 characters) before it validates it.
        body = {**body, "metadata": {**metadata, "name": metadata["generateName"] + "x" * 5}}
    found = metadata_errors(body.get("metadata"), namespaced=model is InferenceDeployment)
    kind = body["kind"]
    stored, errors, unknown = process_custom(crd_schemas()[kind], body, None, found, crd_replicas_paths()[kind])
    if isinstance(metadata, dict):
        stored["metadata"] = metadata  # as written: a generated name is the server's business
    return stored, [Problem(path, "unknown field") for path in unknown] + [
        Problem(error.field, error.message) if error is not RULES_NOT_CHECKED else Problem("", error.detail)
        for error in [*found, *errors]
    ]


#: Every kind kvtier serves, by `kind`.
KINDS: dict[str, type[BaseModel]] = {model.KIND: model for model in (KVPool, InferenceDeployment)}
STDIN = "-"


@dataclass
class Document:
    """One YAML document of a file, parsed into its model when it is a valid kvtier object."""

    source: str
    index: int
    body: Any = None
    model: BaseModel | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ours(self) -> bool:
        """Whether the document claims to be a kvtier object (by kind or by API group)."""
        if not isinstance(self.body, dict):
            return True
        api_version = str(self.body.get("apiVersion", ""))
        return self.body.get("kind") in KINDS or api_version.split("/")[0] == GROUP

    @property
    def label(self) -> str:
        """`KIND/NAME` as kubectl prints it, or the document's position when those are missing."""
        body = self.body if isinstance(self.body, dict) else {}
        kind = body.get("kind") or "<no kind>"
        metadata = body.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}
        name = metadata.get("name") or f"<document {self.index + 1}>"
        return f"{kind}/{name}"

    def lines(self) -> list[str]:
        """`FILE: KIND/NAME: field: problem`, or `FILE: problem` for a file that yielded no object."""
        prefix = f"{self.source}: {self.label}: " if self.body is not None else f"{self.source}: "
        return [f"{prefix}{problem}" for problem in self.problems]


def _expand(paths: list[str]) -> Iterator[Path | str]:
    for path in paths:
        if path == STDIN:
            yield STDIN
        elif Path(path).is_dir():
            yield from sorted(p for p in Path(path).rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
        else:
            yield Path(path)


def read_documents(paths: list[str]) -> Iterator[Document]:
    """Every document of every file (directories are walked; `-` is standard input)."""
    for path in _expand(paths):
        source = "<stdin>" if path == STDIN else str(path)
        try:
            text = sys.stdin.read() if path == STDIN else Path(path).read_text()
        except OSError as error:
            yield Document(source, 0, problems=[Problem("", f"cannot read: {error.strerror or error}")])
            continue
        try:
            bodies = load_all(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            yield Document(source, 0, problems=[Problem("", f"malformed YAML: {where}{problem}")])
            continue
        for index, body in enumerate(bodies):
            yield parse_document(Document(source, index, body))


def parse_document(document: Document) -> Document:
    """Fill in `model` or `problems` for a kvtier object; other kinds are left untouched."""
    body = document.body
    if not isinstance(body, dict):
        document.problems.append(Problem("", f"expected a Kubernetes object, got {type(body).__name__}"))
        return document
    if not body.get("kind"):
        document.problems.append(Problem("kind", "required field is missing"))
        return document
    if not document.ours:
        return document
    kind, api_version = body["kind"], body.get("apiVersion")
    if kind not in KINDS:
        known = ", ".join(KINDS)
        document.problems.append(Problem("kind", f"unknown kind {kind!r} in {GROUP} (known: {known})"))
        return document
    if not api_version:
        document.problems.append(Problem("apiVersion", f"required field is missing (use {API_VERSION})"))
        return document
    if api_version != API_VERSION:
        document.problems.append(
            Problem("apiVersion", f"unknown apiVersion {api_version!r} for {kind} (served: {API_VERSION})")
        )
        return document
    stored, refused = admit(body)
    document.problems.extend(refused)
    if document.problems:
        return document
    try:  # the object as the server stores it, which is what the operator reads
        document.model = KINDS[kind].model_validate(stored)
    except ValidationError as error:  # what the CRD cannot say; the operator reports it as InvalidSpec
        document.problems.extend(problems(error))
    return document
