"""One audit at a time per report folder: an exclusive lock on ``--out``.

:func:`out_lock` creates the folder if needed and holds ``fcntl.flock(LOCK_EX)`` on the
folder itself (no lock file: nothing is added to ``--out``) for the life of the ``with`` block, so two audits started at once with the
same ``--out`` (``make -j``, the default ``./hal-audit-out``) run one after the other and never mix
results. A second audit waits up to ``wait_s`` seconds (it says so on stderr, once) and then raises
:class:`OutBusyError`. The lock dies with its process, so a killed
audit never leaves ``--out`` locked. Where ``fcntl`` is missing the lock is a no-op.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Iterator


class OutBusyError(Exception):
    """``--out`` stayed locked by another audit for longer than the wait."""


@contextlib.contextmanager
def out_lock(out_dir: str, wait_s: float = 900.0, prog: str = "hal-audit") -> Iterator[None]:
    """Hold the exclusive lock on ``out_dir`` (created if missing) for the ``with`` block."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    os.makedirs(out_dir, exist_ok=True)
    fd = os.open(out_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise OutBusyError(f"--out {out_dir} is in use by another audit for more than "
                                       f"{wait_s:g} s; use another --out") from None
                if not told:
                    sys.stderr.write(f"{prog}: waiting for --out {out_dir}: another audit is writing there\n")
                    sys.stderr.flush()
                    told = True
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # releases the lock
