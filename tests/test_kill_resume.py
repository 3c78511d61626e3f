"""kill -9 at random steps, inside checkpoint writes and inside best-model writes: after
``--resume`` the final weights (and the best model with its score) equal an uninterrupted
run's bit for bit, with every default of ``asrfit train`` (SpecAugment on, save every 30 min).

Each trial forks a child that runs :func:`~asrfit.recipes.run.train_asr`; the child is
killed with SIGKILL, by the parent after a random delay or by itself at an injected point
(the N-th ``torch.save`` of a checkpoint, half written; the N-th best-model write, before
its score or between its two renames). 3 trials run in ``make test``; ``pytest -m slow``
runs 12 more.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
from pathlib import Path

import pytest
import torch

from asrfit.recipes.run import RunConfig, train_asr
from asrfit.testing.dummies import dummy_manifest
from asrfit.testing.hostile import GOOD_TEXTS
from asrfit.train.checkpoint import latest_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

# a small Conformer with dropout, so the RNG states matter too
TINY = {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "conv_kernel_size": 7,
        "dropout": 0.1}


def _config(corpus: Path, out: Path, resume: bool = False, save_every: str = "30m", dev: bool = True) -> RunConfig:
    return RunConfig(model="conformer-ctc-tiny", train=str(corpus / "train.jsonl"),
                     dev=str(corpus / "dev.jsonl") if dev else None,
                     out_dir=str(out), target_batch=4, epochs=3, random_init=True, model_overrides=TINY,
                     resume=resume, save_every=save_every)


def _faults(kind: str, n: int) -> None:
    """Install a self-kill at the n-th occurrence of ``kind`` (in the child only)."""
    count = {"n": 0}

    def hit() -> bool:
        count["n"] += 1
        return count["n"] == n

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if kind == "checkpoint":  # half a checkpoint written, then killed
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(obj, dict) and "format_version" in obj and hit():
                f.write(b"\x80partial checkpoint")
                f.flush()
                die()
            return real_save(obj, f, *args, **kwargs)

        torch.save = save
    elif kind == "best_score":  # best.tmp built, its scores.json not yet written
        import asrfit.recipes.run as run

        real_write = run.atomic_write_text

        def write(path, text):
            if Path(path).name == "scores.json" and hit():
                die()
            return real_write(path, text)

        run.atomic_write_text = write
    elif kind == "best_swap":  # the old best moved aside, the new one not yet in place
        real_rename = Path.rename

        def rename(self, target):
            result = real_rename(self, target)
            if Path(target).name == "best.old" and hit():
                die()
            return result

        Path.rename = rename
    elif kind in ("step", "ctrl_c"):  # killed, or Ctrl-C pressed, during the n-th step
        from asrfit.train.step import StepMixin

        real_step = StepMixin._step

        def step(self, window):
            if hit() and kind == "ctrl_c":
                os.kill(os.getpid(), signal.SIGINT)  # the handler lets the step finish
            record = real_step(self, window)
            if kind == "step" and count["n"] == n:
                die()
            return record

        StepMixin._step = step


def _child(config: dict, kind: str | None, n: int) -> None:
    torch.set_num_threads(1)
    if kind is not None:
        _faults(kind, n)
    train_asr(RunConfig.from_dict(config))
    os._exit(0)


def _run(config: RunConfig, kind: str | None = None, n: int = 0, kill_after_seconds: float | None = None) -> int:
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_child, args=(config.to_dict(), kind, n))
    child.start()
    child.join(kill_after_seconds)
    if child.is_alive():
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    return child.exitcode


def _final(out: Path) -> tuple[dict, dict, dict]:
    """The last checkpoint's weights, the best model's weights and its score."""
    from safetensors.torch import load_file

    last = torch.load(latest_checkpoint(out / "stage1" / "checkpoints"), map_location="cpu", weights_only=True)
    best = load_file(out / "best" / "model.safetensors")
    return last["model"], best, json.loads((out / "best" / "scores.json").read_text())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    texts = [GOOD_TEXTS[i % len(GOOD_TEXTS)] for i in range(20)]
    dummy_manifest(folder, [1.0 + 0.05 * i for i in range(16)], texts=texts[:16], name="train.jsonl")
    dummy_manifest(folder / "dev", [1.2, 1.4, 1.6, 1.8], texts=texts[16:], name="../dev.jsonl")
    return folder


def _reference(corpus, out, dev: bool):
    # a first run fills the session's simulation cache, so that the reference plans from it as
    # every trial does: with glibc's malloc defaults (the tests'), a run that traced its plan
    # in the training process (a cold cache) ended a few bits apart from one that read it,
    # with the same plan and RNG states (2026-11-27; not pinned down further)
    assert _run(_config(corpus, out.with_name(out.name + "-cold"), dev=dev)) == 0
    assert _run(_config(corpus, out, dev=dev)) == 0
    report = json.loads((out / "report.json").read_text())
    steps = report["epochs"][-1]["steps"]
    return corpus, out, steps, _final(out), dev


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """With dev scoring: the best model is written when dev CER improves."""
    return _reference(corpus, tmp_path_factory.mktemp("reference"), dev=True)


@pytest.fixture(scope="module")
def reference_every_epoch(corpus, tmp_path_factory):
    """Without dev: the best model is rewritten at every epoch end (each write after the
    first replaces the previous one: the swap a kill can interrupt)."""
    return _reference(corpus, tmp_path_factory.mktemp("reference_every_epoch"), dev=False)


def _trial(reference, tmp_path, kind: str | None, n: int = 0, kill_after_seconds: float | None = None,
           save_every: str = "30m") -> Path:
    corpus, _, _, (weights, best, scores), dev = reference
    out = tmp_path / "run"
    code = _run(_config(corpus, out, save_every=save_every, dev=dev), kind, n, kill_after_seconds)
    saved_before_resume = sorted(p.name for p in out.rglob("checkpoint-*.pt"))
    if kind == "ctrl_c":  # stopped by the interrupt, after saving the step
        assert code == 1
    elif kind is not None:  # the injected fault was reached
        assert code == -signal.SIGKILL
    else:  # a timed kill may come after the end
        assert code in (-signal.SIGKILL, 0)
    if code in (-signal.SIGKILL, 1):
        assert _run(_config(corpus, out, resume=True, save_every=save_every, dev=dev)) == 0
    got_weights, got_best, got_scores = _final(out)
    assert got_weights.keys() == weights.keys()
    for name, value in weights.items():
        assert torch.equal(got_weights[name], value), name
    for name, value in best.items():
        assert torch.equal(got_best[name], value), name
    assert got_scores == scores
    assert not list(out.rglob("*.tmp")) and not (out / "best.old").exists()
    report = json.loads((out / "report.json").read_text())
    assert len(report["epochs"]) == 3
    return saved_before_resume


def test_kill_inside_a_checkpoint_write(reference, tmp_path):
    _trial(reference, tmp_path, "checkpoint", 2)


def test_kill_inside_the_best_model_write(reference_every_epoch, tmp_path):
    _trial(reference_every_epoch, tmp_path, "best_swap", 1)


def test_kill_at_a_random_step(reference, tmp_path):
    steps = reference[2]
    _trial(reference, tmp_path, "step", random.Random(14).randint(1, steps - 1))


def test_kill_mid_epoch_resumes_from_a_save_every_checkpoint(reference, tmp_path):
    """--save-every 2 (steps): killed after step 3 of an epoch of 4, resumed from step 2's
    checkpoint (sampler position, RNGs, SpecAugment's epoch) to the same weights."""
    before = _trial(reference, tmp_path, "step", 3, save_every="2")
    assert before == ["checkpoint-00000002.pt"]


SLOW_TRIALS = [("checkpoint", 1), ("checkpoint", 3), ("best_score", 1), ("best_score", 2), ("best_swap", 1),
               ("best_swap", 2), *[("step", k) for k in random.Random(1414).sample(range(1, 12), 4)],
               ("time", 0), ("time", 1)]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "n"), SLOW_TRIALS)
def test_kill_minus_nine_trials(reference, reference_every_epoch, tmp_path, kind, n, request):
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("12 more kill -9 trials (about 2 min): run pytest -m slow tests/test_kill_resume.py")
    if kind == "best_swap" or (kind == "best_score" and n > 1):  # writes that surely happen
        reference = reference_every_epoch
    if kind == "time":  # the parent kills at a random moment (import, planning, a write...)
        _trial(reference, tmp_path, None, kill_after_seconds=random.Random(n).uniform(0.5, 4.0))
    else:
        _trial(reference, tmp_path, kind, min(n, reference[2] - 1) if kind == "step" else n)


def test_ctrl_c_saves_the_step_it_interrupts_and_resumes_exactly(reference, tmp_path):
    """Ctrl-C during step 3 with the default --save-every (30 min: no checkpoint yet): the
    step finishes, its checkpoint is written, and --resume reaches the uninterrupted weights."""
    before = _trial(reference, tmp_path, "ctrl_c", 3)
    assert before == ["checkpoint-00000003.pt"]
