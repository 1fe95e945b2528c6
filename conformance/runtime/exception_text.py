"""The report's one-string account of the audited program's exception (``run.error``)."""
from __future__ import annotations

#: what a message holds when it carries another process's traceback: torch's DataLoader ("Caught RuntimeError in
#: DataLoader worker process 0.\nOriginal Traceback (most recent call last): ...") and ``mp.spawn``
#: ("-- Process 0 terminated with the following error:\nTraceback (most recent call last): ...")
_EMBEDDED = "Traceback (most recent call last):"


def exception_text(exc: BaseException, limit: int = 2000) -> str:
    """``"Type: message"``, at most ``limit`` characters. A message that carries another process's traceback becomes
    its first line and the exception line that traceback ends with (``"RuntimeError: Caught RuntimeError in
    DataLoader worker process 0 -> RuntimeError: Trying to resize storage that is not resizable"``): cut at ``limit``,
    the whole text kept the traceback's top frames and lost the cause. Never raises."""
    msg = str(exc)
    if _EMBEDDED in msg:
        lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
        head = "" if _EMBEDDED in lines[0] else lines[0].rstrip(":.")
        cause = next((ln for ln in reversed(lines) if not ln.startswith(("^", "~", "File "))), "")
        msg = f"{head} -> {cause}" if head and cause and _EMBEDDED not in cause else (head or cause)
    return f"{type(exc).__name__}: {msg}"[:limit]
