"""How much of a Parakeet-TDT trace is the TDT loss's Python loop, and what it adds to the peak.

Question (2026-11-24): How much of a Parakeet-TDT trace is the TDT loss's Python loop, and what
does the loop add to the peak?

Answer: 83-92 % of the trace's CPU time; a stand-in without the lattice recursion under-predicts
the peak by 0.09-0.26 %, so a replacement must reproduce the loop's saved tensors, not drop them
(docs/benchmarks.md). The answer led to ``bench/investigations/lattice_sampling.py``.

Run: ``PYTHONPATH=src python -m bench investigations.tdt_loss_share``. For a few batch shapes of
parakeet-tdt-0.6b-v2 (full model, one step, bf16), one trace with transformers' ``tdt_loss``
and one with a stand-in that keeps only the float copies of both logits and a log-sum-exp over
their last axis (no lattice recursion); prints the CPU seconds of each trace and the stand-in's
peak relative to the real one. Issue 12: the loss's memory without tracing its loop.
"""

from __future__ import annotations

import logging
import time
import warnings

import transformers.loss.loss_tdt as loss_tdt

from asrfit.memory.report import resolve_adapter
from asrfit.memory.setup import OptimizerKind, Precision, Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape

CASES = [
    (BatchShape(8, 1225, 47), Setup(precision=Precision.BF16, optimizer=OptimizerKind.SGD)),
    (BatchShape(4, 2450, 190), Setup(precision=Precision.BF16, optimizer=OptimizerKind.SGD)),
    (
        BatchShape(4, 2450, 95),
        Setup(precision=Precision.BF16, gradient_checkpointing=True, optimizer=OptimizerKind.SGD),
    ),
]


def stand_in(token_logits, duration_logits, *_args, **_kwargs):  # noqa: ANN001, ANN201
    """The loss's float copies and a reduction over the vocabulary, without the lattice."""
    tokens = token_logits.float().logsumexp(-1).mean()
    return tokens + duration_logits.float().logsumexp(-1).mean()


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    adapter, _ = resolve_adapter("parakeet-tdt-0.6b-v2")
    real = loss_tdt.tdt_loss
    try:
        for batch, setup in CASES:
            runs = []
            for loss in (real, stand_in):
                loss_tdt.tdt_loss = loss  # ParakeetForTDTLoss calls it by this module's name
                started = time.process_time()
                step = simulate_step(adapter, batch, setup, steps=1)
                runs.append((time.process_time() - started, step.peak_bytes, step.peak_phase))
            (t_real, p_real, phase), (t_stub, p_stub, _) = runs
            print(
                f"{batch.batch_size} x {batch.input_length} x {batch.label_length} "
                f"{setup.describe()}: real loss {t_real:.1f} CPU s, stand-in {t_stub:.1f} CPU s, "
                f"peak {(p_stub - p_real) / p_real * 100:+.3f} % (real peak in {phase})"
            )
    finally:
        loss_tdt.tdt_loss = real


if __name__ == "__main__":
    main()
