"""Two passes of host micro-benchmarks merge figure by figure: the faster of each."""

from __future__ import annotations

from asrfit.profiles import host
from asrfit.profiles.rates import DeviceRates, best_of


def _rates(scale: float) -> DeviceRates:
    """A machine ``scale`` times slower than the reference one, in every figure."""
    return DeviceRates(
        name="cpu: 1 threads of test",
        matmul_flops_per_second={"fp32": 100.0 / scale, "bf16": 50.0 / scale},
        conv_flops_per_second={"fp32": 80.0 / scale},
        memory_bytes_per_second=10.0 / scale,
        kernel_seconds=5.0 * scale,
        forward_kernel_seconds=4.0 * scale,
        threads=1,
        sources=[f"pass at {scale}"],
        kind_bytes_per_second={"norm": 3.0 / scale},
        optimizer_kernel_seconds=2.0 * scale,
        module_seconds=70.0 * scale,
        kernel_seconds_by_kind={"conv": [90.0 * scale, 60.0 * scale]},
        rate_curves={"bandwidth:random": {"fp32": [[1024.0, 1.0 / scale], [4096.0, 2.0 / scale]]}},
        int_kernel_seconds=1.5 * scale,
        attention_seconds={"fp32": {"forward": [[16, 64, 0.5 * scale]]}},
    )


def test_best_of_keeps_the_faster_figure_of_each_pass() -> None:
    fast, slow = _rates(1.0), _rates(1.5)
    # a pass that was slow in one part and fast in another: each figure from its better pass
    mixed = _rates(1.5)
    mixed.module_seconds = 60.0
    mixed.rate_curves["bandwidth:random"]["fp32"][1] = [4096.0, 3.0]
    merged = best_of(fast, mixed)
    assert merged.matmul_flops_per_second == fast.matmul_flops_per_second
    assert merged.memory_bytes_per_second == 10.0
    assert merged.kernel_seconds == 5.0 and merged.forward_kernel_seconds == 4.0
    assert merged.module_seconds == 60.0
    assert merged.kernel_seconds_by_kind == {"conv": [90.0, 60.0]}
    assert merged.rate_curves["bandwidth:random"]["fp32"] == [[1024.0, 1.0], [4096.0, 3.0]]
    assert merged.attention_seconds == {"fp32": {"forward": [[16, 64, 0.5]]}}
    assert merged.threads == 1 and merged.sources == ["pass at 1.0"]
    assert best_of(slow, fast).to_dict() == best_of(fast, slow).to_dict() | {
        "sources": ["pass at 1.5"]
    }


def test_measure_host_rates_merges_its_passes(monkeypatch) -> None:  # noqa: ANN001
    passes = iter([_rates(1.5), _rates(1.0)])
    monkeypatch.setattr(host, "_measure_once", lambda threads: next(passes))
    rates = host.measure_host_rates(1, passes=2)
    assert rates.module_seconds == 70.0 and rates.memory_bytes_per_second == 10.0
    assert rates.sources == ["best of 2 passes of: pass at 1.5"]
