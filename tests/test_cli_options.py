"""Every bad option is answered while click parses, before any work: exit code 2, and a
message that names the flag and what it accepts."""

from __future__ import annotations

import io
import json
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from asrfit.cli.main import cli
from asrfit.cli.render import make_console, rows_table
from asrfit.testing import write_manifest

MEMORY = ["memory", "--model", "conformer-ctc-tiny", "--batch", "1", "--seconds", "1"]


@pytest.fixture()
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a command gets as far as tracing, profiling data or planning."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command did work before checking its options")

    import asrfit.memory.report as report
    import asrfit.plan.search as search
    import asrfit.profiles.dataset as dataset
    import asrfit.recipes.run as run

    monkeypatch.setattr(report, "simulate", refuse)
    monkeypatch.setattr(search, "plan", refuse)
    monkeypatch.setattr(dataset.DatasetProfile, "from_source", refuse)
    monkeypatch.setattr(run, "train_asr", refuse)


@pytest.fixture()
def manifest(tmp_path: Path) -> str:
    path = tmp_path / "m.jsonl"
    write_manifest(path, [{"audio_filepath": "a.wav", "duration": 2.0, "text": "hello"}])
    return str(path)


def _plan(manifest: str) -> list[str]:
    return ["plan", "--model", "conformer-ctc-tiny", "--data", manifest, "--gpu", "L4"]


def _train(manifest: str, tmp_path: Path) -> list[str]:
    return [
        "train",
        "--model",
        "conformer-ctc-tiny",
        "--data",
        manifest,
        "--out",
        str(tmp_path / "r"),
    ]


# (command builder, extra args, substrings the message must hold: the flag, then what it accepts)
BAD_OPTIONS = [
    ("memory", ["--seconds", "-3"], ["--seconds", "x>0"]),
    ("memory", ["--seconds", "abc"], ["--seconds", "not a valid float"]),
    ("memory", ["--batch", "0"], ["--batch", "x>=1"]),
    ("memory", ["--label-len", "0"], ["--label-len", "x>=1"]),
    (
        "memory",
        ["--precision", "bf17"],
        ["--precision", "'auto', 'fp32', 'bf16', 'fp16', 'pure_bf16'"],
    ),
    (
        "memory",
        ["--optimizer", "adam"],
        ["--optimizer", "'adamw', 'adamw8bit', 'adafactor', 'sgd'"],
    ),
    ("memory", ["--zero", "4"], ["--zero", "0<=x<=3"]),
    ("memory", ["--world-size", "0"], ["--world-size", "x>=1"]),
    ("memory", ["--gpu", "A100-50GB"], ["--gpu", "A100-40GB", "auto"]),
    ("memory", ["--offload-params", "--zero", "2"], ["--offload-params", "--zero 3"]),
    ("memory", ["--offload-optimizer"], ["--offload-optimizer", "--zero 1, 2 or 3"]),
    (
        "memory",
        ["--precision", "bf16", "--gpu", "T4"],
        ["--precision bf16 --gpu T4", "compute capability 7.5", "fp16"],
    ),
    (
        "memory",
        ["--precision", "pure_bf16", "--gpu", "V100"],
        ["--precision pure_bf16", "no bf16", "fp16"],
    ),
    ("plan", ["--safety", "1.5"], ["--safety", "0.5<=x<=0.98"]),
    ("plan", ["--target-batch", "0"], ["--target-batch", "x>=1"]),
    ("plan", ["--target-hours", "-1"], ["--target-hours", "x>0"]),
    ("plan", ["--world-size", "0"], ["--world-size", "x>=1"]),
    ("plan", ["--max-seconds", "0"], ["--max-seconds", "x>0"]),
    (
        "plan",
        ["--export", "xml"],
        ["--export", "'hf', 'deepspeed', 'accelerate', 'lhotse', 'nemo', 'lightning'"],
    ),
    ("plan", ["--long-utterances", "cut"], ["--long-utterances", "'chunk', 'filter'"]),
    (
        "plan",
        ["--precision", "bf16", "--gpu", "T4"],
        ["--precision bf16 --gpu T4", "no bf16", "fp16"],
    ),
    ("train", ["--stages", "0.5,0.1"], ["--stages", "increasing fractions in (0, 1]"]),
    ("train", ["--stages", "a,b"], ["--stages", "0.1,0.5,1.0"]),
    ("train", ["--set", "encoder_layers"], ["--set", "FIELD=VALUE"]),
    ("train", ["--epochs", "0"], ["--epochs", "x>0"]),
    ("train", ["--max-steps", "0"], ["--max-steps", "x>=1"]),
    ("train", ["--lr", "-1e-3"], ["--lr", "x>0"]),
    ("train", ["--target-batch", "-4"], ["--target-batch", "x>=1"]),
    ("train", ["--gpu", "T5"], ["--gpu", "Unknown GPU", "asrfit gpus"]),
    ("train", ["--plan", "missing-plan.json"], ["--plan", "does not exist"]),
    ("train", ["--dev", "missing-dev.jsonl"], ["--dev", "does not exist"]),
    ("train", ["--progress-every", "0"], ["--progress-every", "x>0"]),
    ("train", ["--keep-checkpoints", "0"], ["--keep-checkpoints", "x>=1"]),
    ("train", ["--stop-signals", "SIGKILL"], ["--stop-signals", "'SIGKILL'", "SIGTERM,SIGUSR1"]),
    # a range check is false for NaN: each must still be refused by name
    ("memory", ["--seconds", "nan"], ["--seconds", "'nan' is not a finite number"]),
    ("memory", ["--seconds", "inf"], ["--seconds", "'inf' is not a finite number"]),
    ("plan", ["--target-hours", "nan"], ["--target-hours", "not a finite number"]),
    ("plan", ["--max-seconds", "nan"], ["--max-seconds", "not a finite number"]),
    ("plan", ["--safety", "nan"], ["--safety", "not a finite number"]),
    ("train", ["--epochs", "inf"], ["--epochs", "not a finite number"]),
    ("train", ["--max-skipped", "nan"], ["--max-skipped", "not a finite number"]),
]


