"""MemoryMonitor and AdaptiveMemoryCallback: JSONL, thresholds, per-bucket summary, a real Trainer."""

from __future__ import annotations

import builtins
import json
import logging
import mmap
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from asrfit.errors import ConfigError
from asrfit.memory.setup import Setup
from asrfit.plan.plan import Plan
from asrfit.testing import make_plan
from asrfit.train.monitor import MemoryMonitor
from asrfit.train.probes import MemorySample, host_rss_bytes

GIB = 2**30
MONITOR_LOGGER = "asrfit.train.monitor"
RECORD_KEYS = {
    "step", "step_seconds", "device", "source", "bucket", "batch_size", "allocated_bytes",
    "reserved_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "predicted_bytes",
    "measured_over_predicted", "budget_bytes", "budget_fraction", "warned", "freed_cache",
    "freed_bytes",
}  # fmt: skip


class FakeMeter:
    """Returns queued samples in order; counts peak resets."""

    def __init__(self, samples: list[MemorySample]) -> None:
        self.samples = list(samples)
        self.resets = 0

    def measure(self) -> MemorySample:
        return self.samples.pop(0)

    def reset(self) -> None:
        self.resets += 1


def flat(peak_bytes: int) -> MemorySample:
    return MemorySample(peak_bytes // 2, peak_bytes, peak_bytes // 2, peak_bytes)


def fake_monitor(samples: list[MemorySample], budget_bytes: int = 1000, **kwargs) -> MemoryMonitor:
    meter = FakeMeter(samples)
    return MemoryMonitor(
        budget_bytes, device="cpu", measure=meter.measure, reset_peak=meter.reset, **kwargs
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def vm_rss_bytes() -> int:
    """RSS from /proc/self/status (a reference independent of psutil / statm)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


# --- the monitor on the real CPU -------------------------------------------------------------


def test_cpu_jsonl_lines_have_the_keys_and_increasing_steps(tmp_path: Path) -> None:
    # each step's wall time, bracketed by this test's own clock: the step holds a 20 ms sleep,
    # and the monitor's figure lies between the time inside and the time around its two calls
    brackets = []
    with MemoryMonitor(8 * GIB, device="cpu", log_dir=tmp_path) as monitor:
        for step in (1, 2, 3):
            before = time.perf_counter()
            monitor.start_step()
            inside = time.perf_counter()
            block = torch.ones(1024, 1024)  # 4 MiB touched inside the step
            del block
            time.sleep(0.02)
            inside = time.perf_counter() - inside
            monitor.end_step(step, bucket=0, predicted_bytes=GIB, batch_size=4)
            brackets.append((inside, time.perf_counter() - before))
    lines = read_jsonl(tmp_path / "memory.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line, (inside, around) in zip(lines, brackets, strict=True):
        assert set(line) == RECORD_KEYS
        assert line["device"] == "cpu" and line["source"] in ("rss", "rss+vmhwm")
        assert line["allocated_bytes"] == line["reserved_bytes"]  # both are the RSS on CPU
        assert line["peak_reserved_bytes"] >= line["reserved_bytes"] > 50 * 2**20
        assert line["budget_bytes"] == 8 * GIB and line["batch_size"] == 4
        assert 0.02 <= inside <= line["step_seconds"] <= around
        assert line["measured_over_predicted"] == pytest.approx(line["peak_reserved_bytes"] / GIB)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_cpu_rss_matches_proc_and_step_peak_sees_a_freed_block() -> None:
    assert host_rss_bytes() == pytest.approx(vm_rss_bytes(), rel=0.02)
    monitor = MemoryMonitor(8 * GIB, device="cpu")
    if monitor.source != "rss+vmhwm":
        pytest.skip("this kernel does not let the process reset VmHWM, or does not keep the mark")
    monitor.start_step()
    start_bytes = vm_rss_bytes()
    # fresh pages from the kernel, every one written (resident), then unmapped: a malloc'd block
    # may instead reuse resident pages that earlier tests freed in the heap, and not move RSS
    block = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    block.close()
    record = monitor.end_step(1, bucket=None, predicted_bytes=None, batch_size=1)
    assert record["peak_reserved_bytes"] - start_bytes >= 60 * 2**20
    assert record["reserved_bytes"] < record["peak_reserved_bytes"] - 32 * 2**20
    assert monitor.summary()["process_peak_rss_bytes"] >= record["peak_reserved_bytes"]
    # The next step starts from a fresh high-water mark: the 64 MiB block is not counted again.
    monitor.start_step()
    record = monitor.end_step(2, bucket=None, predicted_bytes=None, batch_size=1)
    assert record["peak_reserved_bytes"] < start_bytes + 32 * 2**20


@pytest.mark.parametrize(("share", "warned", "freed"), [(0.92, True, False), (0.96, True, True)])
def test_cpu_thresholds_with_a_budget_just_above_the_rss(
    share: float, warned: bool, freed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = MemoryMonitor(8 * GIB, device="cpu")
    monitor.start_step()
    monitor.budget_bytes = int(host_rss_bytes() / share)
    with caplog.at_level(logging.WARNING, logger=MONITOR_LOGGER):
        record = monitor.end_step(7, bucket=1, predicted_bytes=None, batch_size=2)
    assert record["budget_fraction"] == pytest.approx(share, abs=0.015)
    assert (record["warned"], record["freed_cache"]) == (warned, freed)
    assert (monitor.warnings, monitor.cache_frees) == (1, int(freed))
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 1 and "step 7" in messages[0]
    assert ("no allocator cache to free" in messages[0]) == freed


# --- exact numbers through an injected measurement -------------------------------------------


def test_threshold_edges_are_inclusive(caplog: pytest.LogCaptureFixture) -> None:
    peaks = [899, 900, 949, 950, 1200]
    monitor = fake_monitor([flat(p) for p in peaks], budget_bytes=1000)
    with caplog.at_level(logging.WARNING, logger=MONITOR_LOGGER):
        records = []
        for step, _ in enumerate(peaks, start=1):
            monitor.start_step()
            records.append(monitor.end_step(step, bucket=0, predicted_bytes=None, batch_size=1))
    assert [r["warned"] for r in records] == [False, True, True, True, True]
    assert [r["freed_cache"] for r in records] == [False, False, False, True, True]
    assert [r["budget_fraction"] for r in records] == [0.899, 0.9, 0.949, 0.95, 1.2]
    assert (monitor.warnings, monitor.cache_frees) == (4, 2)
    warned_steps = [r.getMessage().split(":")[0] for r in caplog.records]
    assert warned_steps == ["step 2", "step 3", "step 4", "step 5"]


def test_per_bucket_summary_equals_the_values_fed_in(tmp_path: Path) -> None:
    # (bucket, predicted, peak reserved, peak allocated, batch)
    steps = [
        (0, 100, 80, 60, 32),
        (1, 200, 250, 190, 12),
        (0, 120, 130, 90, 30),
        (None, None, 40, 10, 1),
        (1, 300, 210, 200, 12),
    ]
    samples = [MemorySample(1, 2, alloc, peak) for _, _, peak, alloc, _ in steps]
    monitor = fake_monitor(samples, budget_bytes=10_000, log_dir=tmp_path)
    for step, (bucket, predicted, *_, batch) in enumerate(steps, start=1):
        monitor.start_step()
        monitor.end_step(step, bucket=bucket, predicted_bytes=predicted, batch_size=batch)
    monitor.close()
    summary = monitor.summary()
    assert summary["steps"] == 5 and summary["budget_bytes"] == 10_000
    assert (summary["peak_reserved_bytes"], summary["peak_allocated_bytes"]) == (250, 200)
    assert summary["process_peak_rss_bytes"] is None
    assert summary["buckets"] == [
        {"bucket": None, "steps": 1, "max_batch_size": 1, "predicted_bytes": None,
         "measured_bytes": 40, "measured_allocated_bytes": 10, "ratio": None,
         "worst_step_ratio": None},
        {"bucket": 0, "steps": 2, "max_batch_size": 32, "predicted_bytes": 120,
         "measured_bytes": 130, "measured_allocated_bytes": 90, "ratio": 130 / 120,
         "worst_step_ratio": 130 / 120},
        {"bucket": 1, "steps": 2, "max_batch_size": 12, "predicted_bytes": 300,
         "measured_bytes": 250, "measured_allocated_bytes": 200, "ratio": 250 / 300,
         "worst_step_ratio": 250 / 200},
    ]  # fmt: skip
    lines = read_jsonl(tmp_path / "memory.jsonl")
    assert [line["peak_reserved_bytes"] for line in lines] == [80, 250, 130, 40, 210]
    assert [line["measured_over_predicted"] for line in lines] == [0.8, 1.25, 130 / 120, None, 0.7]
    rows = dict(monitor.summary_rows())
    assert rows["Steps"] == "5" and rows["Warnings / cache frees"] == "0 / 0"
    assert "(x1.08, 2 steps)" in rows["Bucket 0"]


def test_start_step_resets_the_peak_each_step_and_jsonl_appends(tmp_path: Path) -> None:
    meter = FakeMeter([flat(10)] * 5)
    first = MemoryMonitor(
        100, device="cpu", log_dir=tmp_path, measure=meter.measure, reset_peak=meter.reset
    )
    for step in (1, 2, 3):
        first.start_step()
        first.end_step(step, bucket=None, predicted_bytes=None, batch_size=1)
    first.close()
    first.close()  # closing twice is harmless
    assert meter.resets == 3
    with MemoryMonitor(100, device="cpu", log_dir=tmp_path, measure=meter.measure) as second:
        for step in (4, 5):
            second.start_step()
            second.end_step(step, bucket=None, predicted_bytes=None, batch_size=1)
    assert [line["step"] for line in read_jsonl(tmp_path / "memory.jsonl")] == [1, 2, 3, 4, 5]


# --- TensorBoard -----------------------------------------------------------------------------


def test_tensorboard_missing_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name.startswith(("torch.utils.tensorboard", "tensorboard")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    monkeypatch.setattr(builtins, "__import__", failing_import)
    with pytest.raises(ImportError, match=r"pip install asrfit\[tensorboard\]"):
        MemoryMonitor(GIB, device="cpu", log_dir=tmp_path, tensorboard=True)
    from asrfit.train.callbacks import AdaptiveMemoryCallback

    with pytest.raises(ImportError, match=r"pip install asrfit\[tensorboard\]"):
        AdaptiveMemoryCallback(log_dir=tmp_path, tensorboard=True)
    assert not (tmp_path / "memory.jsonl").exists()


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``log_dir`` as TensorBoard itself reads the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_tensorboard_scalars(tmp_path: Path) -> None:
    samples = [MemorySample(1 * GIB, 2 * GIB, 3 * GIB, 4 * GIB)]
    with fake_monitor(samples, budget_bytes=8 * GIB, log_dir=tmp_path, tensorboard=True) as monitor:
        monitor.start_step()
        monitor.end_step(5, bucket=0, predicted_bytes=5 * GIB, batch_size=2)
    # the samples above in GiB; budget fraction: peak reserved 4 GiB of 8
    assert read_scalars(tmp_path) == {
        "memory/allocated_gib": [(5, 1.0)],
        "memory/reserved_gib": [(5, 2.0)],
        "memory/peak_gib": [(5, 3.0)],
        "memory/peak_reserved_gib": [(5, 4.0)],
        "memory/budget_fraction": [(5, 0.5)],
        "memory/predicted_gib": [(5, 5.0)],
    }


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget_bytes": 0}, "budget_bytes=0"),
        ({"budget_bytes": 2.5e9}, "budget_bytes=2500000000.0"),
        ({"warn_fraction": 0.96}, "warn_fraction=0.96"),
        ({"tensorboard": True}, "needs a log_dir"),
        ({"device": "meta"}, "device type 'meta'"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    arguments = {"budget_bytes": GIB, "device": "cpu", **kwargs}
    with pytest.raises(ConfigError, match=match):
        MemoryMonitor(arguments.pop("budget_bytes"), **arguments)


def test_end_step_rejects_a_negative_prediction() -> None:
    monitor = fake_monitor([flat(10)])
    monitor.start_step()
    with pytest.raises(ConfigError, match="predicted_bytes=-5"):
        monitor.end_step(1, bucket=0, predicted_bytes=-5, batch_size=1)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_cuda_device_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="torch.cuda.is_available"):
        MemoryMonitor(GIB, device="cuda")


# --- the Hugging Face callback inside a real Trainer -----------------------------------------


class TinyRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.mse_loss(self.linear(x).squeeze(-1), y)}


def tiny_plan() -> Plan:
    """Batch limits 8 and 2 over 0-4-10 s on a T4's 13.6 GiB usable."""
    return make_plan(
        (8, 2),
        bucket_edges_seconds=(0.0, 4.0, 10.0),
        utterance_fractions=(0.6, 0.4),
        usable_bytes=int(13.6 * GIB),
        setup=Setup(precision="fp32", gradient_checkpointing=False, optimizer="adamw"),
        gradient_accumulation_steps=1,
        target_effective_batch="2 utterances",
    )


def run_trainer(tmp_path: Path, callback) -> tuple[object, list[dict]]:
    """Train TinyRegressor for 3 steps; also returns the logs dicts a later callback saw."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    seen_logs: list[dict] = []

    class LogRecorder(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen_logs.append(dict(logs))

    torch.manual_seed(0)
    data = [{"x": torch.randn(4), "y": torch.randn(())} for _ in range(8)]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=2,
        use_cpu=True, report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    callbacks = [callback, LogRecorder()]
    trainer = Trainer(model=TinyRegressor(), args=args, train_dataset=data, callbacks=callbacks)
    trainer.train()
    return trainer, seen_logs


def test_callback_in_a_real_trainer(tmp_path: Path) -> None:
    from asrfit.train.callbacks import AdaptiveMemoryCallback

    plan = tiny_plan()
    callback = AdaptiveMemoryCallback(plan=plan, log_dir=tmp_path / "memory")
    trainer, seen_logs = run_trainer(tmp_path, callback)

    lines = read_jsonl(tmp_path / "memory" / "memory.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all(line["budget_bytes"] == int(13.6 * GIB) for line in lines)  # plan.usable_bytes
    assert all(line["batch_size"] == 2 and line["bucket"] is None for line in lines)
    assert all(line["source"].startswith("rss") for line in lines)
    expected_prediction = plan.predicted_reserved_bytes(2, 160000, 150)  # longest bucket, batch 2
    assert all(line["predicted_bytes"] == expected_prediction for line in lines)

    step_logs = [entry for entry in seen_logs if "loss" in entry]
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(step_logs) == len(history) == 3
    assert all(
        entry.items() <= kept.items() for entry, kept in zip(step_logs, history, strict=True)
    )
    for entry, line in zip(step_logs, lines, strict=True):
        assert entry["memory_reserved_gib"] == round(line["reserved_bytes"] / GIB, 4)
        assert entry["memory_peak_reserved_gib"] == round(line["peak_reserved_bytes"] / GIB, 4)
        assert {"memory_allocated_gib", "memory_peak_gib", "memory_budget_fraction",
                "memory_predicted_gib"} <= set(entry)  # fmt: skip
    summary = json.loads((tmp_path / "memory" / "memory_summary.json").read_text())
    assert summary == callback.summary
    assert summary["steps"] == 3 and summary["buckets"][0]["steps"] == 3


def test_callback_tensorboard_events_in_a_real_trainer(tmp_path: Path) -> None:
    from asrfit.train.callbacks import AdaptiveMemoryCallback

    plan = tiny_plan()
    callback = AdaptiveMemoryCallback(plan=plan, log_dir=tmp_path / "memory", tensorboard=True)
    run_trainer(tmp_path, callback)
    scalars = read_scalars(tmp_path / "memory")
    lines = read_jsonl(tmp_path / "memory" / "memory.jsonl")
    prediction = plan.predicted_reserved_bytes(2, 160000, 150) / GIB  # longest bucket, batch 2
    # one point per optimizer step, the values memory.jsonl holds (TensorBoard keeps float32)
    for tag, key in [
        ("memory/reserved_gib", "reserved_bytes"),
        ("memory/peak_reserved_gib", "peak_reserved_bytes"),
        ("memory/allocated_gib", "allocated_bytes"),
        ("memory/peak_gib", "peak_allocated_bytes"),
    ]:
        assert [s for s, _ in scalars[tag]] == [1, 2, 3]
        expected = [line[key] / GIB for line in lines]
        assert [v for _, v in scalars[tag]] == pytest.approx(expected, rel=1e-6)
    assert [v for _, v in scalars["memory/predicted_gib"]] == pytest.approx([prediction] * 3)
    budget = plan.usable_bytes
    assert [v for _, v in scalars["memory/budget_fraction"]] == pytest.approx(
        [line["peak_reserved_bytes"] / budget for line in lines], rel=1e-6
    )


def test_callback_budget_defaults_to_85_percent_of_host_ram(tmp_path: Path) -> None:
    from asrfit.train.callbacks import AdaptiveMemoryCallback

    callback = AdaptiveMemoryCallback(log_dir=tmp_path / "memory")
    run_trainer(tmp_path, callback)
    host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    lines = read_jsonl(tmp_path / "memory" / "memory.jsonl")
    assert len(lines) == 3
    assert lines[0]["budget_bytes"] == pytest.approx(0.85 * host_bytes, rel=1e-6)
    assert lines[0]["predicted_bytes"] is None


def test_callback_rejects_a_bad_budget() -> None:
    from asrfit.train.callbacks import AdaptiveMemoryCallback

    with pytest.raises(ConfigError, match="budget_bytes=-1"):
        AdaptiveMemoryCallback(budget_bytes=-1)


# --- CUDA ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_numbers_come_from_torch_cuda(caplog: pytest.LogCaptureFixture) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    block_bytes = 256 * 2**20
    keep = torch.empty(block_bytes // 4, device=device)
    monitor = MemoryMonitor(torch.cuda.get_device_properties(device).total_memory, device=device)
    monitor.start_step()
    temporary = torch.empty(block_bytes // 4, device=device)
    del temporary
    record = monitor.end_step(1, bucket=0, predicted_bytes=None, batch_size=1)
    assert record["source"] == "torch.cuda"
    assert record["allocated_bytes"] == torch.cuda.memory_allocated(device)
    assert record["reserved_bytes"] == torch.cuda.memory_reserved(device)
    assert record["peak_allocated_bytes"] >= record["allocated_bytes"] + block_bytes
    assert record["peak_reserved_bytes"] >= record["peak_allocated_bytes"]
    # A budget just under the reserved bytes takes the free path and empties the cache.
    monitor.start_step()
    temporary = torch.empty(block_bytes // 4, device=device)
    del temporary
    monitor.budget_bytes = torch.cuda.memory_reserved(device)
    with caplog.at_level(logging.WARNING, logger=MONITOR_LOGGER):
        record = monitor.end_step(2, bucket=0, predicted_bytes=None, batch_size=1)
    assert record["freed_cache"] and monitor.cache_frees == 1
    assert record["freed_bytes"] >= block_bytes  # the temporary's cached block went back
    assert "torch.cuda.empty_cache()" in caplog.text
    del keep
