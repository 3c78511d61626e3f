"""Fixtures shared across test modules."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Run a module on one torch thread: tiny models run many times faster on one thread than
    on two busy shared cores. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
