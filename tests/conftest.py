"""Fixtures shared across test modules."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory):
    """Simulations, model facts and host rates go to a folder of this test session, not to
    ``~/.cache/asrfit``: a test run neither leaves files in the user's cache nor reads what an
    older checkout left there. Subprocesses inherit it; an explicit ``ASRFIT_CACHE_DIR`` is kept."""
    if "ASRFIT_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["ASRFIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("asrfit-cache"))
    yield
    os.environ.pop("ASRFIT_CACHE_DIR", None)


@pytest.fixture(scope="session", autouse=True)
def _default_malloc():
    """The trainer's glibc setting (keep freed memory) is process-wide and cannot be undone, so
    in the test process (and its subprocesses) malloc keeps its defaults and memory tests see
    what they free; ``tests/test_host_allocator.py`` checks the setting in subprocesses."""
    os.environ.setdefault("ASRFIT_HOST_MALLOC", "default")
    yield


@pytest.fixture(scope="module")
def one_thread():
    """Run a module on one torch thread: tiny models run many times faster on one thread than
    on two busy shared cores. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Packages the project declares (pyproject dependencies and the extras `make test` installs).
# A test skipped because one of them cannot be imported is a broken install, not a pass:
# pytest's importorskip reason reads "could not import 'NAME': ...".
DECLARED_PACKAGES = frozenset(
    {
        "transformers",
        "datasets",
        "accelerate",
        "lhotse",
        "deepspeed",
        "tensorboard",
        "yaml",
        "hypothesis",
        "soundfile",
        "scipy",
        "jiwer",
        "lightning",
    }
)


def missing_declared_package(reason: str) -> str | None:
    """The declared package a skip reason says could not be imported, if any."""
    if not reason.startswith("could not import '"):
        return None
    name = reason.split("'", 2)[1]
    return name if name.split(".")[0] in DECLARED_PACKAGES else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Turn a skip for a missing declared package into a failure that names it."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return
    name = missing_declared_package(str(report.longrepr[2]).removeprefix("Skipped: "))
    if name is not None:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: declared package {name!r} is not importable ({report.longrepr[2]}); "
            "install it (`make test` installs every extra) instead of skipping."
        )


def pytest_collectreport(report):
    """The same for a whole module skipped at import (``pytest.importorskip`` at the top)."""
    if report.skipped and isinstance(report.longrepr, tuple):
        name = missing_declared_package(str(report.longrepr[2]).removeprefix("Skipped: "))
        if name is not None:
            report.outcome = "failed"
            report.longrepr = (
                f"{report.nodeid}: declared package {name!r} is not importable; install it "
                "(`make test` installs every extra) instead of skipping."
            )


def is_gpu_only(reason: str) -> bool:
    """A skip for want of a GPU: its reason mentions CUDA or a GPU."""
    words = reason.lower()
    return "cuda" in words or "gpu" in words


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After `-rs`'s list: the skip count, then every skip that is not GPU-only with its reason
    (on a machine without a GPU only the GPU tests may skip)."""
    result = yield
    skips = []
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else ""
        skips.append((report.nodeid, reason.removeprefix("Skipped: ")))
    others = [(node, reason) for node, reason in skips if not is_gpu_only(reason)]
    terminalreporter.write_line(f"skipped: {len(skips)} (GPU-only: {len(skips) - len(others)})")
    for node, reason in others:
        terminalreporter.write_line(f"  not GPU-only: {node}: {reason}")
    return result
