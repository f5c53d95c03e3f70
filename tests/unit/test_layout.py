"""The source layout keeps the standard library importable and the package installable."""

import importlib
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_operator_is_a_source_root_not_a_package():
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_stdlib_operator_is_not_shadowed():
    # Run from the repository root, where `operator/` is a directory on sys.path[0].
    code = "import operator, kvtier; print(operator.__file__); print(operator.add(2, 3))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    path, total = out.stdout.split()
    assert "site-packages" not in path and pathlib.Path(path).parent != ROOT / "operator"
    assert total == "5"


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "kvtier", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("kvtier, version ")
    assert importlib.import_module("kvtier").__version__ in out.stdout


def test_readme_layout_lists_every_package():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    packages = sorted(p.parent.name for p in (ROOT / "operator" / "kvtier").glob("*/__init__.py"))
    missing = [name for name in packages if f"operator/kvtier/{name}/ " not in layout]
    assert not missing, f"README's Layout section does not list {missing}"
    assert "./hack/setup.sh && .venv/bin/kvtier demo" in readme
