"""The built-in Conformer's CPU training step: each of asrfit's CPU kernel choices of
2026-11-27 (evening) against what it replaced.

Run: ``PYTHONPATH=src .venv/bin/python -m bench cpu_step_kernels --out docs/benchmarks.md``

One process, conformer-ctc-small with dropout 0.1, a 64-channel subsampling front-end and 80
mel bins (not the speech recipe's 40 bins and intermediate CTC), one fp32 training step
(forward, CTC loss, backward, clipping at 1.0, AdamW) on random log-mel features padded as a
bucket's batch is. Four variants, each adding one change to the one before, alternate round
by round (each round builds each variant's model and optimizer afresh from one seed and
times its steps after a warm-up step):

1. **before**: the code of 9c22417: dropout as ``torch.where(mask, 0, x) * scale`` over a
   boolean mask, padding zeroed and attention's keys masked with ``masked_fill``, the subsampling's convolutions
   channels-first, PyTorch's default CPU AdamW (a loop over tensors);
2. **+ float masks**: dropout and padding as one multiplication by a float mask, and
   attention's boolean key mask added as 0 / -inf (the same values: the losses must be
   bit-identical to 1's, and the table says whether they are);
3. **+ channels-last convolutions**: the subsampling's convolutions, and each block's
   depthwise convolution over time, in channels-last order for oneDNN
   (:func:`asrfit.models.dropout.conv2d`, :func:`~asrfit.models.dropout.conv1d_time_last`);
4. **+ fused AdamW**: PyTorch's fused CPU AdamW, as ``asrfit train`` builds it on a CPU.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from asrfit.models import dropout as D
from asrfit.models.conformer import layers as L
from asrfit.models.conformer.config import conformer_config
from asrfit.models.conformer.modeling import ConformerForCTC
from asrfit.train.host_allocator import keep_freed_host_memory
from bench._report import write_section

COMMAND = "PYTHONPATH=src .venv/bin/python -m bench cpu_step_kernels --out docs/benchmarks.md"
VARIANTS = ("before", "+ float masks", "+ channels-last convolutions", "+ fused AdamW")
NEW = (
    D.dropout,
    L.attention,
    L.ConvSubsampling.forward,
    L.ConvModule.forward,
    L.conv2d,
    L.conv1d_time_last,
)


def _where_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if not D.uses_fast_path(x, p):
        return F.dropout(x, p, training=True)
    drop, scale = D.drop_mask(x.shape, p, x.device)
    return torch.where(drop, 0.0, x) * scale


def _masked_fill_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False):  # noqa: ANN001, ANN202
    if not D.uses_fast_path(query, dropout_p) or is_causal:
        return NEW[1](query, key, value, attn_mask, dropout_p, is_causal)
    scores = torch.matmul(query * query.shape[-1] ** -0.5, key.transpose(-2, -1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.matmul(D.dropout(scores.softmax(-1), dropout_p), value)


def _masked_fill_subsampling(self, features, lengths):  # noqa: ANN001, ANN202
    x = features.unsqueeze(1)
    for conv in self.convs:
        if lengths is not None:
            x = x.masked_fill(~L.length_mask(lengths, x.shape[2])[:, None, :, None], 0.0)
            lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
        x = F.relu(conv(x))
    batch, channels, frames, freq = x.shape
    return self.out(x.transpose(1, 2).reshape(batch, frames, channels * freq)), lengths


def _masked_fill_conv_module(self, x, frame_mask):  # noqa: ANN001, ANN202
    x = F.glu(self.pointwise_conv1(self.norm(x)), dim=-1)
    if frame_mask is not None:
        x = x.masked_fill(~frame_mask[:, :, None], 0.0)
    x = self.depthwise_conv(x.transpose(1, 2)).transpose(1, 2)
    return self.dropout(self.pointwise_conv2(F.silu(self.conv_norm(x))))


def _use(variant: int) -> None:
    """Patch the model code to ``VARIANTS[variant]`` (the optimizer is chosen by the caller)."""
    (D.dropout, L.attention, L.ConvSubsampling.forward, L.ConvModule.forward, L.conv2d,
     L.conv1d_time_last) = NEW  # fmt: skip
    if variant < 1:
        D.dropout = _where_dropout
        L.attention = _masked_fill_attention
        L.ConvSubsampling.forward = _masked_fill_subsampling
        L.ConvModule.forward = _masked_fill_conv_module
    if variant < 2:
        L.conv2d = lambda conv, x: conv(x)
        L.conv1d_time_last = lambda conv, x: conv(x.transpose(1, 2)).transpose(1, 2)


def _run(variant: int, batch: dict, steps: int) -> tuple[list[float], list[float]]:
    """``steps`` training steps of a fresh model: (losses, seconds of each step)."""
    _use(variant)
    torch.manual_seed(0)
    config = conformer_config("small", dropout=0.1, subsampling_conv_channels=64)
    model = ConformerForCTC(config).train()
    fused = True if variant >= 3 else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0, fused=fused)
    losses, seconds = [], []
    for _ in range(steps):
        started = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - started)
        losses.append(loss.item())
    return losses, seconds


def main() -> None:
    """Time the four variants and print (or write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frames", type=int, default=330, help="longest utterance's frames")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="per round; the first is warm-up")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_host_memory()  # as asrfit train does on a CPU
    b, t = args.batch, args.frames
    torch.manual_seed(1)
    mask = torch.ones(b, t, dtype=torch.long)
    for i in range(b):  # a bucket's batch: lengths from 0.8 t to t
        mask[i, t - (t // 5) * i // max(1, b - 1) :] = 0 if i else 1
    batch = {
        "input_features": torch.randn(b, t, 80),
        "attention_mask": mask,
        "labels": torch.randint(1, 27, (b, t // 10)),
    }
    times: dict[int, list[float]] = {v: [] for v in range(len(VARIANTS))}
    losses: dict[int, list[float]] = {}
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for v in times:
            run_losses, seconds = _run(v, batch, args.steps)
            times[v] += seconds[1:]
            losses[v] = run_losses
    _use(len(VARIANTS) - 1)
    load_after = os.getloadavg()[0]
    med = {v: statistics.median(s) * 1e3 for v, s in times.items()}
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## CPU training step: asrfit's kernel choices against what they replaced",
        "",
        f"Command: `{COMMAND}`",
        "",
        f"Run {when}, torch {torch.__version__}, conformer-ctc-small (dropout 0.1, 64-channel "
        f"subsampling), fp32, batch {b} x {t} frames (lengths {t - t // 5}-{t}), "
        f"{args.threads} threads, one process, the variants alternating over {args.rounds} "
        f"rounds of {args.steps - 1} timed steps (a fresh model each round, one warm-up step); "
        f"1-minute load {load_before:.1f} before, {load_after:.1f} after. Each variant adds one "
        "change to the row above it.",
        "",
        "| variant | step, median ms | vs before | losses of a round's steps | "
        "losses equal to the row above |",
        "|---|---:|---:|---|---|",
    ]
    for v, name in enumerate(VARIANTS):
        same = "-" if v == 0 else ("bit for bit" if losses[v] == losses[v - 1] else "no")
        shown = ", ".join(f"{x:.6f}" for x in losses[v])
        lines.append(f"| {name} | {med[v]:.1f} | {med[0] / med[v]:.3f}x | {shown} | {same} |")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        write_section(args.out, "cpu-step-kernels", text)


if __name__ == "__main__":
    main()
