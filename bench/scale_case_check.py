"""One real-scale step (``bench/cases.py``, sets memory-scale and memory-scale-rules) with config fields overridden, predicted
against the plain step at the allocator.

Run: ``PYTHONPATH=src .venv/bin/python -m bench scale_case_check --case "wav2vec2-base fp32
adamw" --set layerdrop=0.0``. Prints the predicted and measured bytes of the first case whose
name starts with ``--case``, its config changed by each ``--set field=value`` (a JSON value):
to ask what a miss of the split comes from without changing the split's cases.
"""

from __future__ import annotations

import argparse
import json

from asrfit.memory.models.generic import speech_adapter
from asrfit.memory.simulate import simulate_step
from bench import _truth
from bench.cases import cases as case_list


def main() -> None:
    """Run the case and print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="the start of a case's name")
    parser.add_argument("--set", nargs="*", default=[], help="config field=JSON value")
    args = parser.parse_args()
    cases = case_list("memory-scale", "memory-scale-rules")
    found = [c for c in cases if c.name.startswith(args.case)]
    if not found:
        raise SystemExit(f"no case starts with {args.case!r}; names: {[c.name for c in cases]}")
    case = found[0]
    overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}

    def config():  # noqa: ANN202
        made = case.make_config()
        for key, value in overrides.items():
            setattr(made, key, value)
        return made

    sim = simulate_step(speech_adapter(config()), case.batch, case.setup, target="cpu")
    real = _truth.measure_adapter_step(speech_adapter(config()), case.batch, case.setup)
    error = 100.0 * (sim.peak_raw_bytes - real.peak_bytes) / real.peak_bytes
    print(
        json.dumps(
            {
                "case": case.name,
                "overrides": overrides,
                "predicted_bytes": sim.peak_raw_bytes,
                "measured_bytes": real.peak_bytes,
                "error_pct": round(error, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
