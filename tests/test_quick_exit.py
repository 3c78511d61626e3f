"""The planning commands' quicker exit (asrfit.utils.quick_exit): which commands take it,
and that an exit with it still runs what it should."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from asrfit.cli import main as cli_main


@pytest.mark.parametrize(("command", "quick"), [("plan", True), ("memory", True), ("train", False)])
def test_only_planning_commands_freeze_at_exit(
    command: str, quick: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(cli_main, "freeze_at_exit", lambda: calls.append(command))
    result = CliRunner().invoke(cli_main.cli, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert calls == ([command] if quick else [])


def test_an_exit_with_frozen_objects_still_runs_atexit_handlers_and_flushes(
    tmp_path: Path,
) -> None:
    code = f"""
import atexit, logging, sys
from asrfit.utils.quick_exit import freeze_at_exit
freeze_at_exit()
freeze_at_exit()  # once per process
atexit.register(lambda: open({str(tmp_path / "handler")!r}, "w").write("ran"))
logging.basicConfig(filename={str(tmp_path / "log")!r}, level=logging.INFO)
logging.getLogger("x").info("logged")
print("printed")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout == "printed\n"
    assert (tmp_path / "handler").read_text() == "ran"
    assert "logged" in (tmp_path / "log").read_text()
