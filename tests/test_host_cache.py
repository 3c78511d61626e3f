"""Host rates are cached only when measured on cores no other process competed for."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from asrfit.profiles import host, host_cache
from asrfit.profiles.rates import DeviceRates


def test_contended_compares_other_threads_with_the_spare_cores():
    assert not host_cache.contended(0, threads=2, cores=2)
    assert host_cache.contended(1, threads=2, cores=2)
    assert not host_cache.contended(2, threads=2, cores=4)
    assert host_cache.contended(3, threads=2, cores=4)
    assert host_cache.contended(1, threads=8, cores=4)  # more threads than cores


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_busy_processes_are_counted_and_this_process_is_not():
    quiet = host_cache.other_runnable()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)  # both are running
        busy = host_cache.other_runnable(samples=9)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert busy >= quiet + 1 and busy >= 1


def _fake_rates() -> DeviceRates:
    return DeviceRates(
        name="cpu: fake",
        matmul_flops_per_second={"fp32": 1e9},
        conv_flops_per_second={"fp32": 1e9},
        memory_bytes_per_second=1e9,
        kernel_seconds=1e-6,
        forward_kernel_seconds=1e-6,
    )


@pytest.mark.parametrize("others, cached", [(0, True), (5, False)])
def test_a_measurement_beside_busy_processes_is_used_but_not_cached(
    tmp_path, monkeypatch, caplog, others, cached
):
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(host, "measure_host_rates", lambda threads: _fake_rates())
    monkeypatch.setattr(host, "other_runnable", lambda: others)
    monkeypatch.setattr(host.os, "cpu_count", lambda: 2)
    host.host_rates.cache_clear()
    caplog.set_level(logging.WARNING, logger="asrfit.profiles.host")
    try:
        rates = host.host_rates(2)
    finally:
        host.host_rates.cache_clear()
    assert rates.name == "cpu: fake"
    files = list((tmp_path / "host").glob("*.json")) if (tmp_path / "host").exists() else []
    assert bool(files) is cached
    assert ("not cached" in caplog.text) is not cached