@pytest.mark.parametrize(("command", "extra", "expected"), BAD_OPTIONS)
def test_bad_option_names_the_flag_and_allowed_values(
    command: str,
    extra: list[str],
    expected: list[str],
    manifest: str,
    tmp_path: Path,
    no_work: None,
) -> None:
    base = {"memory": MEMORY, "plan": _plan(manifest), "train": _train(manifest, tmp_path)}[command]
    result = CliRunner().invoke(cli, [*base, *extra])
    assert result.exit_code == 2, result.output
    for text in expected:
        assert text in result.output, (text, result.output)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["plan", "--model", "conformer-ctc-tiny", "--data", "nope.jsonl"],
            ["--data", "nope.jsonl", "does not exist"],
        ),
        (["profile", "--num-gpus", "0"], ["--num-gpus", "x>=1"]),
        (["profile", "--sample-size", "0"], ["--sample-size", "x>=1"]),
        (["profile", "--gpu", "H101"], ["--gpu", "H100"]),
        (["demo-data", "x", "--num-train", "0"], ["--num-train", "x>=1"]),
        (["report", "no-such-run"], ["RUN_DIR", "does not exist"]),
    ],
)
def test_other_commands_check_options(args: list[str], expected: list[str], no_work: None) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    for text in expected:
        assert text in result.output


def test_report_of_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["report", str(tmp_path)])
    assert result.exit_code == 1
    assert "plan.json" in result.output and "asrfit train" in result.output


def test_unknown_model_offline_one_line_with_close_matches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_work: None
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    started = time.perf_counter()
    result = CliRunner().invoke(
        cli, ["memory", "--model", "wav2vec2-bsae", "--batch", "1", "--seconds", "1"]
    )
    assert time.perf_counter() - started < 2.0
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if "wav2vec2-bsae" in line]
    assert len(error) == 1  # one line, however many names it lists
    assert "--model" in error[0] and "Did you mean: wav2vec2-base" in error[0]
    assert "HF_HUB_OFFLINE is set, so the Hub was not asked" in error[0]


def test_unknown_model_close_match_from_the_local_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_work: None
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "hub" / "models--my-lab--conformer-swahili").mkdir(parents=True)
    result = CliRunner().invoke(
        cli, [*MEMORY[:1], "--model", "my-lab/conformer-swahli", *MEMORY[3:]]
    )
    assert result.exit_code == 2
    assert "Did you mean: my-lab/conformer-swahili" in result.output


