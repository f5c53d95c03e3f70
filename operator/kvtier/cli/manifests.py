"""`kvtier crds`, `kvtier validate`, `kvtier render`: the API's manifests, offline."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Write one file per CRD here.")
@click.option("--check", is_flag=True, help="Exit 1 if the files in --out (default crds/) differ from the models.")
def crds(out_dir: Path | None, check: bool) -> None:
    """Generate the CustomResourceDefinitions from the API models (stdout unless --out)."""
    from kvtier.api.crd import build_crds, to_yaml

    rendered = {name: to_yaml(crd) for name, crd in build_crds().items()}
    if check:
        directory = out_dir or Path("crds")
        stale = [name for name, text in rendered.items() if _read(directory / name) != text]
        for name in stale:
            click.echo(f"{directory / name}: stale or missing; run `kvtier crds --out {directory}`", err=True)
        if stale:
            sys.exit(1)
        click.echo(f"{directory}: {len(rendered)} CRDs are current")
        return
    if out_dir is None:
        click.echo("---\n".join(rendered.values()), nl=False)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (out_dir / name).write_text(text)
        click.echo(f"wrote {out_dir / name}")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


@click.command()
@click.option(
    "-f",
    "--filename",
    "filenames",
    multiple=True,
    required=True,
    help="Manifest file or directory (repeatable; - reads standard input).",
)
def validate(filenames: tuple[str, ...]) -> None:
    """Check kvtier manifests offline, as the API server would; one line per problem."""
    from kvtier.api.documents import read_documents

    checked = failed = 0
    for document in read_documents(list(filenames)):
        if not document.ours and not document.problems:
            continue
        checked += 1
        for line in document.lines():
            click.echo(line)
        failed += bool(document.problems)
    if failed:
        sys.exit(1)
    click.echo(f"{checked} kvtier object{'s' if checked != 1 else ''} valid")


@click.command()
@click.option(
    "-f",
    "--filename",
    "filenames",
    multiple=True,
    required=True,
    help="Manifest file or directory with InferenceDeployments and their KVPools (repeatable; - reads stdin).",
)
@click.option("--pod-monitor", is_flag=True, help="Also render a PodMonitor (Prometheus Operator) per deployment.")
def render(filenames: tuple[str, ...], pod_monitor: bool) -> None:
    """Print, as YAML, the children the operator would apply for every InferenceDeployment in the files."""
    from kvtier.api.documents import read_documents
    from kvtier.render import RenderOptions
    from kvtier.render.offline import render_documents

    result = render_documents(read_documents(list(filenames)), RenderOptions(pod_monitor=pod_monitor))
    for line in result.messages:
        click.echo(line, err=True)
    click.echo(result.yaml(), nl=False)
    if result.failed:
        sys.exit(1)
