"""Checkpoint checksums and full disks: each checkpoint has its SHA-256 beside it; resume
passes over a damaged or truncated newest checkpoint for the previous good one, naming both;
a write that meets a full disk (a real file-size limit in a forked child) names the file and
the bytes it needs and leaves the earlier files whole and no temporary file."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import resource
import signal

import pytest
import torch
from torch import nn

from asrfit.errors import ConfigError, DiskFullError
from asrfit.train.checkpoint import (
    checkpoint_problem,
    checksum_path,
    latest_good_checkpoint,
    list_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
)
from asrfit.utils.io import atomic_write_text


def _save(folder, steps, keep_last=0):
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    return [save_checkpoint(folder, model=model, step=s, keep_last=keep_last) for s in steps]


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_each_checkpoint_has_its_sha256_and_old_ones_go_with_it(tmp_path):
    files = _save(tmp_path, [1, 2, 3], keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "checkpoint-00000002.pt",
        "checkpoint-00000003.pt",
    ]
    assert sorted(p.name for p in tmp_path.glob("*.sha256")) == [
        "checkpoint-00000002.pt.sha256",
        "checkpoint-00000003.pt.sha256",
    ]
    newest = files[-1]
    want = (
        f"{hashlib.sha256(newest.read_bytes()).hexdigest()}  {newest.name}\n"  # as sha256sum writes
    )
    assert checksum_path(newest).read_text() == want
    assert checkpoint_problem(newest) is None


@pytest.mark.parametrize("damage", [_flip, _truncate])
def test_a_damaged_newest_checkpoint_is_passed_over_naming_both(tmp_path, caplog, damage):
    files = _save(tmp_path, [1, 2, 3])
    damage(files[-1])
    with caplog.at_level(logging.WARNING, logger="asrfit.train.checkpoint_files"):
        assert resolve_checkpoint("latest", tmp_path) == files[1]
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert str(files[2]) in warning and str(files[1]) in warning and "SHA-256" in warning
    with pytest.raises(ConfigError, match="checkpoint-00000003.pt.*SHA-256"):
        resolve_checkpoint(files[-1])  # named explicitly: refused, not replaced


def test_without_a_checksum_file_a_checkpoint_is_used_only_when_it_loads(tmp_path):
    files = _save(tmp_path, [1, 2])
    for file in files:
        checksum_path(file).unlink()
    assert latest_good_checkpoint(tmp_path) == files[1]
    _truncate(files[1])
    assert latest_good_checkpoint(tmp_path) == files[0]


def test_no_good_checkpoint_is_an_error_naming_each(tmp_path):
    files = _save(tmp_path, [1, 2])
    _flip(files[0])
    _truncate(files[1])
    with pytest.raises(
        ConfigError, match=r"checkpoint-00000002\.pt: .*checkpoint-00000001\.pt: .*afresh"
    ):
        latest_good_checkpoint(tmp_path)


def _write_under_a_file_size_limit(target: str, text: str, limit_bytes: int, queue) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: EFBIG instead of death
    resource.setrlimit(
        resource.RLIMIT_FSIZE, (limit_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
    )
    try:
        atomic_write_text(target, text)
        queue.put(None)
    except DiskFullError as exc:
        queue.put((type(exc).__name__, str(exc), exc.needed_bytes))
    except BaseException as exc:
        queue.put((type(exc).__name__, str(exc), None))


def test_a_full_disk_names_the_file_and_the_bytes_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(
        target=_write_under_a_file_size_limit, args=(str(target), "x" * 5000, 1000, queue)
    )
    child.start()
    got = queue.get(timeout=60)
    child.join()
    assert got is not None and got[0] == "DiskFullError", got
    name, message, needed = got
    assert message.startswith(f"{target}: not written: ") and "File too large" in message
    assert needed == 5000 and "it needs 5,000 bytes" in message and "--resume" in message
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary left
