"""Preemption: SIGTERM to one of two gloo processes under torchrun (CPU) stops both after the
same step with one checkpoint, and the resumed run ends bit-identical to an uninterrupted one.

Negative control: without the per-step agreement (``InterruptRequest.agreed``) only the
signalled rank stops, the other waits in its next step's all-reduce, and the run times out.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asrfit.errors import ConfigError
from asrfit.train.interrupt import InterruptRequest, TrainingInterrupted, parse_stop_signals

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "_preempt_worker.py"


def _torchrun(out: Path, mode: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}",
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        ACCELERATE_USE_CPU="yes",
        PYTHONFAULTHANDLER="1",  # a worker that aborts prints where
    )
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        "0",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "127.0.0.1:0",
        str(WORKER),
        str(out),
        mode,
    ]
    # a session of its own, so that a timeout ends torchrun's workers too
    with subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_sigterm_to_one_rank_stops_both_at_one_step_and_resumes_exactly(tmp_path):
    reference = _torchrun(tmp_path / "reference", "reference")
    assert reference.returncode == 0, reference.stderr[-8000:]

    run = tmp_path / "run"
    stopped = _torchrun(run, "signal")
    assert stopped.returncode != 0, "the signalled run should stop before its end"
    ranks = [json.loads((run / f"stopped-rank{r}.json").read_text()) for r in range(2)]
    assert [r["step"] for r in ranks] == [2, 2]  # the step rank 1 was in when signalled
    assert [r["signal"] for r in ranks] == ["SIGTERM", "SIGTERM"]
    assert [r["status"] for r in ranks] == [128 + signal.SIGTERM] * 2
    assert ranks[0]["checkpoint"] is not None and ranks[1]["checkpoint"] is None  # written once
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "checkpoint-00000002.pt",
        "checkpoint-00000002.pt.sha256",
    ]
    assert not (run / "final.pt").exists()

    _refused_on_one_process(run)
    resumed = _torchrun(run, "resume")
    assert resumed.returncode == 0, resumed.stderr[-8000:]
    want, got = _weights(tmp_path / "reference" / "final.pt"), _weights(run / "final.pt")
    assert want.keys() == got.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_a_full_disk_on_the_main_process_stops_every_process(tmp_path):
    """Rank 0 cannot write the step-2 checkpoint (a real file-size limit): it raises
    DiskFullError naming the file, rank 1 CheckpointWriteError quoting it, and both exit
    instead of rank 1 waiting for a collective rank 0 never joins."""
    run = tmp_path / "run"
    result = _torchrun(run, "full")
    assert result.returncode != 0
    errors = [json.loads((run / f"error-rank{r}.json").read_text()) for r in range(2)]
    assert errors[0]["type"] == "DiskFullError"
    assert re.search(
        r"checkpoint-00000002\.pt: not written: .* it needs [\d,]+ bytes", errors[0]["message"]
    )
    assert errors[1]["type"] == "CheckpointWriteError"
    assert "step 2" in errors[1]["message"] and errors[0]["message"] in errors[1]["message"]
    assert not list((run / "checkpoints").iterdir())  # no temporary file, no half checkpoint


def _refused_on_one_process(run: Path) -> None:
    """Resuming the two processes' checkpoint in one process is refused, naming both sizes
    and what to do; the checkpoint is left as it was."""
    from _frames import FrameModel
    from test_ddp import make_data, make_trainer

    data, durations = make_data()
    before = (run / "checkpoints" / "checkpoint-00000002.pt").read_bytes()
    trainer = make_trainer(FrameModel(), 4, out_dir=run / "one-process")
    with pytest.raises(ConfigError, match=r"saved by 2 processes, resumed on 1.*nproc_per_node 2"):
        trainer.train(data, durations=durations, max_steps=5, resume_from=run / "checkpoints")
    assert (run / "checkpoints" / "checkpoint-00000002.pt").read_bytes() == before


def test_stop_signals_parse_and_refuse_by_name():
    assert parse_stop_signals("SIGTERM,SIGUSR1") == (signal.SIGTERM, signal.SIGUSR1)
    assert parse_stop_signals("term usr2") == (signal.SIGTERM, signal.SIGUSR2)
    assert parse_stop_signals("none") == ()
    for bad in ("SIGKILL", "SIGBOGUS", "SIGINT"):
        with pytest.raises(ConfigError, match=bad.removeprefix("SIG")):
            parse_stop_signals(bad)


def test_a_stop_signal_is_caught_only_while_installed():
    request = InterruptRequest(["SIGUSR1"])
    before = signal.getsignal(signal.SIGUSR1)
    with request.installed():
        os.kill(os.getpid(), signal.SIGUSR1)
        assert request.signal_number == signal.SIGUSR1
        stop = TrainingInterrupted(7, None, request.signal_number)
        assert stop.exit_status == 128 + signal.SIGUSR1 and "SIGUSR1" in str(stop)
    assert signal.getsignal(signal.SIGUSR1) is before and not request.requested
