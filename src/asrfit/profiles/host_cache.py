"""Where this machine's measured host rates are cached, and whether a measurement may be.

The micro-benchmarks of :mod:`asrfit.profiles.host` run once per machine, torch version and
thread count, and every later plan reuses them. A measurement taken while other processes
compete for the cores reads slow rates, and a cached one would price every later step as
slow (on a 2-core host, a measurement beside two busy processes priced the demo's epoch at
58 s against 16 s trained). So a measurement is cached only when no other process was
runnable on the cores it needed, before and after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path


def host_cache_dir() -> Path | None:
    """The host-rates cache folder, or None when ``ASRFIT_CACHE_DIR=off``."""
    value = os.environ.get("ASRFIT_CACHE_DIR", "")
    if value.lower() == "off":
        return None
    return (Path(value) if value else Path.home() / ".cache" / "asrfit") / "host"


def cache_file(key: list) -> Path | None:
    """The cache file of one measurement ``key`` (JSON-serialisable), or None when off."""
    folder = host_cache_dir()
    if folder is None:
        return None
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]
    return folder / f"{digest}.json"


def _runnable_now() -> int | None:
    """Runnable threads of other processes now: Linux's count (``/proc/loadavg``) minus this
    process's own (``/proc/self/task/*/stat``); None where these cannot be read."""
    try:
        total = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        own = 0
        for task in Path("/proc/self/task").iterdir():
            stat = (task / "stat").read_text()
            own += stat[stat.rindex(")") + 2] == "R"
    except (OSError, IndexError, ValueError):
        return None
    return max(0, total - own)


def other_runnable(samples: int = 5, interval_seconds: float = 0.02) -> int:
    """The median number of other processes' runnable threads over ``samples`` readings;
    0 where the system does not say (the measurement is then cached as before)."""
    readings = []
    for i in range(samples):
        if i:
            time.sleep(interval_seconds)
        now = _runnable_now()
        if now is None:
            return 0
        readings.append(now)
    return int(statistics.median(readings))


def contended(others: int, threads: int, cores: int | None = None) -> bool:
    """Whether ``others`` runnable threads leave fewer than ``threads`` cores of ``cores``."""
    cores = cores or os.cpu_count() or 1
    return others > max(0, cores - threads)
