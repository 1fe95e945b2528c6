"""Collectives conformance: every collective, reduce op and dtype checked exactly in N real processes.

:func:`run` spawns ``world_size`` processes on this host (or, under ``torchrun``, runs as the
current rank), each joins a :class:`hal.collectives.Communicator` on the backend's engine and runs
every case. Inputs are small integers chosen so that every result is exactly representable in
every dtype (sums and products of at most 8 ranks stay below 2^8, averages divide exactly), so
results are compared for equality, not within a tolerance. A row passes only when every rank saw
the exact expected result. Ranks that die or hang are reported, never waited on forever.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from typing import Any, Callable, Iterator, Optional

import torch

DTYPES = ("float32", "bfloat16", "float16", "int64")
#: seconds every rank gets, after all have answered, to leave its process group and exit by itself
TEARDOWN_GRACE_S = 30.0
REDUCE_OPS = ("sum", "max", "min", "avg", "product")


@dataclasses.dataclass
class Row:
    collective: str
    dtype: str
    op: str
    status: str  # pass | fail | skip
    max_error: float
    seconds: float
    detail: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@contextlib.contextmanager
def file_rendezvous() -> Iterator[str]:
    """A ``file://`` init method in a fresh private folder, removed afterwards.

    Local ranks meet through a file store, not a TCP port: a port picked free and closed can be
    taken by another process before rank 0 binds it again."""
    folder = tempfile.mkdtemp(prefix="hal-rdzv-")
    try:
        yield "file://" + os.path.join(folder, "store")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _inputs(rank: int, ws: int, case: int, n: int, op: str, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * case + rank)
    if op == "product":
        base = torch.tensor([-2, -1, 1, 2], dtype=torch.int64)[torch.randint(0, 4, (n,), generator=g)]
        if ws > 8:
            base = base.sign()
    else:
        base = torch.randint(-8, 9, (n,), generator=g)
        if op == "avg":
            base = base * ws
    return base.to(dtype)


def _expected_reduce(ws: int, case: int, n: int, op: str, dtype: torch.dtype) -> torch.Tensor:
    stack = torch.stack([_inputs(r, ws, case, n, op, torch.float64) for r in range(ws)])
    ref = {"sum": stack.sum(0), "max": stack.max(0).values, "min": stack.min(0).values,
           "avg": stack.sum(0) / ws, "product": stack.prod(0)}[op]
    return ref.to(dtype)


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        return float("inf")
    if got.numel() == 0:
        return 0.0
    return float((got.cpu().double() - want.cpu().double()).abs().max())


def _rank_cases(comm: Any, backend: Any, dtypes: tuple[str, ...], n: int) -> list[Row]:
    rank, ws = comm.rank, comm.world_size
    dev = comm.device
    rows: list[Row] = []

    def timed(fn):
        backend.synchronize(dev)
        t0 = time.perf_counter()
        out = fn()
        backend.synchronize(dev)
        return out, time.perf_counter() - t0

    case = 0
    for dname in dtypes:
        dtype = getattr(torch, dname)
        for op in REDUCE_OPS:
            case += 1
            if op.upper() in backend.unsupported_reduce_ops:
                rows.append(Row("all_reduce", dname, op, "skip", 0.0, 0.0, f"{backend.dist_backend} lacks it"))
                continue
            if op == "avg" and not dtype.is_floating_point:
                rows.append(Row("all_reduce", dname, op, "skip", 0.0, 0.0, "AVG is defined for floating dtypes"))
                continue
            x = _inputs(rank, ws, case, n, op, dtype).to(dev)
            try:
                out, sec = timed(lambda x=x, op=op: comm.all_reduce(x, op))
                e = _err(out, _expected_reduce(ws, case, n, op, dtype))
                rows.append(Row("all_reduce", dname, op, "pass" if e == 0 else "fail", e, sec))
            except Exception as exc:
                rows.append(Row("all_reduce", dname, op, "fail", float("inf"), 0.0, f"{type(exc).__name__}: {exc}"))
        # all_gather
        case += 1
        x = _inputs(rank, ws, case, n, "sum", dtype).to(dev)
        want = torch.stack([_inputs(r, ws, case, n, "sum", dtype) for r in range(ws)])
        rows.append(_check(lambda x=x: comm.all_gather(x), want, timed, "all_gather", dname, "-"))
        # reduce_scatter (sum): dim 0 of ws * n
        case += 1
        x = _inputs(rank, ws, case, ws * n, "sum", dtype).to(dev)
        want = _expected_reduce(ws, case, ws * n, "sum", dtype).chunk(ws)[rank]
        rows.append(_check(lambda x=x: comm.reduce_scatter(x, "sum"), want, timed, "reduce_scatter", dname, "sum"))
        # broadcast from the last rank
        case += 1
        src = ws - 1
        x = _inputs(rank, ws, case, n, "sum", dtype).to(dev)
        want = _inputs(src, ws, case, n, "sum", dtype)
        rows.append(_check(lambda x=x, src=src: comm.broadcast(x, src), want, timed, "broadcast", dname, f"src={src}"))
        # all_to_all: rank r sends chunk j to rank j
        case += 1
        x = _inputs(rank, ws, case, ws * n, "sum", dtype).to(dev)
        want = torch.cat([_inputs(r, ws, case, ws * n, "sum", dtype).chunk(ws)[rank] for r in range(ws)])
        rows.append(_check(lambda x=x: comm.all_to_all(x), want, timed, "all_to_all", dname, "-"))
    try:
        _, sec = timed(comm.barrier)
        rows.append(Row("barrier", "-", "-", "pass", 0.0, sec))
    except Exception as exc:
        rows.append(Row("barrier", "-", "-", "fail", float("inf"), 0.0, f"{type(exc).__name__}: {exc}"))
    if comm.emulated:
        for r in rows:
            key = "all_reduce.AVG" if (r.collective == "all_reduce" and r.op == "avg") else r.collective
            if key in comm.emulated:
                r.detail = (r.detail + "; " if r.detail else "") + "emulated from all_reduce (engine lacks it)"
    return rows


def _check(fn, want, timed, coll, dname, op) -> Row:
    try:
        out, sec = timed(fn)
        e = _err(out, want)
        return Row(coll, dname, op, "pass" if e == 0 else "fail", e, sec)
    except Exception as exc:
        return Row(coll, dname, op, "fail", float("inf"), 0.0, f"{type(exc).__name__}: {exc}")


def run_rank(device: str, rank: int, world_size: int, init_method: Optional[str], timeout_s: float,
             dtypes: tuple[str, ...] = DTYPES, n: int = 64,
             report: Optional[Callable[[list[Row]], None]] = None) -> list[Row]:
    """Run every case as ``rank``; returns this rank's rows. Raises on rendezvous failure.

    ``report`` (if given) receives the rows before the communicator is torn down, so that a
    teardown that hangs or crashes can never lose the results."""
    from hal.collectives import Communicator
    from hal.discovery import get_backend
    backend = get_backend(device)
    comm = Communicator.init(backend, rank=rank, world_size=world_size, init_method=init_method,
                             timeout_s=timeout_s)
    try:
        rows = _rank_cases(comm, backend, dtypes, n)
        if report is not None:
            report(rows)
        return rows
    finally:
        comm.close()


def _worker(device, rank, ws, init_method, timeout_s, dtypes, queue):  # pragma: no cover - child process
    reported = False

    def report(rows: list[Row]) -> None:
        nonlocal reported
        queue.put((rank, [r.as_dict() for r in rows], None))
        reported = True

    try:
        run_rank(device, rank, ws, init_method, timeout_s, dtypes, report=report)
    except BaseException as exc:
        if not reported:
            queue.put((rank, None, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))


def merge(per_rank: dict[int, list[dict]]) -> list[Row]:
    """Combine every rank's rows: a case passes only when it passed on every rank."""
    merged: list[Row] = []
    ranks = sorted(per_rank)
    for i, first in enumerate(per_rank[ranks[0]]):
        row = Row(**first)
        for r in ranks[1:]:
            other = Row(**per_rank[r][i])
            row.max_error = max(row.max_error, other.max_error)
            row.seconds = max(row.seconds, other.seconds)
            if other.status == "fail" and row.status != "fail":
                row.status = "fail"
                row.detail = f"rank {r}: {other.detail}"
        merged.append(row)
    return merged


