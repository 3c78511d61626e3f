"""When nothing fits a T4: the largest Conformer the plan proposes, checked two other ways.

Run: ``PYTHONPATH=src .venv/bin/python -m bench nothing_fits [--out docs/benchmarks.md]``.

A Conformer-CTC too large for a T4 (default: d_model 4096, 24 layers, 16 heads, 9.75 B
parameters) is planned on a LibriSpeech-like manifest (``bench/_corpora.py``, utterances up
to 24.5 s) with a target batch of 16 utterances. The planner finds nothing that fits and
proposes, among other things, the largest Conformer of the same family that trains the
target batch at the longest bucket (:mod:`asrfit.plan.proposals`). The proposal is then
checked by two references it did not use:

- **a fresh plan** of the proposed configuration on the same data and GPU (the planner's own
  search: fitted cost models, refinement traces, the allocator model, the safety margin): it
  must succeed within usable memory. It chooses the fastest setup, not the frugal one the
  proposal was checked with, so its micro-batches in the longest bucket may be smaller than
  the target (the table shows what it chose, and its accumulation);
- **fresh two-step simulations** at the target batch and the longest bucket, of the proposal
  (within the usable memory) and of the next wider configuration at the same depth (over it),
  so the proposal is the largest at its depth.

Nothing here runs on a GPU: the figures are predictions for a T4's 15 GiB (usable memory is
the catalog's memory times the default safety margin).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import re
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from bench._corpora import write_librispeech_like
from bench._report import write_section

GIB = 2**30
PROPOSAL = re.compile(
    r"a smaller Conformer: d_model (\d+), (\d+) layers .* trains (\d+) x ([\d.]+) s "
    r"\((\d+) input steps, (\d+) labels\) on (\S+) with (\S+) (\S+), "
    r"predicted to reserve ([\d.]+) of ([\d.]+) GiB usable"
)


def main() -> None:
    """Plan the oversized model, read its proposals, check the Conformer one, write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="T4")
    parser.add_argument("--d-model", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--target-batch", type=int, default=16)
    parser.add_argument("--utterances", type=int, default=28_539)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from asrfit.memory.models.adapters import hf_adapter
    from asrfit.memory.setup import Setup
    from asrfit.memory.step import BatchShape
    from asrfit.models.conformer import conformer_config
    from asrfit.plan.proposals import reserved_by_simulation
    from asrfit.plan.search import PlanError, plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile

    def config(d_model: int, layers: int):
        return conformer_config(d_model, encoder_layers=layers, encoder_attention_heads=args.heads)

    def parameters(cfg) -> int:
        import torch

        from asrfit.models.conformer.modeling import ConformerForCTC

        with torch.device("meta"):
            return sum(p.numel() for p in ConformerForCTC(cfg).parameters())

    hardware = HardwareProfile.from_name(args.gpu)
    usable = hardware.usable_bytes
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("ASRFIT_CACHE_DIR", str(Path(tmp) / "cache"))
        manifest = write_librispeech_like(Path(tmp) / "ls.jsonl", args.utterances)
        dataset = DatasetProfile.from_manifest(manifest)
        big = config(args.d_model, args.layers)
        started = time.perf_counter()
        try:
            plan(hardware, dataset, big, target_effective_batch=args.target_batch)
        except PlanError as error:
            message = str(error)
        else:
            sys.exit(
                f"d_model {args.d_model} x {args.layers} layers fits the {args.gpu}: pick a larger one"
            )
        failed_in = time.perf_counter() - started
        print(message, flush=True)
        found = PROPOSAL.search(message)
        if found is None:
            sys.exit("the plan error proposes no smaller Conformer")
        d_model, layers = int(found[1]), int(found[2])
        batch = BatchShape(int(found[3]), int(found[5]), int(found[6]))
        setup = Setup(
            precision=found[8].split("+")[0],
            gradient_checkpointing="+ckpt" in found[8],
            optimizer=found[9],
        )
        proposed = config(d_model, layers)

        started = time.perf_counter()
        fresh = plan(hardware, dataset, proposed, target_effective_batch=args.target_batch)
        replanned_in = time.perf_counter() - started
        longest = fresh.buckets[-1]

        def reserved(d: int) -> int:
            return reserved_by_simulation(
                hf_adapter(config(d, layers)), batch, setup, hardware.spec.architecture, True
            )

        heads = args.heads
        step = math.lcm(64, 8 * heads)
        at_proposal, wider = reserved(d_model), reserved(d_model + step)

    checks = [
        ("the fresh plan succeeds", True),
        ("its predicted peak is within usable memory", longest.predicted_peak_bytes <= usable),
        ("a fresh simulation of the proposal is within usable memory", at_proposal <= usable),
        (f"one of d_model {d_model + step} is not", wider > usable),
    ]
    command = (
        "PYTHONPATH=src .venv/bin/python -m bench nothing_fits "
        f"--gpu {args.gpu} --d-model {args.d_model} --layers {args.layers} --heads {args.heads} "
        f"--target-batch {args.target_batch} --out docs/benchmarks.md"
    )
    proposals = message.split("Proposals (checked by the simulator):")[-1].strip().splitlines()
    body = "\n".join(
        [
            f"## When nothing fits: the largest Conformer for a {args.gpu}, checked",
            "",
            f"Command: `{command}`  ",
            f"Run: {date.today()}, {platform.machine()} {platform.system()}, nproc={os.cpu_count()}; "
            f"{args.utterances:,} LibriSpeech-like utterances (up to 24.5 s); predictions for the "
            f"{args.gpu} ({usable / GIB:.2f} GiB usable after the safety margin), no GPU used.",
            "",
            f"Conformer-CTC d_model {args.d_model}, {args.layers} layers, {args.heads} heads "
            f"({parameters(big) / 1e9:.2f} B parameters), target batch {args.target_batch}: the plan "
            f"fails after {failed_in:.0f} s and proposes:",
            "",
            *[f"- {line.strip()}" for line in proposals if line.strip()],
            "",
            f"The proposal (d_model {d_model}, {layers} layers, {parameters(proposed) / 1e6:.0f} M "
            f"parameters) checked by references it did not use:",
            "",
            "| check | figure | holds |",
            "|---|---|---|",
            f"| a fresh plan of the proposal ({replanned_in:.0f} s) | {fresh.setup.describe()}, "
            f"{len(fresh.buckets)} buckets, {fresh.effective_batch_utterances:.1f} utterances "
            f"per step on average; longest {longest.max_seconds:g} s at micro-batch "
            f"{longest.batch_size} x {fresh.gradient_accumulation_steps} accumulated, predicted "
            f"peak {longest.predicted_peak_bytes / GIB:.2f} GiB"
            + "".join(f"; the plan warns: {w}" for w in fresh.warnings if "utterances" in w)
            + " | "
            f"{'yes' if all(ok for _, ok in checks[:2]) else '**no**'} |",
            f"| fresh simulation, {batch.batch_size} x {batch.input_length} input steps x "
            f"{batch.label_length} labels, {setup.describe()}, d_model {d_model} | "
            f"{at_proposal / GIB:.2f} GiB reserved | {'yes' if checks[2][1] else '**no**'} |",
            f"| the same, d_model {d_model + step} | {wider / GIB:.2f} GiB reserved (over "
            f"{usable / GIB:.2f}) | {'yes' if checks[3][1] else '**no**'} |",
        ]
    )
    print(body)
    for what, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if args.out:
        write_section(args.out, f"nothing-fits-{args.gpu.lower()}", body)
    if not all(ok for _, ok in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
