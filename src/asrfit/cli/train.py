"""``asrfit train``: profile, plan, train, score and save a speech recogniser (a CTC model,
Whisper or Parakeet-TDT; see :mod:`asrfit.recipes.asr_model`)."""

from __future__ import annotations

import click

from asrfit.cli.options import (
    DATA,
    GPU,
    MODEL,
    POSITIVE_FLOAT,
    POSITIVE_INT,
    STAGES,
    FiniteFloatRange,
    check_save_every,
    check_stop_signals,
    parse_overrides,
)
from asrfit.cli.render import console, print_json, rows_table


@click.command("train")
@click.option(
    "--model",
    "model",
    type=MODEL,
    required=True,
    help="Bundled name (conformer-ctc-small, wav2vec2-base, whisper-tiny, "
    "parakeet-tdt-0.6b-v2, ...), Hub id or folder.",
)
@click.option(
    "--data",
    "train",
    type=DATA,
    required=True,
    help="Training data: JSONL manifest or audio folder.",
)
@click.option("--dev", type=DATA, default=None, help="Dev data, scored (WER/CER) every epoch.")
@click.option("--test", type=DATA, default=None, help="Test data, scored once with the best model.")
@click.option(
    "--gpu",
    type=GPU,
    default="auto",
    show_default=True,
    help="GPU to plan for (e.g. L4) or 'auto'.",
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Run folder."
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Train with this saved plan instead of planning.",
)
@click.option(
    "--force-plan",
    is_flag=True,
    help="Train with --plan even if it was made for another model, GPU or dataset.",
)
@click.option(
    "--target-batch",
    type=POSITIVE_INT,
    default=32,
    show_default=True,
    help="Utterances per optimizer step.",
)
@click.option(
    "--precision",
    type=click.Choice(["auto", "fp32", "bf16", "fp16", "pure_bf16"]),
    default="auto",
    show_default=True,
    help="The plan's precision (as asrfit plan --precision); auto: the planner's choice for "
    "the GPU or CPU. Not with --plan, which keeps its own.",
)
@click.option(
    "--epochs", type=POSITIVE_FLOAT, default=10.0, show_default=True, help="Epochs (per stage)."
)
@click.option(
    "--max-steps",
    type=POSITIVE_INT,
    default=None,
    help="Optimizer steps (per stage); wins over --epochs.",
)
@click.option(
    "--lr",
    "learning_rate",
    type=POSITIVE_FLOAT,
    default=None,
    help="Peak learning rate (default: 1e-3 random weights, 5e-5 pretrained).",
)
@click.option(
    "--stages",
    type=STAGES,
    default="1.0",
    show_default=True,
    help="Progressive training: data fractions, e.g. 0.1,0.5,1.0.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    callback=parse_overrides,
    help="Model config override FIELD=VALUE (repeatable); Parakeet encoder fields too, "
    "e.g. hidden_size=256 or encoder_config.hidden_act=silu.",
)
@click.option("--no-spec-augment", is_flag=True, help="Train without SpecAugment.")
@click.option("--random-init", is_flag=True, help="Never load pretrained weights.")
@click.option(
    "--resume", is_flag=True, help="Continue the run in --out from its latest checkpoints."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--save-every",
    default="30m",
    show_default=True,
    callback=check_save_every,
    help="Checkpoint every N steps (500) or minutes (30m), atomically with the sampler's "
    "position; every epoch end too. 0: epoch ends only.",
)
@click.option(
    "--keep-checkpoints",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Checkpoints kept per stage; each has a SHA-256 file, and --resume falls back to the "
    "previous one when the newest is damaged.",
)
@click.option(
    "--stop-signals",
    default="SIGTERM,SIGUSR1",
    show_default=True,
    callback=check_stop_signals,
    help="Signals that, like Ctrl-C, stop after the step in progress with a checkpoint and "
    "exit with 128 + the signal's number (143 for SIGTERM); 'none' for none.",
)
@click.option(
    "--max-skipped",
    type=FiniteFloatRange(0, 1),
    default=0.05,
    show_default=True,
    help="Stop when more than this share of the training utterances would be skipped.",
)
@click.option(
    "--duration-tolerance",
    type=FiniteFloatRange(min=0),
    default=0.1,
    show_default=True,
    help="Seconds a manifest duration may differ from the audio header (or 2 %, the larger).",
)
@click.option(
    "--max-seconds",
    type=POSITIVE_FLOAT,
    default=None,
    help="Chunk audio above this many seconds (default: above max(30 s, 3 x p90)).",
)
@click.option("--push-to-hub", default=None, help="Hub repo id to push the best model to.")
@click.option(
    "--no-tensorboard",
    is_flag=True,
    help="No TensorBoard scalars (written to OUT/tensorboard when tensorboard is installed).",
)
@click.option(
    "--progress-every",
    type=POSITIVE_FLOAT,
    default=10.0,
    show_default=True,
    help="Seconds between progress lines when output is not a terminal.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print report.json at the end instead of tables (progress goes to stderr).",
)
def command(
    model: str,
    train: str,
    dev: str | None,
    test: str | None,
    gpu: str,
    out_dir: str,
    plan_path: str | None,
    force_plan: bool,
    target_batch: int,
    precision: str,
    epochs: float,
    max_steps: int | None,
    learning_rate: float | None,
    stages: list[float],
    overrides: dict[str, object],
    no_spec_augment: bool,
    random_init: bool,
    resume: bool,
    seed: int,
    save_every: str,
    keep_checkpoints: int,
    stop_signals: str,
    max_skipped: float,
    duration_tolerance: float,
    max_seconds: float | None,
    push_to_hub: str | None,
    no_tensorboard: bool,
    progress_every: float,
    as_json: bool,
) -> None:
    """Train a speech recogniser the way the plan says, score it, and save the best model.

    CTC models, Whisper and Parakeet-TDT train; with --random-init (or without weights) they
    learn the training transcripts' character vocabulary. On a terminal a live display shows
    steps, loss, audio seconds per second, memory measured against the plan and the time
    left; piped, the same comes as a line every --progress-every seconds. Then
    `asrfit report OUT` draws the run.
    """
    import logging
    import sys
    from pathlib import Path

    from asrfit.cli.progress import RichProgress, progress_for
    from asrfit.recipes.run import RunConfig, train_asr

    def absolute(path: str | None) -> str | None:  # report.json names data usable from anywhere
        return None if path is None else str(Path(path).resolve())

    cfg = RunConfig(
        model=model,
        train=absolute(train),
        out_dir=out_dir,
        dev=absolute(dev),
        test=absolute(test),
        gpu=gpu,
        plan=plan_path,
        force_plan=force_plan,
        target_batch=target_batch,
        precision=_precision(precision, plan_path, gpu),
        epochs=epochs,
        max_steps=max_steps,
        learning_rate=learning_rate,
        stages=stages,
        spec_augment=not no_spec_augment,
        random_init=random_init,
        model_overrides=overrides,
        seed=seed,
        resume=resume,
        push_to_hub=push_to_hub,
        save_every=save_every,
        keep_checkpoints=keep_checkpoints,
        stop_signals=stop_signals,
        max_skipped=max_skipped,
        duration_tolerance=duration_tolerance,
        max_seconds=max_seconds,
        tensorboard=not no_tensorboard,
    )
    display = progress_for(sys.stderr if as_json else sys.stdout, every_seconds=progress_every)
    if isinstance(display, RichProgress):  # log lines print above the live display
        from rich.logging import RichHandler

        handler = RichHandler(console=display.console, show_time=False, show_path=False)
        logging.getLogger("asrfit").addHandler(handler)
        logging.getLogger("asrfit").propagate = False
    # epoch lines (dev WER/CER) show without --verbose; the display shows the steps
    for name in ("asrfit.recipes.run", "asrfit.data.validate", "asrfit.train.guards"):
        logging.getLogger(name).setLevel(logging.INFO)
    from asrfit.train.interrupt import TrainingInterrupted

    try:
        report = train_asr(cfg, listeners=[display])
    except TrainingInterrupted as stop:  # Ctrl-C or a stop signal: the step was kept
        display.on_train_end()
        click.echo(f"{out_dir}: {stop}", err=True)
        raise SystemExit(stop.exit_status) from None
    finally:
        display.on_train_end()
    if as_json:
        print_json(report.to_dict())
        return
    console.print(rows_table("Plan", [(k, v) for k, v in report.plan_summary]))
    console.print(report.markdown(), highlight=False)
    console.print(
        f"Best model: {report.best_dir}  (report: {out_dir}/report.md; "
        f"plots: asrfit report {out_dir})",
        highlight=False,
    )


def _precision(precision: str, plan_path: str | None, gpu: str) -> str | None:
    """``--precision`` as the run's config takes it (None: auto), refused with ``--plan`` and
    where the hardware cannot compute in it (:func:`asrfit.plan.precision.check_precision`)."""
    from asrfit.cli.options import usage_error
    from asrfit.errors import ConfigError
    from asrfit.plan.precision import check_precision
    from asrfit.profiles.hardware import HardwareProfile

    if precision == "auto":
        return None
    if plan_path is not None:
        raise usage_error(
            f"--precision {precision} --plan {plan_path}",
            "a saved plan keeps the precision it was made for; make another with "
            "`asrfit plan --precision ...`, or leave --precision out.",
        )
    try:
        check_precision(precision, HardwareProfile.resolve(gpu))
    except ConfigError as exc:
        raise usage_error(f"--precision {precision} --gpu {gpu}", str(exc)) from exc
    return precision