def run(device: str, world_size: int, timeout_s: float = 120.0, dtypes: tuple[str, ...] = DTYPES) -> list[Row]:
    """Spawn ``world_size`` local processes and return the merged rows.

    Under torchrun (``$RANK``/``$WORLD_SIZE`` set), runs only the current rank instead and returns
    its own rows. A rank that fails to start, raises or does not answer within ``timeout_s`` x 2
    yields one failing row naming it. Raises ValueError when ``timeout_s`` is not a finite positive
    number or ``dtypes`` is empty (the CLI reports both as exit 2 before calling this)."""
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, not {timeout_s!r}")
    if not dtypes:
        raise ValueError("dtypes must name at least one dtype")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return run_rank(device, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, timeout_s, dtypes)
    with file_rendezvous() as init_method:
        return _spawn(device, world_size, timeout_s, dtypes, init_method)


def _spawn(device: str, world_size: int, timeout_s: float, dtypes: tuple[str, ...], init_method: str) -> list[Row]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(device, r, world_size, init_method, timeout_s, dtypes, queue),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, list[dict]] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + 2 * timeout_s + 60
    while len(results) + len(errors) < world_size and time.monotonic() < deadline:
        try:
            rank, rows, err = queue.get(timeout=1.0)
        except Exception:
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
            continue
        if err is None:
            results[rank] = rows
        else:
            errors[rank] = err
    # Every rank answered (or the deadline passed): each must now leave its process group and exit
    # by itself. One that does not is killed and reported, since a real program would hang there too.
    exit_deadline = time.monotonic() + TEARDOWN_GRACE_S
    stuck = []
    for r, p in enumerate(procs):
        p.join(timeout=max(0.0, exit_deadline - time.monotonic()))
        if p.is_alive():
            stuck.append(r)
            p.kill()
            p.join()
    missing = [r for r in range(world_size) if r not in results and r not in errors]
    if errors or missing:
        why = "; ".join([f"rank {r}: {e.splitlines()[0]}" for r, e in sorted(errors.items())]
                        + [f"rank {r}: no answer (exit code {procs[r].exitcode})" for r in missing])
        return [Row("setup", "-", "-", "fail", float("inf"), 0.0, why)]
    rows = merge(results)
    answered_stuck = [r for r in stuck if r in results]
    rows.append(Row("teardown", "-", "-", "fail" if answered_stuck else "pass", 0.0, 0.0,
                    f"rank(s) {answered_stuck} did not exit within {TEARDOWN_GRACE_S:g} s after answering "
                    "(killed)" if answered_stuck else ""))
    return rows
