"""Collectives on ``torch.distributed``, with the device backend's own engine (gloo, NCCL, CNCL).

A :class:`Communicator` owns one process group. Create it with :meth:`Communicator.init` in every
rank (``torchrun`` sets the ``env://`` variables; tests pass ``init_method`` and ranks). Every
collective works on torch tensors on the backend's device, in place where torch's API is in place,
and maps failures to typed errors: :class:`~hal.errors.CollectiveTimeoutError` when a peer never
arrives within ``timeout``, :class:`~hal.errors.CollectiveError` otherwise, and
:class:`~hal.errors.NotSupportedError` *before any call* for a reduce op the engine lacks.

Where an older torch's engine lacks a collective (``AVG`` or ``reduce_scatter`` on gloo in
torch 2.4), the communicator computes it from ``all_reduce`` and records that in
``emulated`` so reports can say so. Not thread-safe: one thread issues a rank's collectives.

Teardown: the communicator keeps a Python reference to the tensors of its last few collectives until
:meth:`close` has destroyed the process group. Without that, gloo (torch 2.4/2.5) can deadlock at
teardown: its worker thread drops the last reference to a finished op's tensor, whose Python object
then needs the GIL to be freed, while the main thread holds the GIL inside the process group's
destructor, joining that very worker thread.
"""
from __future__ import annotations

import collections
import datetime
import enum
import os
from typing import Any, Callable, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist

from hal.backend import Backend
from hal.errors import CollectiveError, CollectiveTimeoutError, NotSupportedError

T = TypeVar("T")

# torch >= 2.12 renamed the flat-tensor collectives; older torch (2.4) has only the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class ReduceOp(str, enum.Enum):
    """Reduce operations, named as ``torch.distributed.ReduceOp`` members."""

    SUM = "SUM"
    PRODUCT = "PRODUCT"
    MIN = "MIN"
    MAX = "MAX"
    AVG = "AVG"
    BAND = "BAND"
    BOR = "BOR"
    BXOR = "BXOR"
    PREMUL_SUM = "PREMUL_SUM"

    @classmethod
    def parse(cls, op: "ReduceOp | str") -> "ReduceOp":
        try:
            return op if isinstance(op, ReduceOp) else cls(str(op).upper())
        except ValueError:
            raise ValueError(f"unknown reduce op {op!r}; one of {', '.join(m.value for m in cls)}") from None


#: how many recent collectives' tensors stay referenced until close(): an engine's worker thread can
#: hold a finished op only until the next one or two ops are queued (gloo's barrier keeps prior work)
_ENGINE_REFS_KEPT = 8

_TIMEOUT_MARKERS = ("timed out", "timeout", "deadline exceeded")
# What engines say when they lack a reduce op or collective (compared lower-case). gloo on torch 2.4
# says "Cannot use ReduceOp.AVG with Gloo"; other releases and engines say "... not supported".
_UNSUPPORTED_MARKERS = ("does not support", "not supported", "unsupported", "cannot use")


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(m in text for m in _TIMEOUT_MARKERS)


