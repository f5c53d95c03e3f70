"""Reading manifests: multi-document YAML into kvtier models, every problem as one line."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from kvtier.api.common import API_VERSION, GROUP
from kvtier.api.errors import Problem, problems
from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool

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
        metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
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
            bodies = [body for body in yaml.safe_load_all(text) if body is not None]
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
    metadata = body.get("metadata")
    if not isinstance(metadata, dict) or not (metadata.get("name") or metadata.get("generateName")):
        document.problems.append(Problem("metadata.name", "required field is missing"))
    try:
        document.model = KINDS[kind].model_validate(body)
    except ValidationError as error:
        document.problems.extend(problems(error))
    return document
