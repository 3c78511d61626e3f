"""``asrfit train`` as a person sees it: a live display in a terminal, plain lines in a pipe,
TensorBoard scalars read back with TensorBoard's own reader, and ``asrfit report``.

One short real run (a tiny corpus, conformer-ctc-tiny, 3 steps) in a pseudo-terminal serves
the display, TensorBoard and report tests.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from asrfit.cli.main import cli
from asrfit.cli.progress import PlainProgress, RichProgress, progress_for, step_line
from asrfit.train.events import StepEvent

STEPS = 3


def _run_in_pty(args: list[str], cwd: Path, timeout_seconds: float = 400) -> str:
    """Run ``asrfit ARGS`` with a pseudo-terminal as stdout and stderr; return all it wrote."""
    leader, follower = pty.openpty()
    env = {
        **os.environ,
        "TERM": "xterm-256color",
        "COLUMNS": "160",
        "LINES": "40",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
    }
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "asrfit.cli.main", *args],
        cwd=cwd,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(leader)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0, text[-3000:]
    return text


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A 3-step run with dev scoring, trained in a pseudo-terminal: (run folder, what it showed)."""
    root = tmp_path_factory.mktemp("tty_run")
    corpus = CliRunner().invoke(
        cli, ["demo-data", str(root / "c"), "--num-train", "8", "--num-dev", "2", "--num-test", "1"]
    )
    assert corpus.exit_code == 0, corpus.output
    shown = _run_in_pty(
        [
            "train",
            "--model",
            "conformer-ctc-tiny",
            "--data",
            "c/train.jsonl",
            "--dev",
            "c/dev.jsonl",
            "--out",
            "run",
            "--target-batch",
            "4",
            "--max-steps",
            str(STEPS),
            "--epochs",
            "5",
            "--random-init",
            "--no-spec-augment",
            "--set",
            "encoder_layers=1",
        ],
        cwd=root,
    )
    return root / "run", shown


def test_train_in_a_terminal_shows_the_live_display(run: tuple[Path, str]) -> None:
    _, shown = run
    assert "\x1b[" in shown  # drawn with terminal control codes, not printed as lines
    assert "━" in shown  # the bar
    assert f"{STEPS}/{STEPS}" in shown  # steps done of the total
    # on the CPU the process's RSS and the step's predicted tensors, not shown as one ratio
    for field in ("loss ", "audio-s/s", "rss ", "step pred", "ETA "):
        assert field in shown, field
    assert "dev WER" in shown  # the epoch's scores above the bar


def test_tensorboard_scalars_read_back(run: tuple[Path, str]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = run
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "train/loss",
        "train/learning_rate",
        "train/audio_seconds_per_second",
        "memory/measured_gib",
        "memory/predicted_gib",
        "eval/wer",
        "eval/cer",
    } <= tags
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, STEPS + 1))
    # measured memory: the monitor's own log (stage1/memory.jsonl), written by other code
    monitor = [
        json.loads(line) for line in (run_dir / "stage1" / "memory.jsonl").read_text().splitlines()
    ]
    measured = [e.value for e in events.Scalars("memory/measured_gib")]
    assert measured == pytest.approx([r["peak_reserved_bytes"] / 2**30 for r in monitor], rel=1e-6)
    predicted = [e.value for e in events.Scalars("memory/predicted_gib")]
    assert predicted == pytest.approx([r["predicted_bytes"] / 2**30 for r in monitor], rel=1e-6)
    # dev scores: as report.json has them from the evaluation
    report = json.loads((run_dir / "report.json").read_text())
    assert events.Scalars("eval/wer")[-1].value == pytest.approx(
        report["epochs"][-1]["dev"]["wer"], rel=1e-6
    )
    assert events.Scalars("eval/cer")[-1].step == STEPS


def test_report_writes_html_and_pngs(run: tuple[Path, str]) -> None:
    run_dir, _ = run
    result = CliRunner().invoke(cli, ["report", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(result.stdout)
    page = Path(written["report_html"]).read_text()
    for name in ("memory.png", "durations.png", "curves.png", "throughput.png"):
        png = run_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, name
        assert f'src="{name}"' in page
    report = json.loads((run_dir / "report.json").read_text())
    assert f"WER {100 * report['best_dev_wer']:.1f} %" in page


def _event(step: int, total: int = 5, source: str = "torch.cuda") -> StepEvent:
    return StepEvent(
        step=step,
        total_steps=total,
        epoch=0,
        loss=1.5,
        learning_rate=1e-3,
        utterances=4,
        audio_seconds=20.0,
        elapsed_seconds=step * 2.0,
        audio_seconds_per_second=10.0,
        eta_seconds=(total - step) * 2.0,
        predicted_bytes=2**30,
        measured_bytes=2**29,
        memory_source=source,
    )


def test_piped_progress_is_plain_periodic_lines() -> None:
    out = io.StringIO()
    display = progress_for(out, every_seconds=3600)
    assert isinstance(display, PlainProgress)
    for step in range(1, 6):
        display.on_step(_event(step))
    lines = out.getvalue().splitlines()
    # the first step, then nothing for an hour, then the last step
    assert lines == [
        "step 1/5 | loss 1.5000 | lr 1.00e-03 | 10.0 audio-s/s | mem 0.50/1.00 GiB meas/pred | ETA 0:08",
        "step 5/5 | loss 1.5000 | lr 1.00e-03 | 10.0 audio-s/s | mem 0.50/1.00 GiB meas/pred | ETA 0:00",
    ]
    assert "\x1b[" not in out.getvalue()


def test_a_cpu_step_names_the_process_rss_and_the_predicted_step_apart() -> None:
    # RSS holds the interpreter, libraries and cached inputs as well as the step's tensors,
    # which alone the plan predicts: a "meas/pred" pair would read as a 10x miss
    for source in ("rss", "rss+vmhwm"):
        line = step_line(_event(1, source=source))
        assert "rss 0.50 GiB, step pred 1.00 GiB" in line and "meas/pred" not in line


def test_terminal_gets_the_live_display() -> None:
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as stream:
            assert isinstance(progress_for(stream), RichProgress)
    finally:
        os.close(leader)
        os.close(follower)
