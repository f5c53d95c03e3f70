"""The import graph of `operator/kvtier` (read with `ast`, lazy imports included) has no cycle, and the
house's direction holds: the command line is the top (nothing outside the `kvtier.cli` package imports it or
its modules but `__main__`),
`sim` never imports the test grounds, and production rooms import neither `sim`, `testing` nor `demo`."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "operator" / "kvtier"
#: Rooms that run in production, the probe sidecar among them (it owns the stack-distance and lookup-log
#: code the simulator uses).
PRODUCTION = ("api", "controllers", "render", "storage", "telemetry", "rebalance", "kube", "probe")


def _module_name(path: pathlib.Path) -> str:
    parts = ["kvtier", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the kvtier modules it imports (a `from package import name` of a submodule names the submodule)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            else:
                continue
            graph[name].update(target for target in targets if target in modules and target != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_the_import_graph_is_read():
    graph = import_graph()
    assert "kvtier.sim.pods" in graph["kvtier.cli.sim"]  # a lazy import, inside a command
    assert "kvtier.cli.sim" in graph["kvtier.cli"]  # the package gathers its command groups
    assert "kvtier.testing.podsim.kubelet" in graph["kvtier.testing.podsim"]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def _is_command_line(module: str) -> bool:
    return module == "kvtier.cli" or module.startswith("kvtier.cli.")


def test_nothing_imports_the_command_line():
    importers = sorted(
        (m, t)
        for m, targets in import_graph().items()
        if not _is_command_line(m) and m != "kvtier.__main__"
        for t in targets
        if _is_command_line(t)
    )
    assert importers == []


def test_only_the_main_module_enters_the_command_line_and_only_by_its_package():
    graph = import_graph()
    assert graph["kvtier.__main__"] & {m for m in graph if _is_command_line(m)} == {"kvtier.cli"}


def test_the_simulator_never_imports_the_test_grounds_or_the_command_line():
    offending = sorted(
        (m, t)
        for m, targets in import_graph().items()
        if _room(m) == "sim"
        for t in targets
        if _room(t) in ("testing", "demo", "cli")
    )
    assert offending == []


def test_production_rooms_import_neither_the_simulator_nor_the_grounds():
    offending = sorted(
        (m, t)
        for m, targets in import_graph().items()
        if _room(m) in PRODUCTION
        for t in targets
        if _room(t) in ("sim", "testing", "demo", "cli")
    )
    assert offending == []


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
