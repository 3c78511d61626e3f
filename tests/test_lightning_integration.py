"""The Lightning export read by Lightning itself: its strategy registry, its Trainer, and a
real ``fit`` whose optimizer steps follow the exported accumulation."""

from __future__ import annotations

import warnings

import pytest
import torch

from asrfit.plan.exports import export_plan

lightning = pytest.importorskip("lightning")
from lightning.pytorch.strategies import StrategyRegistry  # noqa: E402

from tests.test_exports import example_plan  # noqa: E402

QUIET = dict(
    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
)


def _export(plan):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the approximate-strategy warning is tested elsewhere
        return export_plan(plan, "lightning")


@pytest.mark.parametrize(
    "setup",
    [
        dict(zero_stage=0, world_size=1),
        dict(zero_stage=0, world_size=4),
        dict(zero_stage=1, world_size=4),
        dict(zero_stage=2, world_size=4, offload=True),
        dict(zero_stage=3, world_size=4, offload=True, offload_params=True),
        dict(zero_stage=1, world_size=4, offload=True),
    ],
)
def test_every_exported_strategy_is_registered_in_lightning(setup):
    strategy = _export(example_plan(**setup))["strategy"]
    assert strategy == "auto" or strategy in StrategyRegistry.available_strategies()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "pure_bf16"])
def test_lightning_trainer_accepts_the_exported_arguments(precision):
    kwargs = _export(example_plan(precision=precision))
    assert kwargs["accelerator"] == "gpu"
    # No GPU here: the same arguments on the CPU accelerator (Lightning validates the rest).
    trainer = lightning.Trainer(**{**kwargs, "accelerator": "cpu"}, **QUIET)
    assert trainer.accumulate_grad_batches == kwargs["accumulate_grad_batches"]
    assert trainer.gradient_clip_val == kwargs["gradient_clip_val"]
    assert trainer.num_nodes == kwargs["num_nodes"] and trainer.num_devices == kwargs["devices"]


class _Tiny(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.batches_seen = 0

    def training_step(self, batch, batch_idx):
        self.batches_seen += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_real_fit_takes_one_optimizer_step_per_exported_accumulation(tmp_path):
    plan = example_plan(precision="fp32")
    kwargs = _export(plan)
    accumulation = kwargs["accumulate_grad_batches"]
    batch = plan.min_batch_size
    # the export's claim: a fixed batch of min_batch_size x accumulation is the target batch
    assert abs(batch * accumulation - 32) <= batch
    data = torch.utils.data.TensorDataset(
        torch.randn(batch * accumulation * 2, 4), torch.randn(batch * accumulation * 2, 1)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=batch)
    model = _Tiny()
    trainer = lightning.Trainer(
        **{**kwargs, "accelerator": "cpu"}, max_epochs=1, default_root_dir=str(tmp_path), **QUIET
    )
    trainer.fit(model, loader)
    assert model.batches_seen == 2 * accumulation
    assert trainer.global_step == 2
