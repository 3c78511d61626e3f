"""Partial vs full activation checkpointing on the CPU, at one byte budget.

For a small built-in Conformer (``--family conformer``) or a small Parakeet-TDT
(``--family parakeet-tdt``: transformers' FastConformer encoder, LSTM prediction network and
TDT joint, random weights) and one padded batch, the simulator predicts the CPU peak of
checkpointing the first k of L encoder layers for every k. The byte budget is the predicted
peak of k = ``--budget-k``; at that budget k = 0 does not fit and the smallest k that fits
is the one that recomputes least (at one batch, the fastest). Then the real steps of that k
and of every layer checkpointed run side by side in one process (alternating, after a
warm-up), and the real peak of the chosen k is counted at the CPU allocator
(``bench/_truth.py``) and compared with the prediction. As in ``asrfit train`` on a CPU,
glibc keeps freed memory (:mod:`asrfit.train.host_allocator`), so neither setup pays each
step for the kernel to map its activations afresh.

    PYTHONPATH=src python -m bench partial_checkpointing --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.real_step import build_model
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from asrfit.memory.trace.optimizers import make_optimizer
from asrfit.models.conformer import conformer_config
from asrfit.train.host_allocator import keep_freed_host_memory
from bench import _truth
from bench._grid import _parakeet_encoder, environment_line
from bench._report import write_section

MIB = 2**20


def _config(family: str, d_model: int, layers: int):
    if family == "parakeet-tdt":
        import transformers

        encoder = {
            **_parakeet_encoder(),
            "hidden_size": d_model,
            "num_hidden_layers": layers,
            "intermediate_size": 4 * d_model,
            "subsampling_conv_channels": 64,
            **dict.fromkeys(
                ("dropout", "attention_dropout", "activation_dropout", "dropout_positions"), 0.0
            ),
        }
        config = transformers.ParakeetTDTConfig(
            vocab_size=64,
            blank_token_id=63,
            pad_token_id=63,
            decoder_hidden_size=d_model,
            encoder_config=encoder,
        )
        config.architectures = ["ParakeetForTDT"]
        return config
    return conformer_config(d_model, encoder_layers=layers, encoder_attention_heads=4, dropout=0.0)


def _timed_steps(config, batch, setups, steps, warmup) -> dict[str, list[float]]:
    """Alternate real training steps of each setup; wall seconds per step."""
    runs = {}
    for name, setup in setups.items():
        adapter = hf_adapter(config())
        torch.manual_seed(0)
        model = build_model(adapter, setup)
        optimizer = make_optimizer(setup, [p for p in model.parameters() if p.requires_grad])
        inputs = _truth.real_inputs_from_adapter(adapter, batch)
        runs[name] = (adapter, model, optimizer, inputs)
    times: dict[str, list[float]] = {name: [] for name in setups}
    for i in range(warmup + steps):
        for name, (adapter, model, optimizer, inputs) in runs.items():
            started = time.perf_counter()
            loss = adapter.loss(model, {k: v.clone() for k, v in inputs.items()})
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if i >= warmup:
                times[name].append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("conformer", "parakeet-tdt"), default="conformer")
    parser.add_argument("--d-model", type=int, default=144)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--frames", type=int, default=800, help="log-mel frames (100 per s)")
    parser.add_argument("--budget-k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_host_memory()
    L = args.layers

    def config():  # a fresh config per model (the simulator and real runs must not share one)
        return _config(args.family, args.d_model, L)

    batch = BatchShape(args.batch, args.frames, max(1, args.frames // 20))
    setups = {
        k: Setup(precision="fp32", optimizer="adamw", checkpoint_layers=k) for k in range(L + 1)
    }
    full = Setup(precision="fp32", optimizer="adamw", gradient_checkpointing=True)
    predicted = {}
    for k, setup in setups.items():
        sim = simulate_step(hf_adapter(config()), batch, setup, target="cpu")
        predicted[k] = sim.peak_raw_bytes
    predicted_full = simulate_step(hf_adapter(config()), batch, full, target="cpu")
    budget = predicted[args.budget_k]
    k = min(k for k in predicted if predicted[k] <= budget)
    measured_peak = _truth.measure_adapter_step(hf_adapter(config()), batch, setups[k]).peak_bytes
    load_before = os.getloadavg()[0]
    times = _timed_steps(
        config, batch, {"partial": setups[k], "full": full}, args.steps, args.warmup
    )
    load_after = os.getloadavg()[0]
    audio = args.batch * args.frames / 100.0
    rate = {name: audio / statistics.median(t) for name, t in times.items()}
    ratio = rate["partial"] / rate["full"]
    command = (
        "PYTHONPATH=src python -m bench partial_checkpointing "
        + (f"--family {args.family} " if args.family != "conformer" else "")
        + f"--d-model {args.d_model} "
        f"--layers {L} --batch {args.batch} --frames {args.frames} --budget-k {args.budget_k} "
        f"--steps {args.steps} --threads {args.threads} --out docs/benchmarks.md"
    )
    curve = ", ".join(f"k={i}: {predicted[i] / MIB:.1f}" for i in range(L + 1))
    model = (
        "Conformer-CTC" if args.family == "conformer" else "Parakeet-TDT (FastConformer encoder)"
    )
    body = f"""## Partial vs full activation checkpointing (CPU, one byte budget): {model}

`{command}`

{environment_line()}; {args.threads} torch thread(s); 1-minute load average {load_before:.2f}
before the timed steps, {load_after:.2f} after (shared machine: the two setups alternate
step by step in one process, so load hits both alike).

{model} d_model {args.d_model}, {L} layers, fp32 AdamW, batch {args.batch} x
{args.frames} log-mel frames ({audio / args.batch:g} s each). Predicted CPU peak (MiB) by
layers checkpointed (the first k): {curve}; every layer (the model's own
gradient checkpointing): {predicted_full.peak_raw_bytes / MIB:.1f}.

| | setup | predicted peak | measured peak | median step | audio s/s |
|---|---|---|---|---|---|
| budget | {budget / MIB:.1f} MiB (= predicted peak at k = {args.budget_k}) | | | | |
| k = 0 | none | {predicted[0] / MIB:.1f} MiB (over the budget) | | | |
| partial | first {k} of {L} layers | {predicted[k] / MIB:.1f} MiB | {measured_peak / MIB:.1f} MiB | {statistics.median(times["partial"]):.3f} s | {rate["partial"]:.2f} |
| full | all {L} layers | {predicted_full.peak_raw_bytes / MIB:.1f} MiB | | {statistics.median(times["full"]):.3f} s | {rate["full"]:.2f} |

Throughput of partial over full checkpointing: **{ratio:.2f}x** (goal: at least 1.15x).
Measured peak of the partial setup minus the predicted one: {measured_peak - predicted[k]:+,d} bytes
({(measured_peak - predicted[k]) / predicted[k]:+.4%}; negative: within the prediction). Steps measured:
{args.steps} per setup after {args.warmup} warm-up.
"""
    print(body)
    if args.out is not None:
        section = "partial-checkpointing-cpu" + (
            "" if args.family == "conformer" else f"-{args.family}"
        )
        write_section(args.out, section, body)


if __name__ == "__main__":
    main()
