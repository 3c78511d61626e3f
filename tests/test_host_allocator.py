"""glibc keeps the memory a training process frees (``asrfit.train.host_allocator``).

Each case runs in a fresh interpreter: the setting is process-wide and cannot be undone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from asrfit.train.host_allocator import _glibc

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or _glibc() is None, reason="glibc on Linux only"
)

# Resident bytes after a 64 MiB tensor is written and freed, read from /proc/self/statm.
PROBE = """
import json, os, sys
import torch
from asrfit.train.host_allocator import keep_freed_host_memory
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
applied = keep_freed_host_memory()
before = rss()
block = torch.empty(64 * 2**20 // 4)
block.fill_(1.0)
during = rss()
del block
print(json.dumps({"applied": applied, "before": before, "during": during, "after": rss()}))
"""


def _run(env_value: str | None) -> dict:
    env = dict(os.environ)
    env.pop("ASRFIT_HOST_MALLOC", None)
    if env_value is not None:
        env["ASRFIT_HOST_MALLOC"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_block_stays_resident_when_kept() -> None:
    kept = _run(None)
    assert kept["applied"] is True
    assert kept["during"] - kept["before"] >= 60 * 2**20  # the block was faulted in
    assert kept["after"] >= kept["during"] - 4 * 2**20  # and stays after the free


def test_default_malloc_returns_the_freed_block() -> None:
    plain = _run("default")
    assert plain["applied"] is False
    assert plain["during"] - plain["before"] >= 60 * 2**20
    assert plain["after"] <= plain["during"] - 56 * 2**20  # a 64 MiB block is its own mmap
