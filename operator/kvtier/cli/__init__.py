"""The `kvtier` command line: the top of the house (only `kvtier.__main__` imports it), one module per
command group; this module gathers them under `main`."""

from __future__ import annotations

import click

from kvtier import __version__
from kvtier.cli.cluster import demo, dev
from kvtier.cli.manifests import crds, render, validate
from kvtier.cli.plan import plan
from kvtier.cli.services import probe, run
from kvtier.cli.sim import sim


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvtier")
def main() -> None:
    """kvtier: tier LLM KV cache into CPU memory and NVMe-oF arrays, and rebalance it."""


for command in (crds, validate, render, dev, demo, sim, probe, run, plan):
    main.add_command(command)
