"""How one of several torchrun processes exits (asrfit.utils.process_exit): the status
``sys.exit`` would give, streams and logging flushed, no interpreter finalization."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asrfit.utils.process_exit import exit_process, exit_status

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import atexit, logging, sys
from asrfit.utils.process_exit import exit_process
logging.basicConfig(stream=sys.stderr, format="%(message)s")
atexit.register(lambda: print("atexit ran", flush=True))
print("written", end="")
logging.getLogger("x").warning("logged")
exit_process({code})
"""


def _run(code: str, world_size: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), WORLD_SIZE=world_size)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(code=code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("code", "status", "stderr_tail"),
    [("0", 0, ""), ("None", 0, ""), ("143", 143, ""), ("'bad input'", 1, "bad input\n")],
)
def test_a_distributed_process_exits_with_sys_exits_status_and_skips_finalization(
    code, status, stderr_tail
):
    done = _run(code, "2")
    assert done.returncode == status
    assert done.stdout == "written"  # flushed, and no atexit handler ran
    assert done.stderr == "logged\n" + stderr_tail


def test_a_single_process_exits_as_usual():
    done = _run("'bad input'", "1")
    assert done.returncode == 1
    assert done.stdout == "writtenatexit ran\n"
    assert done.stderr == "logged\nbad input\n"
    with pytest.raises(SystemExit) as raised:
        exit_process(3)
    assert raised.value.code == 3


def test_exit_status_is_sys_exits():
    assert [exit_status(c) for c in (None, 0, 2, 143, "message")] == [0, 0, 2, 143, 1]


def test_the_asrfit_command_exits_so_in_a_distributed_process():
    script = (
        "import atexit, sys\n"
        "from asrfit.cli.main import main\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "sys.argv = ['asrfit', '{arg}']\n"
        "main()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), WORLD_SIZE="2")
    runs = [
        subprocess.run(
            [sys.executable, "-c", script.format(arg=arg)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for arg in ("--version", "--no-such-option")
    ]
    assert runs[0].returncode == 0 and runs[0].stdout.startswith("asrfit, version ")
    assert "atexit ran" not in runs[0].stdout
    assert runs[1].returncode == 2 and "No such option '--no-such-option'" in runs[1].stderr
