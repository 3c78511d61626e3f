"""``asrfit train --resume`` over a checkpoint folder someone else filled: a planted pickle
is refused with an error naming the file, and the code in it never runs."""

from __future__ import annotations

import pytest
import torch

from asrfit.errors import ConfigError
from asrfit.recipes.run import RunConfig, train_asr
from asrfit.testing.dummies import dummy_manifest
from asrfit.testing.hostile import GOOD_TEXTS


class _Planted:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.usefixtures("one_thread")
def test_resume_refuses_a_planted_pickle(tmp_path):
    texts = [GOOD_TEXTS[i % len(GOOD_TEXTS)] for i in range(8)]
    dummy_manifest(
        tmp_path / "corpus", [1.0 + 0.1 * i for i in range(8)], texts=texts, name="train.jsonl"
    )
    out = tmp_path / "run"
    planted = out / "stage1" / "checkpoints" / "checkpoint-00000002.pt"
    planted.parent.mkdir(parents=True)
    marker = tmp_path / "code-ran"
    torch.save({"format_version": 1, "step": 2, "extra": {}, "payload": _Planted(marker)}, planted)
    config = RunConfig(
        model="conformer-ctc-tiny",
        train=str(tmp_path / "corpus" / "train.jsonl"),
        out_dir=str(out),
        target_batch=4,
        epochs=1,
        random_init=True,
        resume=True,
        model_overrides={"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2},
    )
    with pytest.raises(ConfigError, match=r"checkpoint-00000002\.pt: refused"):
        train_asr(config)
    assert not marker.exists()