def test_unknown_model_online_asks_the_hub_once_without_retries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture, no_work: None
) -> None:
    import huggingface_hub.constants

    import asrfit.profiles.hub_lookup as lookup

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(
        huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9"
    )  # refused at once
    calls = []
    real_probe = lookup.probe_hub
    monkeypatch.setattr(lookup, "probe_hub", lambda spec: calls.append(spec) or real_probe(spec))
    started = time.perf_counter()
    result = CliRunner().invoke(cli, [*MEMORY[:1], "--model", "someone/wav2vec2-bsae", *MEMORY[3:]])
    assert time.perf_counter() - started < 2.0
    assert result.exit_code == 2
    assert calls == ["someone/wav2vec2-bsae"]
    assert "could not be reached" in result.output and "HF_HUB_OFFLINE=1" in result.output
    assert "Retrying" not in caplog.text


def test_precision_follows_the_gpu() -> None:
    from asrfit.plan.precision import choose_precision
    from asrfit.profiles.gpus.catalog import resolve_gpu_name

    t4, l4 = resolve_gpu_name("T4")[0], resolve_gpu_name("L4")[0]
    assert (
        choose_precision("auto", t4)[0] == "fp16"
        and "loss scaling" in choose_precision(None, t4)[1]
    )
    assert choose_precision(None, resolve_gpu_name("V100")[0])[0] == "fp16"
    assert choose_precision(None, l4)[0] == "bf16"
    assert choose_precision("fp32", t4) == ("fp32", "as asked")


def test_memory_on_a_t4_defaults_to_fp16() -> None:
    result = CliRunner().invoke(cli, [*MEMORY, "--gpu", "T4", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["setup"]["precision"] == "fp16"
    assert "T4" in report["precision_reason"] and "loss scaling" in report["precision_reason"]
    # a peak with (nearly) no gradients is explained, and only then
    b, phase = report["breakdown_bytes"], report["step"]["peak_phase"]
    explained = any(n.startswith("gradients") and "at the peak" in n for n in report["notes"])
    assert explained == (
        b["gradients"] <= 0.05 * b["parameters"] and phase in ("forward", "backward")
    )


def test_gradient_note_by_phase() -> None:
    from asrfit.memory.report import explain_peak

    params = {"parameters": 1000}
    assert "forward pass" in explain_peak({**params, "gradients": 0}, "forward")[0]
    assert "start of backward" in explain_peak({**params, "gradients": 10}, "backward")[0]
    assert explain_peak({**params, "gradients": 1000}, "backward") == []
    assert explain_peak({**params, "gradients": 0}, "optimizer") == []


def test_piped_tables_never_wrap() -> None:
    value = "cache decoded audio " * 20  # 400 characters: far past 80 columns
    out = io.StringIO()
    make_console(out).print(rows_table("Plan", [("Data", value), ("Setup", "bf16 adamw")]))
    lines = out.getvalue().splitlines()
    assert any(value.strip() in line for line in lines)  # the whole value on one line
    assert "\x1b[" not in out.getvalue()  # no colour codes in a file


def test_demo_data_json(tmp_path: Path) -> None:
    args = [
        "demo-data",
        str(tmp_path / "d"),
        "--num-train",
        "2",
        "--num-dev",
        "1",
        "--num-test",
        "1",
        "--json",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "train split" in json.loads(result.stdout)


@pytest.mark.parametrize(
    ("signum", "status"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGUSR1, 128 + signal.SIGUSR1)],
)
def test_train_stopped_by_a_signal_exits_128_plus_its_number(
    signum: int, status: int, manifest: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asrfit.recipes.run as run
    from asrfit.train.interrupt import TrainingInterrupted

    seen = {}

    def stopped(cfg, listeners=None):
        seen["cfg"] = cfg
        raise TrainingInterrupted(3, tmp_path / "checkpoint-00000003.pt", signum)

    monkeypatch.setattr(run, "train_asr", stopped)
    args = [
        *_train(manifest, tmp_path),
        "--stop-signals",
        "SIGTERM,SIGUSR1",
        "--keep-checkpoints",
        "3",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == status, result.output
    assert "after step 3" in result.output and "--resume" in result.output
    assert seen["cfg"].stop_signals == "SIGTERM,SIGUSR1" and seen["cfg"].keep_checkpoints == 3
