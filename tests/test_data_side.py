"""The plan's data side: training on the CPU with cached inputs loads in the training process."""

from __future__ import annotations

from types import SimpleNamespace

from asrfit.plan.data_side import data_decisions

GIB = 2**30


def _dataset(decoded_gib: float) -> SimpleNamespace:
    return SimpleNamespace(
        duration_sample_seconds=[2.0, 4.0, 8.0],
        duration_max_seconds=8.0,
        estimated_decoded_bytes=int(decoded_gib * GIB),
    )


def _hardware(source: str, cpus: int = 4, host_gib: float = 24.0) -> SimpleNamespace:
    return SimpleNamespace(source=source, cpu_count=cpus, host_available_bytes=int(host_gib * GIB))


def test_cpu_training_with_cached_inputs_takes_no_loader_worker() -> None:
    d = data_decisions(_dataset(0.6), _hardware("cpu-only"), 1, "chunk", 10.0)
    assert d.cache_decoded_audio and d.num_workers == 0
    assert any("0 loader workers" in r and "cached" in r for r in d.reasons)


def test_workers_stay_where_the_cache_is_off_or_a_gpu_trains() -> None:
    # the same corpus planned for a GPU: workers decode beside the GPU's step
    gpu = data_decisions(_dataset(0.6), _hardware("catalog"), 1, "chunk", 10.0)
    assert gpu.cache_decoded_audio and gpu.num_workers == 3  # 4 CPUs, one for training
    # on the CPU but too big to cache: every epoch decodes anyway, so workers still help
    big = data_decisions(_dataset(12.0), _hardware("cpu-only"), 1, "chunk", 10.0)
    assert not big.cache_decoded_audio and big.num_workers == 3


def test_offload_warns_when_the_host_cannot_hold_the_offloaded_states() -> None:
    from asrfit.plan.data_side import HOST_BUFFER_FACTOR, offload_warnings
    from asrfit.profiles.hardware import HardwareProfile

    t4 = HardwareProfile.from_name("T4", num_gpus=4)
    t4.host_available_bytes = 64 * 2**30
    per_process = 8 * 2**30  # 4 processes x 8 GiB x 1.5 for buffers = 48 GiB: 75 % of 64
    assert offload_warnings(per_process, 4, t4) == []
    t4.host_available_bytes = 48 * 2**30  # now 100 %
    (warning,) = offload_warnings(per_process, 4, t4)
    assert f"{4 * 8 * HOST_BUFFER_FACTOR:.1f} GiB" in warning and "48.0 GiB free" in warning
    assert "not the GPU's host" in warning  # a catalog GPU: the RAM is this machine's
    assert offload_warnings(0, 4, t4) == []  # nothing offloaded
