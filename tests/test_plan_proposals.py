"""When nothing fits, the plan error proposes a chunk length and a smaller Conformer.

Reference: fresh two-step simulations (not the planner's fitted cost model) of the proposed
configuration at the target batch, and of the next wider one, against usable memory.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape
from asrfit.models.conformer import conformer_config
from asrfit.plan.proposals import reserved_by_simulation
from asrfit.plan.search import PlanError, plan
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import HardwareProfile
from asrfit.testing import write_manifest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
MIB = 2**20


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    mp = pytest.MonkeyPatch()
    mp.setenv("ASRFIT_CACHE_DIR", str(tmp_path_factory.mktemp("simcache")))
    yield
    mp.undo()


def test_a_conformer_too_big_for_the_t4_budget_gets_checked_proposals(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        {"audio_filepath": f"{i}.wav", "duration": float(d), "text": "ab " * int(4 * d)}
        for i, d in enumerate(np.linspace(2.0, 20.0, 40))
    ]
    dataset = DatasetProfile.from_manifest(write_manifest(tmp_path / "train.jsonl", rows))
    usable = 300 * MIB  # the T4's allocator model and rates, a budget a test can trace
    monkeypatch.setattr(HardwareProfile, "usable_bytes", property(lambda self: usable))
    t4 = HardwareProfile.from_name("T4")
    config = conformer_config(512, encoder_layers=6, encoder_attention_heads=4)
    with pytest.raises(PlanError) as info:
        plan(t4, dataset, config, target_effective_batch=4)
    message = str(info.value)
    assert "Proposals (checked by the simulator):" in message
    found = re.search(
        r"a smaller Conformer: d_model (\d+), (\d+) layers .* trains 4 x 20 s "
        r"\((\d+) input steps, (\d+) labels\) on T4 with (\S+) (\S+),",
        message,
    )
    assert found, message
    d_model, layers = int(found[1]), int(found[2])
    assert d_model * d_model * layers < 512 * 512 * 6
    batch = BatchShape(4, int(found[3]), int(found[4]))
    assert batch.input_length == 2000  # 20 s of 100 log-mel frames per second
    setup = Setup(
        precision=found[5].split("+")[0],
        gradient_checkpointing="+ckpt" in found[5],
        optimizer=found[6],
    )

    def reserved(d: int) -> int:
        cfg = conformer_config(d, encoder_layers=layers, encoder_attention_heads=4)
        return reserved_by_simulation(hf_adapter(cfg), batch, setup, t4.spec.architecture, True)

    assert reserved(d_model) <= usable  # the proposal trains at the target batch
    assert reserved(d_model + 64) > usable  # and the next width does not
    chunk = re.search(r"chunk long audio to ([\d.]+) s", message)
    if chunk is None:
        assert "no chunk length helps" in message


def test_widths_tried_keep_the_per_head_width_a_multiple_of_8() -> None:
    # fused attention needs it; without, the scores stay in memory and memory jumps at such
    # widths, which would break the bisection (d_model 1216, 16 heads: 20.0 GiB, 1152: 12.4)
    from asrfit.plan.proposals import largest_conformer

    asked: list[int] = []

    def reserved(cfg) -> int:  # a stand-in for the simulation: grows with width and depth
        asked.append(int(cfg.d_model))
        return int(cfg.d_model) * int(cfg.encoder_layers)

    config = conformer_config(4096, encoder_layers=24, encoder_attention_heads=16)
    setup = Setup(precision="fp16", gradient_checkpointing=True, optimizer="adamw8bit")
    found = largest_conformer(
        config, setup, BatchShape(16, 2450, 380), 1152 * 6, "turing", check=reserved
    )
    assert asked and all(d % 16 == 0 and (d // 16) % 8 == 0 for d in asked)
    assert found is not None and int(found[0].d_model) * int(found[0].encoder_layers) <= 1152 * 6


def test_the_setup_for_a_smaller_model_is_the_one_lowest_at_the_target_batch() -> None:
    from asrfit.plan.proposals import frugal_setup

    class Costs:  # reserved bytes = states + batch x activations per utterance
        def __init__(self, setup: Setup, states: int, per_utterance: int) -> None:
            self.setup, self.states, self.per_utterance = setup, states, per_utterance

        def reserved_bytes(self, batch_size: int, input_length: int, label_length: int) -> int:
            return self.states + batch_size * self.per_utterance

    plain = Costs(Setup(precision="fp16", optimizer="adafactor"), 10, 100)
    recompute = Costs(
        Setup(precision="fp16", gradient_checkpointing=True, optimizer="adafactor"), 200, 20
    )
    assert frugal_setup([plain, recompute], BatchShape(1, 2450, 380)) == plain.setup
    assert frugal_setup([plain, recompute], BatchShape(16, 2450, 380)) == recompute.setup
    # states far over the budget hide the activations in both fits: checkpointing then
    tie = Costs(
        Setup(precision="fp16", gradient_checkpointing=True, optimizer="adafactor"), 10, 100
    )
    assert frugal_setup([plain, tie], BatchShape(16, 2450, 380)) == tie.setup
