"""``asrfit export PLAN.json --to FORMAT``: a saved plan as another trainer's configuration."""

from __future__ import annotations

import warnings

import click

from asrfit.cli.render import console


@click.command("export")
@click.argument("plan_path", type=click.Path(dir_okay=False))
@click.option(
    "--to",
    "fmt",
    required=True,
    help="hf, deepspeed, accelerate, lhotse, nemo or lightning.",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the export here instead of printing it.",
)
def command(plan_path: str, fmt: str, out_path: str | None) -> None:
    """Export a plan saved by `asrfit plan --out` (or `asrfit train`) for another trainer.

    The export goes to stdout (or --out); a note on how it keeps the target effective batch
    goes to stderr.
    """
    from asrfit.plan.exports import EXPORT_FORMATS, export_note, export_text
    from asrfit.plan.plan import Plan
    from asrfit.utils.io import atomic_write_text

    if fmt.strip().lower() not in EXPORT_FORMATS:
        raise click.BadParameter(
            f"{fmt!r} is not known; use one of: {', '.join(EXPORT_FORMATS)}.", param_hint="--to"
        )
    plan = Plan.load(plan_path)
    with warnings.catch_warnings(record=True) as caught:  # said as notes, not as Python warnings
        warnings.simplefilter("always")
        text = export_text(plan, fmt)
        note = export_note(plan, fmt)
    if out_path:
        atomic_write_text(out_path, text)
        console.print(f"{fmt} export written to {out_path}", highlight=False)
    else:
        click.echo(text, nl=False)
    for warning in dict.fromkeys(str(w.message) for w in caught):
        click.echo(f"note: {warning}", err=True)
    click.echo(note, err=True)