def _is_unsupported(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(m in text for m in _UNSUPPORTED_MARKERS)


class Communicator:
    """A process group of ``world_size`` ranks on one backend. See the module docstring."""

    def __init__(self, backend: Backend, group: Any, timeout_s: float, device: torch.device):
        self.backend = backend
        self.group = group
        self.timeout_s = timeout_s
        self.device = device
        self.emulated: set[str] = set()
        # tensors handed to the engine by the last collectives (see the module docstring, Teardown)
        self._engine_refs: collections.deque = collections.deque(maxlen=_ENGINE_REFS_KEPT)

    # ---- life cycle ---------------------------------------------------------------------------
    @classmethod
    def init(cls, backend: Optional[Backend] = None, *, rank: Optional[int] = None,
             world_size: Optional[int] = None, init_method: Optional[str] = None,
             timeout_s: float = 300.0, device_index: Optional[int] = None) -> "Communicator":
        """Join (or create) the default process group with ``backend.dist_backend``.

        ``rank``/``world_size`` default to ``$RANK``/``$WORLD_SIZE`` (torchrun); ``init_method``
        to ``env://``. The device is ``device_index`` or ``$LOCAL_RANK`` (0 when unset).
        Raises CollectiveTimeoutError when the other ranks do not join within ``timeout_s``.
        """
        if backend is None:
            from hal.discovery import get_backend
            backend = get_backend()
        rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        local = int(os.environ.get("LOCAL_RANK", rank if device_index is None else device_index))
        index = local if device_index is None else device_index
        if backend.device_type != "cpu":
            backend.set_device(index)
        device = backend.torch_device(index if backend.device_type != "cpu" else None)
        timeout = datetime.timedelta(seconds=timeout_s)
        kwargs: dict[str, Any] = {"backend": backend.dist_backend, "rank": rank,
                                  "world_size": world_size, "timeout": timeout,
                                  "init_method": init_method or "env://"}
        if backend.device_type != "cpu":
            kwargs["device_id"] = device
        if dist.is_initialized():
            return cls(backend, dist.group.WORLD, timeout_s, device)
        try:
            dist.init_process_group(**kwargs)
        except TypeError:  # torch without device_id
            kwargs.pop("device_id", None)
            dist.init_process_group(**kwargs)
        except Exception as exc:
            if _is_timeout(exc):
                raise CollectiveTimeoutError("rendezvous", timeout_s, str(exc).splitlines()[0]) from exc
            raise CollectiveError(f"init_process_group({backend.dist_backend}) failed: {exc}") from exc
        return cls(backend, dist.group.WORLD, timeout_s, device)

    def close(self) -> None:
        """Leave the process group (idempotent).

        The group is destroyed and dropped first; only then are the tensors of the last collectives
        released, on this thread (see the module docstring, Teardown)."""
        if dist.is_initialized():
            dist.destroy_process_group()
        self.group = None
        self._engine_refs.clear()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    # ---- helpers ------------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T], *tensors: torch.Tensor) -> T:
        """Run one collective; ``tensors`` are those handed to the engine, kept until :meth:`close`."""
        self._engine_refs.append(tensors)
        try:
            return fn()
        except NotSupportedError:
            raise
        except Exception as exc:
            if _is_timeout(exc):
                raise CollectiveTimeoutError(what, self.timeout_s, str(exc).splitlines()[0]) from exc
            raise CollectiveError(f"{what} failed: {exc}") from exc

    def _torch_op(self, op: ReduceOp) -> Any:
        self.backend.check_reduce_op(op.value)
        return getattr(dist.ReduceOp, op.value)

    # ---- collectives --------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: "ReduceOp | str" = ReduceOp.SUM) -> torch.Tensor:
        """Reduce ``tensor`` across ranks in place; returns it."""
        rop = ReduceOp.parse(op)
        top = self._torch_op(rop)

        def emulate_avg() -> torch.Tensor:
            self.emulated.add("all_reduce.AVG")
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
            return tensor.div_(self.world_size)

        def run() -> torch.Tensor:
            if rop is ReduceOp.AVG and "all_reduce.AVG" in self.emulated:
                return emulate_avg()
            try:
                dist.all_reduce(tensor, op=top, group=self.group)
            except Exception as exc:
                # the engine refuses AVG locally, before any communication, on every rank alike
                if rop is not ReduceOp.AVG or not _is_unsupported(exc):
                    raise
                return emulate_avg()
            return tensor

        return self._call(f"all_reduce({rop.value})", run, tensor)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` stacked along a new dim 0: shape ``[world_size, *tensor.shape]``."""
        out = torch.empty((self.world_size * tensor.numel(),), dtype=tensor.dtype, device=tensor.device)
        flat = tensor.contiguous().view(-1)

        def run() -> torch.Tensor:
            _all_gather_flat(out, flat, group=self.group)
            return out.view(self.world_size, *tensor.shape)

        return self._call("all_gather", run, out, flat)

    def reduce_scatter(self, tensor: torch.Tensor, op: "ReduceOp | str" = ReduceOp.SUM) -> torch.Tensor:
        """Reduce ``tensor`` across ranks and return this rank's 1/world_size slice of dim 0.

        ``tensor.shape[0]`` must be divisible by ``world_size`` (ValueError otherwise)."""
        rop = ReduceOp.parse(op)
        top = self._torch_op(rop)
        ws = self.world_size
        if tensor.shape[0] % ws:
            raise ValueError(f"reduce_scatter: dim 0 ({tensor.shape[0]}) is not divisible by {ws}")
        out = torch.empty((tensor.shape[0] // ws, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        src = tensor.contiguous()

        def run() -> torch.Tensor:
            if "reduce_scatter" not in self.emulated:
                try:
                    _reduce_scatter_flat(out, src, op=top, group=self.group)
                    return out
                except Exception as exc:
                    if not _is_unsupported(exc):
                        raise
            self.emulated.add("reduce_scatter")
            full = tensor.clone()
            self.all_reduce(full, rop)
            return full.chunk(ws)[self.rank].clone()

        return self._call(f"reduce_scatter({rop.value})", run, out, src)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Copy rank ``src``'s ``tensor`` into every rank's ``tensor``; returns it."""
        return self._call("broadcast", lambda: (dist.broadcast(tensor, src, group=self.group), tensor)[1], tensor)

    def all_to_all(self, tensor: torch.Tensor, output_splits: Optional[Sequence[int]] = None,
                   input_splits: Optional[Sequence[int]] = None) -> torch.Tensor:
        """Scatter dim-0 slices of ``tensor`` to the ranks and gather theirs (``all_to_all_single``).

        With no splits, dim 0 is divided equally. Returns the received tensor."""
        rows = sum(output_splits) if output_splits is not None else tensor.shape[0]
        out = torch.empty((rows, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        src = tensor.contiguous()

        def run() -> torch.Tensor:
            dist.all_to_all_single(out, src,
                                   list(output_splits) if output_splits is not None else None,
                                   list(input_splits) if input_splits is not None else None,
                                   group=self.group)
            return out

        return self._call("all_to_all", run, out, src)

    def barrier(self) -> None:
        """Block until every rank reaches the barrier (bounded by the timeout)."""
        token = None if self.backend.device_type == "cpu" else torch.zeros(1, device=self.device)

        def run() -> None:
            if token is None:
                dist.barrier(group=self.group)
            else:  # a tiny all_reduce is a barrier on every engine, with the engine's timeout
                dist.all_reduce(token, group=self.group)
                self.backend.synchronize(self.device)
        self._call("barrier", run, *(() if token is None else (token,)))
