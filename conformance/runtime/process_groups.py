"""The process groups an audited program destroys are freed after its code has returned, once their threads are idle.

A gloo process group's destructor joins its worker threads while the destroying thread holds the GIL. A worker
thread that is still freeing a finished collective whose tensors have Python objects waits for the GIL, so the
process hangs. Seen on torch 2.4.1 in an ``mp.spawn`` worker audited with ``--profile``, in 2 runs out of 10: the
program's ``destroy_process_group()`` came right after its last step, and the group's last reference went with the
DDP model as the worker function returned. py-spy showed the main thread in ``~Reducer -> ~ProcessGroupGloo ->
std::thread::join`` and the gloo thread in ``~AsyncWork -> ~TensorImpl -> gil_scoped_acquire``.

:func:`install` wraps ``torch.distributed.destroy_process_group``. The groups it destroys (every registered group
for ``group=None``) are added to :data:`HELD`, and then the real function runs, so the program sees a destroyed
group as before. The audit calls :func:`release` when the program's code has returned (the child, and a spawned
worker, before they compute their results). It waits :data:`SETTLE_S` for the groups' threads to finish freeing
their last collectives, then lets the groups go. A group must not outlive that point. Kept until the process
ended, a group's threads saw the peer rank's exit as an I/O error and aborted the process (SIGABRT, 1 run in 14),
and rank 0's profiler crashed parsing its events (SIGSEGV, 1 in 14). When the program initialises a process
group again, ``init_process_group`` releases the held ones first, so their store's port is free.
Not thread-safe (one install per process, from its main thread).
"""
from __future__ import annotations

import functools
import sys
import time
from typing import Any

#: the groups the program destroyed and the audit has not released yet
HELD: list = []
#: seconds :func:`release` waits before the held groups go: a gloo thread frees a collective right after it
#: completes, microseconds on an idle host; this covers a host whose threads are descheduled for a while
SETTLE_S = 0.2


def release() -> None:
    """Let the held groups go after :data:`SETTLE_S` (at once when none is held)."""
    if HELD:
        time.sleep(SETTLE_S)
        HELD.clear()


def _end_left_alive() -> None:
    """Destroy, through the patched ``destroy_process_group`` (so they are held, then released), the process groups
    the program left initialised: one the step bound stopped before its own ``destroy_process_group()``, or one that
    never calls it. Left to the process's end, their threads saw the peer rank's exit as an I/O error and aborted
    the process ("terminate called without an active exception", SIGABRT: an audited mp.spawn rank stopped after
    ``--steps 2``, torch 2.13, CI of 2026-12-06). Never raises."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a group that cannot be destroyed is left as it was
        pass


def install() -> list[tuple[Any, str, Any]]:
    """Wrap ``destroy_process_group`` and ``init_process_group`` in ``torch.distributed`` and its
    ``distributed_c10d`` module (a program may import either name). Returns the patches, for :func:`remove`;
    none where torch.distributed is not built in."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return saved
        c10d = sys.modules["torch.distributed.distributed_c10d"]
    except (ImportError, KeyError):
        return saved
    real_destroy, real_init = c10d.destroy_process_group, c10d.init_process_group

    @functools.wraps(real_destroy)
    def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        if group is None:
            try:
                HELD.extend(c10d._world.pg_map)  # every registered group (torch's private registry)
            except Exception:  # a torch without it: the default group, where there is one
                default = getattr(getattr(dist, "group", None), "WORLD", None)
                if default is not None:
                    HELD.append(default)
        else:
            HELD.append(group)
        return real_destroy(group, *args, **kwargs)

    @functools.wraps(real_init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        release()
        return real_init(*args, **kwargs)

    for owner in (dist, c10d):
        for name, real, patched in (("destroy_process_group", real_destroy, destroy_process_group),
                                    ("init_process_group", real_init, init_process_group)):
            if getattr(owner, name, None) is real:
                saved.append((owner, name, real))
                setattr(owner, name, patched)
    return saved


def remove(saved: list[tuple[Any, str, Any]]) -> None:
    """Destroy the groups the program left initialised (:func:`_end_left_alive`), undo :func:`install`'s patches, then
    :func:`release` the held groups."""
    if saved:
        _end_left_alive()
    for owner, name, value in reversed(saved):
        setattr(owner, name, value)
    release()
