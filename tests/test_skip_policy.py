"""A test skipped for a missing declared package fails; other skips stay skips, counted on the
last line with every skip that is not GPU-only named."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]


def test_missing_declared_package_fails_but_other_skips_do_not(pytester):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(
        test_a="""
import pytest

def test_declared(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "lhotse", None)  # as if lhotse were not installed
    pytest.importorskip("lhotse")

def test_undeclared():
    pytest.importorskip("a_package_nobody_declared")

def test_gpu_skip():
    pytest.skip("needs a CUDA GPU")
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(failed=1, skipped=2)
    result.stdout.fnmatch_lines(["*declared package 'lhotse' is not importable*"])
    result.stdout.fnmatch_lines(
        [
            "SKIPPED *",
            "SKIPPED *",
            "skipped: 2 (GPU-only: 1)",
            "  not GPU-only: test_a.py::test_undeclared: could not import "
            "'a_package_nobody_declared'*",
            "*1 failed, 2 skipped*",
        ],
        consecutive=True,
    )
