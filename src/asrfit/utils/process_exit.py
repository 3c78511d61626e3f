"""Ending one of several torchrun processes without an abort at interpreter shutdown.

A gloo process group runs its collectives on C++ worker threads that outlive
``destroy_process_group``. After a collective completes, its worker thread drops the work,
and with it the tensors the collective used; when Python already holds no other reference,
freeing them needs the GIL. If the main thread has meanwhile returned and the interpreter
is finalizing, the worker thread cannot take the GIL, Python ends the thread, and the
C++ runtime aborts the process ("terminate called without an active exception", SIGABRT),
so torchrun reports a finished run as failed. Read from core dumps of the preemption
test's workers: the aborting thread was in ``ProcessGroupGloo::runLoop`` destroying an
``AsyncBroadcastWork`` while the main thread was in ``Py_FinalizeEx``; about 1 run in 20.

:func:`exit_process` leaves such a process without finalizing the interpreter: it flushes
the standard streams and logging, then calls :func:`os._exit`. A single process exits as
usual (``SystemExit``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def is_distributed_process() -> bool:
    """Whether this process is one of several started by torchrun or Accelerate
    (``WORLD_SIZE`` above 1)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def exit_status(code: object) -> int:
    """The exit status ``sys.exit(code)`` would give: None is 0, an int itself, anything
    else 1 (after Python prints it to stderr, as :func:`exit_process` does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def exit_process(code: object = 0) -> NoReturn:
    """Exit with ``code`` as ``sys.exit`` would; in one of several processes, without
    finalizing the interpreter (the module docstring says why).

    Call it last: ``atexit`` handlers and finalizers do not run in a distributed process, so
    close files, writers and process groups before (the trainer's ``end_training``).
    """
    if not is_distributed_process():
        sys.exit(code)
    status = exit_status(code)
    try:
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status & 0xFF)
