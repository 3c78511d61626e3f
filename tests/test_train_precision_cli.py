"""``asrfit train --precision``: the plan the run makes is in that precision and the trainer
computes in it; refused with ``--plan`` (a saved plan keeps its own) and where the GPU named
has no bf16."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from asrfit.cli.main import cli
from asrfit.recipes.demo import write_demo_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("precision")
    write_demo_corpus(root, num_train=16, num_dev=2, num_test=2, max_seconds=2.0, seed=3)
    return root


def _train(corpus: Path, out: str, *extra: str):
    args = [
        "train",
        "--model",
        "conformer-ctc-tiny",
        "--data",
        str(corpus / "train.jsonl"),
        "--out",
        str(corpus / out),
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


@pytest.mark.slow
def test_train_plans_and_computes_in_the_precision_asked_for(corpus, caplog) -> None:
    caplog.set_level(logging.INFO, logger="asrfit.train.trainer")
    result = _train(corpus, "bf16", "--gpu", "auto", "--precision", "bf16")
    assert result.exit_code == 0, result.output
    plan = json.loads((corpus / "bf16" / "plan.json").read_text())
    assert plan["setup"]["precision"] == "bf16"
    config = json.loads((corpus / "bf16" / "report.json").read_text())["config"]
    assert config["precision"] == "bf16"
    assert any("mixed precision bf16" in r.getMessage() for r in caplog.records), caplog.text


def test_precision_with_a_saved_plan_is_refused(corpus) -> None:
    plan = corpus / "some-plan.json"
    plan.write_text("{}")
    result = _train(corpus, "with-plan", "--plan", str(plan), "--precision", "fp32")
    assert result.exit_code == 2, result.output
    assert "--precision fp32 --plan" in result.output
    assert "keeps the precision it was made for" in result.output
    assert not (corpus / "with-plan").exists()


def test_bf16_for_a_gpu_without_it_is_refused(corpus) -> None:
    result = _train(corpus, "t4", "--gpu", "T4", "--precision", "bf16")
    assert result.exit_code == 2, result.output
    assert "--precision bf16 --gpu T4" in result.output
    assert "no bf16 units" in result.output
    assert not (corpus / "t4").exists()
