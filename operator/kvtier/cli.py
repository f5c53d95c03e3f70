"""The `kvtier` command line."""

from __future__ import annotations

import click

from kvtier import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvtier")
def main() -> None:
    """kvtier: tier LLM KV cache into CPU memory and NVMe-oF arrays, and rebalance it."""
