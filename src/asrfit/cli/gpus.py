"""``asrfit gpus``: list the GPU catalog."""

from __future__ import annotations

import click
from rich.table import Table

from asrfit.cli.render import console, print_json


@click.command("gpus")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(as_json: bool) -> None:
    """List the GPUs asrfit can plan for, with memory, peak TFLOP/s and bandwidth."""
    from asrfit.profiles.gpus.catalog import catalog_notes, list_gpus

    specs = list_gpus()
    if as_json:
        print_json([s.to_dict() for s in specs])
        return
    table = Table(title="GPU catalog (dense peak rates)", title_justify="left")
    for col in (
        "name",
        "memory GiB",
        "bf16 TFLOP/s",
        "fp16 TFLOP/s",
        "fp32 TFLOP/s",
        "GB/s",
        "aliases",
    ):
        table.add_column(col)
    for s in specs:
        table.add_row(
            s.name,
            f"{s.memory_bytes / 2**30:.0f}",
            "-" if not s.bf16_tflops else f"{s.bf16_tflops:g}",
            f"{s.fp16_tflops:g}" if s.fp16_tflops else "-",
            f"{s.fp32_tflops:g}",
            f"{s.memory_bandwidth_bytes_per_second / 1e9:.0f}",
            ", ".join(s.aliases[:3]),
        )
    console.print(table)
    for note in catalog_notes():
        console.print(f"- {note}")
