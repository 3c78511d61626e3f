"""``asrfit train --plan`` through the CLI: a plan made for another model, GPU or dataset stops
the run with the mismatched fingerprint named; ``--force-plan`` trains with it anyway."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from asrfit.cli.main import cli
from asrfit.recipes.demo import write_demo_corpus

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "conformer-ctc-tiny"


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """Two small corpora and a plan saved by ``asrfit plan`` for the first, this host's GPU
    (``auto``) and the tiny model."""
    root = tmp_path_factory.mktemp("refusal")
    write_demo_corpus(root / "a", num_train=24, num_dev=2, num_test=2, max_seconds=3.0, seed=1)
    write_demo_corpus(root / "b", num_train=40, num_dev=2, num_test=2, max_seconds=3.0, seed=2)
    plan = root / "plan.json"
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            "--model",
            MODEL,
            "--data",
            str(root / "a" / "train.jsonl"),
            "--gpu",
            "auto",
            "--target-batch",
            "4",
            "--out",
            str(plan),
        ],
    )
    assert result.exit_code == 0, result.output
    return {
        "root": root,
        "a": root / "a" / "train.jsonl",
        "b": root / "b" / "train.jsonl",
        "plan": plan,
    }


def _train(setup, out: str, *extra: str, data: str = "a", model: str = MODEL):
    args = [
        "train",
        "--model",
        model,
        "--data",
        str(setup[data]),
        "--out",
        str(setup["root"] / out),
        "--plan",
        str(setup["plan"]),
        "--target-batch",
        "4",
        "--max-steps",
        "1",
        "--random-init",
        "--no-spec-augment",
        "--no-tensorboard",
        "--save-every",
        "0",
        "--json",
        *extra,
    ]
    return CliRunner().invoke(cli, args)


def _refused(result, key: str) -> None:
    assert result.exit_code != 0, result.output
    text = result.output + "".join(map(str, [result.exception or ""]))
    assert f"{key}: plan made for" in text, text
    assert "--force-plan" in text
    # only the mismatched fingerprint is named
    others = {"model", "gpu", "data"} - {key}
    assert not any(f"{other}: plan made for" in text for other in others), text


@pytest.mark.slow
def test_a_plan_for_another_dataset_is_refused_and_force_plan_trains(setup) -> None:
    refused = _train(setup, "refused", data="b")
    _refused(refused, "data")
    assert not (setup["root"] / "refused" / "report.json").exists()

    forced = _train(setup, "forced", "--force-plan", data="b")
    assert forced.exit_code == 0, forced.output
    report = json.loads((setup["root"] / "forced" / "report.json").read_text())
    steps = [
        json.loads(line)
        for line in (setup["root"] / "forced" / "steps.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1]
    assert report["config"]["model"] == MODEL
    # it trained with the plan it was given, not one of its own
    assert (setup["root"] / "forced" / "plan.json").read_bytes() == setup["plan"].read_bytes()


@pytest.mark.slow
def test_a_plan_for_another_model_is_refused(setup) -> None:
    _refused(_train(setup, "other-model", model="conformer-ctc-small"), "model")


@pytest.mark.slow
def test_a_plan_for_another_gpu_is_refused(setup) -> None:
    _refused(_train(setup, "other-gpu", "--gpu", "T4"), "gpu")


@pytest.mark.slow
def test_the_plan_it_was_made_for_trains_without_force(setup) -> None:
    # the negative control: the same model, GPU and data pass the check
    result = _train(setup, "same")
    assert result.exit_code == 0, result.output
    assert (setup["root"] / "same" / "report.json").is_file()
