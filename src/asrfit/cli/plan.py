"""``asrfit plan``: the fastest setup that fits, with buckets and accumulation; save and export it."""

from __future__ import annotations

import click
from rich.table import Table

from asrfit.cli.options import DATA, GPU, MODEL, POSITIVE_FLOAT, POSITIVE_INT, SAFETY
from asrfit.cli.render import console, print_json, rows_table
from asrfit.plan.exports import EXPORT_FORMATS


@click.command("plan")
@click.option(
    "--model",
    "model_spec",
    type=MODEL,
    required=True,
    help="Bundled name, Hugging Face id or local path.",
)
@click.option(
    "--data", "data_source", type=DATA, required=True, help="JSONL manifest or audio folder."
)
@click.option(
    "--gpu",
    type=GPU,
    default="auto",
    show_default=True,
    help="GPU name (e.g. L4) or 'auto' to detect.",
)
@click.option(
    "--target-batch",
    type=POSITIVE_INT,
    default=32,
    show_default=True,
    help="Utterances per optimizer step (all GPUs).",
)
@click.option(
    "--target-hours",
    type=POSITIVE_FLOAT,
    default=None,
    help="Audio hours per optimizer step instead.",
)
@click.option(
    "--safety", type=SAFETY, default=0.85, show_default=True, help="Fraction of GPU memory to use."
)
@click.option(
    "--world-size",
    type=POSITIVE_INT,
    default=None,
    help="GPUs / processes (default: detected or 1).",
)
@click.option("--nodes", type=int, default=1, show_default=True, help="Machines (multi-node).")
@click.option(
    "--gpus-per-node",
    type=int,
    default=None,
    help="GPUs per machine; with --nodes, world size = nodes x GPUs per node.",
)
@click.option(
    "--precision",
    type=click.Choice(["auto", "fp32", "bf16", "fp16", "pure_bf16"]),
    default="auto",
    show_default=True,
    help="auto: bf16 where the GPU has it, else fp16 with loss scaling.",
)
@click.option(
    "--max-seconds",
    type=POSITIVE_FLOAT,
    default=None,
    help="Largest bucket edge; longer utterances are chunked or filtered.",
)
@click.option(
    "--long-utterances", type=click.Choice(["chunk", "filter"]), default="chunk", show_default=True
)
@click.option(
    "--buckets",
    "bucketing",
    type=click.Choice(["auto", "1d", "2d"]),
    default="auto",
    show_default=True,
    help="1d: duration buckets; 2d: duration x transcript-length buckets; auto: the faster.",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the plan JSON here.",
)
@click.option(
    "--export",
    "export_fmt",
    type=click.Choice(EXPORT_FORMATS, case_sensitive=False),
    default=None,
    help="Print the plan for: hf, deepspeed, accelerate, lhotse, nemo, lightning.",
)
@click.option(
    "--measure-loader",
    is_flag=True,
    help="Measure audio decoding + log-mel features on this host and set loader workers from it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def command(
    model_spec: str,
    data_source: str,
    gpu: str,
    target_batch: int,
    target_hours: float | None,
    safety: float,
    world_size: int | None,
    nodes: int,
    gpus_per_node: int | None,
    precision: str | None,
    max_seconds: float | None,
    long_utterances: str,
    bucketing: str,
    out_path: str | None,
    export_fmt: str | None,
    measure_loader: bool,
    as_json: bool,
) -> None:
    """Plan training of MODEL on DATA for a GPU: setup, buckets, accumulation, data decisions."""
    from asrfit.cli.options import usage_error
    from asrfit.errors import ConfigError
    from asrfit.plan.exports import export_text
    from asrfit.plan.precision import check_precision
    from asrfit.plan.progress import TraceProgress
    from asrfit.plan.search import plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile

    if precision == "auto":
        precision = None
    world_size = _world_size(world_size, nodes, gpus_per_node)
    hardware = HardwareProfile.resolve(gpu, safety_margin=safety, num_gpus=world_size)
    try:
        check_precision(precision, hardware)
    except ConfigError as exc:
        raise usage_error(f"--precision {precision} --gpu {gpu}", str(exc)) from exc
    dataset = DatasetProfile.from_source(data_source)
    loader_rate = None
    if measure_loader:
        from asrfit.data.throughput import measure_loader_rate

        loader_rate = measure_loader_rate().audio_seconds_per_second
    result = plan(
        hardware,
        dataset,
        model_spec,
        target_effective_batch=target_batch,
        target_hours=target_hours,
        precision=precision,
        world_size=world_size,
        num_nodes=nodes,
        long_utterances=long_utterances,
        max_seconds=max_seconds,
        loader_audio_seconds_per_second=loader_rate,
        bucketing=bucketing,
        progress=TraceProgress.for_terminal(enabled=not as_json and export_fmt is None),
    )
    if export_fmt is not None:
        text = export_text(result, export_fmt)
    if out_path:
        result.save(out_path)
    if export_fmt is not None:
        click.echo(text)
        return
    if as_json:
        print_json(result.to_dict())
        return
    from asrfit.plan.explain import explain_plan

    console.print(rows_table("Plan", explain_plan(result)))
    table = Table(title="Buckets", title_justify="left")
    for col in ("duration", "batch", "predicted reserved", "headroom", "audio s/s"):
        table.add_column(col, justify="right")
    for row in result.bucket_rows():
        table.add_row(*row)
    console.print(table)
    for line in result.rests_on:
        console.print(f"- {line}", highlight=False)
    if out_path:
        console.print(f"plan written to {out_path}")


def _world_size(world_size: int | None, nodes: int, gpus_per_node: int | None) -> int | None:
    """The world size from --world-size or --nodes x --gpus-per-node (they must agree)."""
    if nodes < 1:
        raise click.BadParameter(f"--nodes {nodes}: use 1 or more.")
    if gpus_per_node is None:
        if nodes > 1 and (world_size is None or world_size % nodes):
            raise click.BadParameter(
                f"--nodes {nodes}: also give --gpus-per-node (or a --world-size divisible by it)."
            )
        return world_size
    if gpus_per_node < 1:
        raise click.BadParameter(f"--gpus-per-node {gpus_per_node}: use 1 or more.")
    total = nodes * gpus_per_node
    if world_size is not None and world_size != total:
        raise click.BadParameter(
            f"--world-size {world_size} disagrees with --nodes {nodes} x --gpus-per-node "
            f"{gpus_per_node} = {total}; give one or the other."
        )
    return total
