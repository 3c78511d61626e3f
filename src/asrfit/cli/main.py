"""The ``asrfit`` command: a click group whose commands live one per module."""

from __future__ import annotations

import logging
import sys

import click

from asrfit import __version__
from asrfit.errors import AsrfitError
from asrfit.utils.quick_exit import freeze_at_exit


class _Group(click.Group):
    """Turns asrfit's input errors into one clear line and exit code 1, not a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except AsrfitError as exc:
            raise click.ClickException(str(exc)) from exc


# Commands that read, plan and write small files, each closed explicitly: they skip the last
# garbage collection at exit (asrfit.utils.quick_exit). Training and data commands do not.
QUICK_EXIT = frozenset({"profile", "gpus", "memory", "plan", "export", "report"})


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="asrfit")
@click.option("-v", "--verbose", is_flag=True, help="Log progress at INFO level.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Fit speech-recognition training to the GPU you have."""
    if ctx.invoked_subcommand in QUICK_EXIT:
        freeze_at_exit()
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _register() -> None:
    from asrfit.cli import calibrate, demo, export, gpus, memory, plan, profile, report, train

    for module in (profile, demo, gpus, calibrate, memory, plan, export, train, report):
        cli.add_command(module.command)


_register()


def main() -> None:
    """Console-script entry point. One of several torchrun processes exits without
    finalizing the interpreter (:mod:`asrfit.utils.process_exit` says why)."""
    from asrfit.utils.process_exit import exit_process

    try:
        cli(prog_name="asrfit")
    except SystemExit as done:
        exit_process(done.code)


if __name__ == "__main__":
    main()
