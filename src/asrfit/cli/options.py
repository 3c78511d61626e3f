"""Option types shared by the commands: every value is checked while click parses, before
any tracing, planning or training, and a bad one is answered with the flag's name and what
it accepts (exit code 2, click's usage-error code).
"""

from __future__ import annotations

import math
from typing import Any

import click

from asrfit.errors import AsrfitError

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "pure_bf16")
OPTIMIZERS = ("adamw", "adamw8bit", "adafactor", "sgd")


class FiniteFloatRange(click.FloatRange):
    """A ``click.FloatRange`` that also refuses ``nan`` and ``inf`` (a range check is false
    for NaN, so click lets it through to the arithmetic that needs a number)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The number, once it is finite and in range."""
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


#: Utterances, steps, processes: whole numbers from 1.
POSITIVE_INT = click.IntRange(min=1)
#: Seconds, hours, learning rates: numbers above 0.
POSITIVE_FLOAT = FiniteFloatRange(min=0, min_open=True)
#: Share of GPU memory a plan may fill.
SAFETY = FiniteFloatRange(0.5, 0.98)


class GpuName(click.ParamType):
    """A GPU catalog name (loosely matched: "l4", "A100_80GB") or "auto" (and "cpu" where
    the command takes it).

    Args:
        allow_cpu: Accept "cpu" too. (Default: False)
    """

    name = "gpu"

    def __init__(self, allow_cpu: bool = False) -> None:
        self.allow_cpu = allow_cpu

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """Return the name as typed once the catalog knows it."""
        text = str(value).strip()
        if text.lower() == "auto" or (self.allow_cpu and text.lower() == "cpu"):
            return text.lower()
        from asrfit.profiles.gpus.catalog import resolve_gpu_name

        try:
            resolve_gpu_name(text)
        except AsrfitError as exc:
            self.fail(str(exc), param, ctx)
        return text


class ModelSpec(click.ParamType):
    """A bundled model name, a local folder/file, or a Hub id (one quick request, no retries)."""

    name = "model"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """Return the spec once it is known to resolve (see ``check_model_spec``)."""
        from asrfit.profiles.hub_lookup import check_model_spec

        text = str(value).strip()
        try:
            check_model_spec(text)
        except AsrfitError as exc:
            self.fail(str(exc), param, ctx)
        return text


class StageFractions(click.ParamType):
    """Increasing data fractions in (0, 1], e.g. ``0.1,0.5,1.0``."""

    name = "fractions"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> list[float]:
        """Parse and check the fractions."""
        if isinstance(value, list):
            return value
        try:
            fractions = [float(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"{value!r}: give fractions like 0.1,0.5,1.0.", param, ctx)
        if (
            not fractions
            or any(not 0 < f <= 1 for f in fractions)
            or fractions != sorted(fractions)
        ):
            self.fail(
                f"{value!r}: give increasing fractions in (0, 1], e.g. 0.1,0.5,1.0.", param, ctx
            )
        return fractions


def parse_overrides(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, object]:
    """``--set FIELD=VALUE`` pairs as a dict (ints and floats converted)."""
    out: dict[str, object] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(
                f"{item!r}: write FIELD=VALUE, e.g. encoder_layers=4.", ctx, param
            )
        for kind in (int, float):
            try:
                out[key.strip()] = kind(raw)
                break
            except ValueError:
                continue
        else:
            out[key.strip()] = raw
    return out


def check_stop_signals(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--stop-signals``: comma-separated signal names ("SIGTERM,SIGUSR1"), or "none"."""
    from asrfit.train.interrupt import parse_stop_signals

    try:
        parse_stop_signals(value)
    except AsrfitError as exc:
        raise click.BadParameter(str(exc)) from exc
    return value


def check_save_every(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--save-every``: steps ("500") or minutes ("30m"); "0" for epoch ends only."""
    from asrfit.recipes.run_safety import parse_save_every

    try:
        parse_save_every(value)
    except AsrfitError as exc:
        raise click.BadParameter(
            f"{value!r}: give steps (500) or minutes (30m), or 0.", ctx, param
        ) from exc
    return value


def usage_error(flags: str, message: str) -> click.UsageError:
    """A usage error that starts with the flags it is about."""
    return click.UsageError(f"{flags}: {message}")


GPU = GpuName()
GPU_OR_CPU = GpuName(allow_cpu=True)
MODEL = ModelSpec()
STAGES = StageFractions()
DATA = click.Path(exists=True, readable=True)
