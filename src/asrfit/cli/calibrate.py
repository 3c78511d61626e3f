"""``asrfit calibrate``: measure this machine once; plans for it then rest on the figures."""

from __future__ import annotations

from pathlib import Path

import click

from asrfit.cli.render import console


@click.command("calibrate")
@click.option(
    "--gpu",
    "device",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "cuda", "cpu"]),
    help="What to calibrate: this machine's GPU (auto: when there is one) or its CPU.",
)
@click.option(
    "--model",
    default=None,
    help="The model whose real steps are timed (default: the built-in conformer-ctc-small).",
)
@click.option(
    "--data",
    "manifest",
    default=None,
    help="A training manifest: the large timed batch takes its longest utterance.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write here instead of <cache>/calibration/<machine>.json (plans then do not find it).",
)
def command(device: str, model: str | None, manifest: str | None, out: Path | None) -> None:
    """Measure what a trace cannot know about this machine, in well under a minute.

    \b
    Measures: the host's cost per kernel and per module call; matmul, convolution and
    copy rates (GPU); real steps of a real model at a small and a large batch, which set
    one scale on host costs and one on device rates; on a GPU, the memory a real step
    holds above its traced peak and reserved over allocated memory.

    \b
    Then: asrfit plan --gpu auto (or for the CPU), asrfit memory and asrfit train use the
    file when it matches this machine (GPU, driver, CUDA, torch); the plan's rests_on names it.
    """
    from asrfit.train.calibrate import calibrate

    calibration, path = calibrate(device, model, manifest, out=out, say=console.print)
    console.print(f"Calibration of {calibration.key['device']} written to {path}")
