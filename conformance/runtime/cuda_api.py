"""Stand-ins for torch.cuda's public API, derived from the running torch's ``torch.cuda.__all__``.

Contract: every name in ``torch.cuda.__all__`` of the running torch is in exactly one of

- :data:`STAND_INS` (the audit replaces it: functions answer like a one-GPU machine without doing
  device work; classes stay classes and subclass what torch checks against; context managers stay
  context managers),
- :data:`LEFT_AS_IS` (works without a GPU as it is: exception classes, constants, namespaces whose
  members are covered through their ``torch.cuda`` names), or
- :data:`UNSUPPORTED` (deliberately not redirected; the value says why).

``tests/test_runtime_cuda_api.py`` enumerates ``torch.cuda.__all__`` and fails on a name in none of
them. :func:`install` patches ``torch.cuda`` (and each ``torch.cuda`` submodule that holds the same
object) through a :class:`~.redirect.DeviceRedirect`, which restores everything on ``remove()``.

Stream and Event stand-ins subclass :func:`stream_bases` / :func:`event_bases`: ``torch.Stream`` /
``torch.Event`` plus, where torch still has them as separate classes (torch 2.4, 2.5),
``torch._streambase._StreamBase`` / ``_EventBase``, which ``torch._dynamo``'s ``DeviceInterfaceMeta``
asserts on when any optimizer is built. A stand-in records a ``runtime-redirect-cuda-api`` finding
only when the program itself called it (not when torch's own code did, e.g. ``torch.manual_seed``
calling ``torch.cuda.manual_seed_all``).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import os
from typing import Any, Callable

import torch

# -- what torch checks against ------------------------------------------------------------------


def _bases(kind: str) -> tuple[type, ...]:
    bases: list[type] = []
    top = getattr(torch, kind, None)
    if isinstance(top, type):
        bases.append(top)
    try:
        from torch import _streambase
        old = getattr(_streambase, f"_{kind}Base", None)
    except ImportError:
        old = None
    if isinstance(old, type) and not any(issubclass(old, b) or issubclass(b, old) for b in bases):
        bases.append(old)
    return tuple(bases) or (object,)


def stream_bases() -> tuple[type, ...]:
    """The classes a CUDA Stream must subclass on this torch (``torch.Stream``; ``_StreamBase`` on 2.4/2.5)."""
    return _bases("Stream")


def event_bases() -> tuple[type, ...]:
    """The classes a CUDA Event must subclass on this torch (``torch.Event``; ``_EventBase`` on 2.4/2.5)."""
    return _bases("Event")


def _host_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


#: Attributes of a device-properties object and the values the stand-in answers (an sm_80-like GPU
#: with the host's memory); every attribute of torch's own ``_CudaDeviceProperties`` that is
#: missing here is answered with 0 (see :func:`device_properties`).
PROPERTIES = {
    "name": "audit-redirect (no CUDA device)", "major": 8, "minor": 0, "total_memory": None,
    "multi_processor_count": 1, "is_integrated": False, "is_multi_gpu_board": False, "uuid": "",
    "gcnArchName": "", "warp_size": 32, "max_threads_per_multi_processor": 2048,
    "max_threads_per_block": 1024, "regs_per_multiprocessor": 65536, "shared_memory_per_block": 49152,
    "shared_memory_per_block_optin": 166912, "shared_memory_per_multiprocessor": 167936,
    "L2_cache_size": 40 * 2**20, "clock_rate": 0, "memory_clock_rate": 0, "memory_bus_width": 0,
    "pci_bus_id": 0, "pci_device_id": 0, "pci_domain_id": 0,
}


class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` answers during the audit (see :data:`PROPERTIES`)."""

    def __init__(self) -> None:
        real = getattr(torch._C, "_CudaDeviceProperties", None)
        for name in dir(real) if real is not None else ():
            if not name.startswith("_"):
                setattr(self, name, 0)
        for name, value in PROPERTIES.items():
            setattr(self, name, _host_memory() if name == "total_memory" else value)

    def __repr__(self) -> str:
        return f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, " \
               f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count})"


# -- the table ------------------------------------------------------------------------------------
# Each stand-in maker takes the redirect and returns the object that replaces torch.cuda.<name>.

def _const(value: Any) -> Callable[[Any, str], Any]:
    """A function that records the call and returns ``value`` (called when it is a factory)."""
    def make(redirect: Any, name: str) -> Any:
        def stand_in(*_a: Any, **_k: Any) -> Any:
            redirect.api_call(name)
            return value() if callable(value) else value
        stand_in.__name__ = stand_in.__qualname__ = name
        return stand_in
    return make


def _index_of(device: Any) -> int:
    """The device index of ``device`` (an int, ``"cuda:1"``, a ``torch.device``; no index: 0)."""
    if isinstance(device, int):
        return device
    try:
        return torch.device(device).index or 0
    except (RuntimeError, TypeError, ValueError):
        return 0


def _devices(answer: str, **rule: str) -> Callable[[Any, str], Any]:
    """A stand-in that answers from the redirect's devices (``--devices``): ``"count"`` how many there are,
    ``"current"`` the index the program set last (0 at first), ``"set"`` sets it (no range check: every index is the
    run device). ``rule``: :meth:`api_call`'s, for a ``torch.accelerator`` name."""
    def make(redirect: Any, name: str) -> Any:
        def stand_in(*a: Any, **k: Any) -> Any:
            redirect.api_call(name, **rule)
            if answer == "count":
                return redirect.devices
            if answer == "current":
                return redirect.current_index
            device = a[0] if a else k.get("device", k.get("idx", 0))
            redirect.current_index = _index_of(device)
            return None
        stand_in.__name__ = stand_in.__qualname__ = name
        return stand_in
    return make


def _ctx(redirect: Any, name: str) -> Any:
    def stand_in(*_a: Any, **_k: Any) -> Any:
        redirect.api_call(name)
        return contextlib.nullcontext()
    stand_in.__name__ = name
    return stand_in


def _stream_class(redirect: Any, name: str) -> type:
    def __new__(cls: type, *_a: Any, **_k: Any) -> Any:
        base = cls.__mro__[1]
        if base is object:
            return object.__new__(cls)
        return super(ns["cls"], cls).__new__(cls, device="cpu")  # type: ignore[misc]

    def __init__(self: Any, *_a: Any, **_k: Any) -> None:
        redirect.api_call(name)

    body = {"__new__": __new__, "__init__": __init__, "__module__": "torch.cuda",
            "__doc__": f"Audit stand-in for torch.cuda.{name}: a host-order (CPU) {name.lower()}.",
            "synchronize": lambda self: None, "query": lambda self: True,
            "wait_stream": lambda self, stream=None: None, "wait_event": lambda self, event=None: None,
            "record_event": lambda self, event=None: event if event is not None else _EVENT[0](),
            "record": lambda self, stream=None: None, "wait": lambda self, stream=None: None,
            "elapsed_time": lambda self, end_event=None: 0.0, "ipc_handle": lambda self: b"",
            "cuda_stream": 0, "cuda_event": 0, "priority": 0,
            "__enter__": lambda self: self, "__exit__": lambda self, *exc: None,
            "__eq__": lambda self, other: self is other, "__hash__": object.__hash__}
    bases = event_bases() if name == "Event" else stream_bases()
    ns: dict = {}
    cls = type(name, bases, body)
    ns["cls"] = cls
    return cls


_STREAM: list = [None]  # the current redirect's Stream stand-in class (for current_stream and friends)
_EVENT: list = [None]


def _stream_instance(redirect: Any, name: str) -> Any:
    def stand_in(*_a: Any, **_k: Any) -> Any:
        redirect.api_call(name)
        with redirect.quiet():
            return _STREAM[0]()
    stand_in.__name__ = name
    return stand_in


def _external_stream(redirect: Any, name: str) -> type:
    return type("ExternalStream", (_STREAM[0],), {"__module__": "torch.cuda"})


def _device_class(redirect: Any, name: str) -> type:
    real = torch.cuda.device if name == "device" else getattr(torch.cuda, name)

    def __init__(self: Any, device: Any = None, *_a: Any, **_k: Any) -> None:
        redirect.api_call(name)
        self.idx, self.prev_idx = 0, 0

    return type(name, (real,), {"__init__": __init__, "__enter__": lambda self: None,
                                "__exit__": lambda self, *exc: False, "__module__": "torch.cuda"})


def _stream_context(redirect: Any, name: str) -> type:
    real = torch.cuda.StreamContext

    def __init__(self: Any, stream: Any = None) -> None:
        redirect.api_call(name)
        self.stream, self.idx = stream, 0

    return type("StreamContext", (real,), {"__init__": __init__, "__enter__": lambda self: self.stream,
                                           "__exit__": lambda self, *exc: None, "__module__": "torch.cuda"})


def _stream_fn(redirect: Any, name: str) -> Any:
    def stream(stream: Any = None) -> Any:
        redirect.api_call(name)
        return contextlib.nullcontext(stream)
    return stream


def _cuda_graph_class(redirect: Any, name: str) -> type:
    class CUDAGraph:
        """Audit stand-in for torch.cuda.CUDAGraph: capture runs the work eagerly on the present
        device; replay() does not re-run it (recorded as a finding)."""

        def __init__(self, *_a: Any, **_k: Any) -> None:
            redirect.api_call(name)
            redirect.record("runtime-redirect-cuda-graph")

        def capture_begin(self, *_a: Any, **_k: Any) -> None:
            pass

        def capture_end(self) -> None:
            pass

        def replay(self) -> None:
            redirect.record("runtime-redirect-cuda-graph")

        def reset(self) -> None:
            pass

        def pool(self) -> tuple:
            return (0, 0)

        def enable_debug_mode(self) -> None:
            pass

        def debug_dump(self, *_a: Any) -> None:
            pass

    # every other public method of the running torch's CUDAGraph (hook registration, raw handles,
    # get_graph_data) is a no-op: nothing is captured, so no hook ever runs
    real = getattr(torch.cuda, "CUDAGraph", None)
    for attr in dir(real) if isinstance(real, type) else ():
        if not attr.startswith("_") and not hasattr(CUDAGraph, attr) and callable(getattr(real, attr, None)):
            setattr(CUDAGraph, attr, lambda self, *_a, **_k: None)
    CUDAGraph.__module__ = "torch.cuda"
    return CUDAGraph


def _graph_ctx(redirect: Any, name: str) -> type:
    class graph:
        """Audit stand-in for torch.cuda.graph: the captured block runs eagerly, once."""

        def __init__(self, cuda_graph: Any = None, pool: Any = None, stream: Any = None, **_k: Any) -> None:
            redirect.api_call(name)
            self.cuda_graph = cuda_graph

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: Any) -> bool:
            return False

    graph.__module__ = "torch.cuda"
    return graph


def _graphed_callables(redirect: Any, name: str) -> Any:
    def make_graphed_callables(callables: Any, *_a: Any, **_k: Any) -> Any:
        redirect.api_call(name)
        redirect.record("runtime-redirect-cuda-graph")
        return callables
    return make_graphed_callables


def _seed(redirect: Any, name: str) -> Any:
    def seed(*_a: Any, **_k: Any) -> None:
        redirect.api_call(name)  # CUDA generators only: there is nothing to seed
    seed.__name__ = name
    return seed


def _is_available(redirect: Any, name: str) -> Any:
    def is_available() -> bool:
        if redirect.called_by_program():
            redirect.record("runtime-redirect-cuda-available")
        return True
    return is_available


_ZERO, _NONE = _const(0), _const(None)

#: name -> maker(redirect, name) of what replaces ``torch.cuda.<name>`` during the audit.
STAND_INS: dict[str, Callable[[Any, str], Any]] = {
    "is_available": _is_available, "is_initialized": _const(True), "init": _NONE,
    "device_count": _devices("count"), "current_device": _devices("current"), "set_device": _devices("set"),
    "synchronize": _NONE,
    "get_device_name": _const("audit-redirect"), "get_device_capability": _const((8, 0)),
    "get_device_properties": _const(DeviceProperties), "get_arch_list": _const(list),
    "get_gencode_flags": _const(""), "is_bf16_supported": _const(True), "is_tf32_supported": _const(False),
    "can_device_access_peer": _const(False), "check_error": _NONE, "current_blas_handle": _ZERO,
    "current_solver_handle": _ZERO, "clock_rate": _ZERO, "temperature": _ZERO, "power_draw": _ZERO,
    "utilization": _ZERO, "memory_usage": _ZERO, "device_memory_used": _ZERO,
    "list_gpu_processes": _const(""), "ipc_collect": _NONE, "empty_cache": _NONE,
    "is_current_stream_capturing": _const(False), "get_sync_debug_mode": _ZERO, "set_sync_debug_mode": _NONE,
    # memory
    "memory_allocated": _ZERO, "max_memory_allocated": _ZERO, "memory_reserved": _ZERO,
    "max_memory_reserved": _ZERO, "memory_cached": _ZERO, "max_memory_cached": _ZERO,
    "mem_get_info": _const(lambda: (_host_memory(), _host_memory())), "memory_stats": _const(dict),
    "memory_stats_as_nested_dict": _const(dict), "memory_summary": _const(""), "memory_snapshot": _const(list),
    "host_memory_stats": _const(dict), "host_memory_stats_as_nested_dict": _const(dict),
    "reset_peak_memory_stats": _NONE, "reset_max_memory_allocated": _NONE, "reset_max_memory_cached": _NONE,
    "reset_accumulated_memory_stats": _NONE, "reset_accumulated_host_memory_stats": _NONE,
    "reset_peak_host_memory_stats": _NONE, "set_per_process_memory_fraction": _NONE,
    "get_per_process_memory_fraction": _const(1.0), "get_allocator_backend": _const("native"),
    "caching_allocator_enable": _NONE, "caching_allocator_disabled": _ctx, "use_mem_pool": _ctx,
    # random
    "manual_seed": _seed, "manual_seed_all": _seed, "seed": _seed, "seed_all": _seed,
    "initial_seed": _const(lambda: torch.initial_seed()), "get_rng_state": _const(lambda: torch.get_rng_state()),
    "get_rng_state_all": _const(lambda: [torch.get_rng_state()]), "set_rng_state": _NONE,
    "set_rng_state_all": _NONE,
    # streams, events, devices (classes stay classes)
    "Stream": _stream_class, "Event": _stream_class, "ExternalStream": _external_stream,
    "current_stream": _stream_instance, "default_stream": _stream_instance,
    "get_stream_from_external": _stream_instance, "set_stream": _NONE, "stream": _stream_fn,
    "StreamContext": _stream_context, "device": _device_class, "device_of": _device_class,
    # graphs: run eagerly
    "CUDAGraph": _cuda_graph_class, "graph": _graph_ctx, "graph_pool_handle": _const((0, 0)),
    "make_graphed_callables": _graphed_callables,
}

#: name -> why it works unchanged without a GPU.
LEFT_AS_IS: dict[str, str] = {
    "CudaError": "an exception class: catching it works without a GPU",
    "DeferredCudaCallError": "an exception class: catching it works without a GPU",
    "cudaStatus": "a class of integer constants",
    "has_half": "a boolean build constant", "has_magma": "a boolean build constant",
    "default_generators": "a tuple (empty without CUDA); manual_seed and friends are redirected",
    "amp": "namespace: autocast and GradScaler are redirected (DeviceRedirect._install_amp)",
    "nvtx": "namespace: range_push/range_pop/mark/range are redirected (DeviceRedirect.install)",
    "graphs": "namespace: CUDAGraph, graph and make_graphed_callables are redirected by their torch.cuda names",
    "memory": "namespace: its functions are redirected by their torch.cuda names (same objects)",
    "random": "namespace: its functions are redirected by their torch.cuda names (same objects)",
    "streams": "namespace: Stream, Event and ExternalStream are redirected by their torch.cuda names",
    "sparse": "namespace of CUDA sparse helpers: nothing device-specific is called at import",
    "tunable": "namespace: TunableOp settings are plain switches (no device work)",
    "profiler": "namespace: start()/stop() drive the CUDA profiler; use torch.profiler",
    "graph_annotations": "namespace (torch >= 2.14): mark_kernels is a no-op outside a CUDA graph capture, and "
                         "the CUDAGraph stand-in never captures",
    "export_dot": "returns a CUDAGraph capture-end hook (torch >= 2.14); making it does no device work and the "
                  "CUDAGraph stand-in accepts and never runs hooks",
    "export_graph_data": "returns a CUDAGraph post-instantiate hook (torch >= 2.14); making it does no device work "
                         "and the CUDAGraph stand-in accepts and never runs hooks",
}

#: name -> why the audit deliberately does not redirect it (a call fails as it would without CUDA).
UNSUPPORTED: dict[str, str] = {
    **{f"{t}{kind}": "legacy typed CUDA tensor/storage classes (torch.cuda.FloatTensor): no CPU class can "
                     "stand in for them in isinstance/type(); use dtype= and device="
       for t in ("BFloat16", "Bool", "Byte", "Char", "ComplexDouble", "ComplexFloat", "Double", "Float",
                 "Half", "Int", "Long", "Short") for kind in ("Tensor", "Storage")},
    "CUDAPluggableAllocator": "loads a CUDA allocator from a shared library",
    "change_current_allocator": "replaces the CUDA caching allocator (no CUDA allocator here)",
    "caching_allocator_alloc": "returns a raw CUDA device pointer",
    "caching_allocator_delete": "frees a raw CUDA device pointer",
    "MemPool": "a CUDA caching-allocator pool object (no CUDA allocator here)",
    "MemPoolContext": "a CUDA caching-allocator pool object (no CUDA allocator here)",
    "GreenContext": "partitions a GPU's SMs (no GPU here)",
    "cudart": "returns the CUDA runtime library binding",
    "jiterator": "compiles CUDA C++ kernels at run time",
    "nccl": "the NCCL bindings; init_process_group('nccl') is redirected to gloo instead",
}


def classify(name: str) -> str:
    """``"stand-in"``, ``"left-as-is"``, ``"unsupported"`` or ``"unknown"`` for a torch.cuda name."""
    if name in STAND_INS:
        return "stand-in"
    if name in LEFT_AS_IS:
        return "left-as-is"
    if name in UNSUPPORTED:
        return "unsupported"
    return "unknown"


# Names whose stand-in depends on another one (built first).
_ORDER = ("Event", "Stream")


def install(redirect: Any) -> dict[str, Any]:
    """Replace every :data:`STAND_INS` name the running torch.cuda has; return ``{name: stand-in}``.

    Patches go through ``redirect._patch`` (undone by ``redirect.remove()``). A torch.cuda
    submodule attribute that is the very object being replaced is replaced too."""
    cuda = torch.cuda
    submodules = [getattr(cuda, m, None) for m in ("memory", "random", "streams", "graphs", "_utils")]
    submodules = [m for m in submodules if m is not None]
    made: dict[str, Any] = {}
    names = [n for n in _ORDER if hasattr(cuda, n)] + sorted(n for n in STAND_INS if n not in _ORDER)
    for name in names:
        if not hasattr(cuda, name):
            continue
        original = getattr(cuda, name)
        value = STAND_INS[name](redirect, name)
        if inspect.isfunction(value) and callable(original):
            # torch's own code introspects some of these (torch 2.14's dynamo reads
            # torch.cuda.use_mem_pool.__wrapped__ when it is first imported): look like the original
            functools.update_wrapper(value, original)
        if name == "Event":
            _EVENT[0] = value
        elif name == "Stream":
            _STREAM[0] = value
        made[name] = value
        redirect._patch(cuda, name, value)
        for mod in submodules:
            if getattr(mod, name, None) is original:
                redirect._patch(mod, name, value)
    return made


# -- torch.accelerator (torch >= 2.6) -------------------------------------------------------------
# The device-generic API that newer programs use instead of torch.cuda (pytorch/examples mnist, vae,
# dcgan, imagenet: ``torch.accelerator.is_available()`` then ``current_accelerator()``). During the
# audit it answers like the one-GPU CUDA machine the torch.cuda stand-ins describe, so the program
# takes its accelerator path with device type "cuda", which the redirect sends to the present device.
# Each call the program makes is a ``runtime-redirect-accelerator`` finding. torch 2.4 has no
# torch.accelerator: :func:`install_accelerator` is then a no-op.

ACCELERATOR_RULE = "runtime-redirect-accelerator"


def _acc(value: Any) -> Callable[[Any, str], Any]:
    """A torch.accelerator function that records the call and returns ``value`` (called when it is a factory)."""
    def make(redirect: Any, name: str) -> Any:
        def stand_in(*_a: Any, **_k: Any) -> Any:
            redirect.api_call(name, rule=ACCELERATOR_RULE)
            return value() if callable(value) else value
        stand_in.__name__ = stand_in.__qualname__ = name
        return stand_in
    return make


def _acc_stream(redirect: Any, name: str) -> Any:
    def current_stream(*_a: Any, **_k: Any) -> Any:
        redirect.api_call(name, rule=ACCELERATOR_RULE)
        with redirect.quiet():
            return _STREAM[0]()
    return current_stream


def _acc_device_index(redirect: Any, name: str) -> type:
    real = torch.accelerator.device_index

    def __init__(self: Any, device: Any = None, /) -> None:
        redirect.api_call(name, rule=ACCELERATOR_RULE)
        self.idx, self.prev_idx = device, -1

    return type("device_index", (real,), {"__init__": __init__, "__enter__": lambda self: None,
                                          "__exit__": lambda self, *exc: None, "__module__": "torch.accelerator",
                                          "__doc__": "Audit stand-in for torch.accelerator.device_index: "
                                                     "one device, nothing to switch."})


def _acc_graph(redirect: Any, name: str) -> type:
    """torch.accelerator.Graph: captured work runs eagerly once (a context manager too)."""
    base = _cuda_graph_class(redirect, name)

    def __init__(self: Any, *_a: Any, **_k: Any) -> None:
        redirect.api_call(name, rule=ACCELERATOR_RULE)
        redirect.record("runtime-redirect-cuda-graph")

    return type("Graph", (base,), {"__init__": __init__, "__enter__": lambda self: self,
                                   "__exit__": lambda self, *exc: False, "instantiate": lambda self: None,
                                   "__module__": "torch.accelerator"})


#: dtypes a CUDA device reports through ``torch.accelerator.get_device_capability()``.
_CUDA_DTYPES = ("float64", "float32", "float16", "bfloat16", "complex64", "complex128", "int64", "int32",
                "int16", "int8", "uint8", "bool")

#: name -> maker(redirect, name) of what replaces ``torch.accelerator.<name>`` (and the same object in
#: its ``memory``/``random``/``graphs`` submodules) during the audit.
ACCELERATOR_STAND_INS: dict[str, Callable[[Any, str], Any]] = {
    "is_available": _acc(True), "current_accelerator": _acc(lambda: torch.device("cuda")),
    "device_count": _devices("count", rule=ACCELERATOR_RULE),
    "current_device_index": _devices("current", rule=ACCELERATOR_RULE),
    "current_device_idx": _devices("current", rule=ACCELERATOR_RULE),
    "set_device_index": _devices("set", rule=ACCELERATOR_RULE),
    "set_device_idx": _devices("set", rule=ACCELERATOR_RULE),
    "device_index": _acc_device_index,
    "get_device_capability": _acc(lambda: {"supported_dtypes": {getattr(torch, d) for d in _CUDA_DTYPES}}),
    "current_stream": _acc_stream, "set_stream": _acc(None), "synchronize": _acc(None),
    "Graph": _acc_graph,
    # memory
    "empty_cache": _acc(None), "empty_host_cache": _acc(None),
    "get_memory_info": _acc(lambda: (_host_memory(), _host_memory())),
    "memory_allocated": _acc(0), "max_memory_allocated": _acc(0), "memory_reserved": _acc(0),
    "max_memory_reserved": _acc(0), "memory_stats": _acc(lambda: collections.OrderedDict()),
    "reset_accumulated_memory_stats": _acc(None), "reset_peak_memory_stats": _acc(None),
    # random (torch.accelerator.random, torch >= 2.14): the CUDA generator's work runs on the CPU one
    "initial_seed": _acc(lambda: torch.initial_seed()), "get_rng_state": _acc(lambda: torch.get_rng_state()),
    "get_rng_state_all": _acc(lambda: [torch.get_rng_state()]),
}

#: name -> why it works unchanged without a GPU.
ACCELERATOR_LEFT_AS_IS: dict[str, str] = {
    "memory": "namespace: its functions are redirected by their torch.accelerator names (same objects)",
    "graphs": "namespace: Graph is redirected by its torch.accelerator name (same object)",
    "random": "namespace: its functions are redirected (patched in the namespace itself)",
}

#: name -> why the audit deliberately does not redirect it.
ACCELERATOR_UNSUPPORTED: dict[str, str] = {}

_ACCELERATOR_SUBMODULES = ("memory", "random", "graphs")


def accelerator_names() -> list[str]:
    """Every public name of the running torch's ``torch.accelerator``: its ``__all__``, its public
    submodules and their ``__all__`` ([] on torch < 2.6, which has no torch.accelerator)."""
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        return []
    names = set(getattr(acc, "__all__", ()))
    for sub in _ACCELERATOR_SUBMODULES:
        mod = getattr(acc, sub, None)
        if inspect.ismodule(mod):
            names.add(sub)
            names.update(getattr(mod, "__all__", ()))
    return sorted(names)


def classify_accelerator(name: str) -> str:
    """``"stand-in"``, ``"left-as-is"``, ``"unsupported"`` or ``"unknown"`` for a torch.accelerator name."""
    if name in ACCELERATOR_STAND_INS:
        return "stand-in"
    if name in ACCELERATOR_LEFT_AS_IS:
        return "left-as-is"
    if name in ACCELERATOR_UNSUPPORTED:
        return "unsupported"
    return "unknown"


def install_accelerator(redirect: Any) -> dict[str, Any]:
    """Replace every :data:`ACCELERATOR_STAND_INS` name the running ``torch.accelerator`` (or one of
    its submodules) has; return ``{name: stand-in}``. No-op (``{}``) without torch.accelerator."""
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        return {}
    submodules = [m for m in (getattr(acc, s, None) for s in _ACCELERATOR_SUBMODULES) if inspect.ismodule(m)]
    made: dict[str, Any] = {}
    for name in sorted(ACCELERATOR_STAND_INS):
        owners = [m for m in (acc, *submodules) if hasattr(m, name)]
        if not owners:
            continue
        original = getattr(owners[0], name)
        value = ACCELERATOR_STAND_INS[name](redirect, name)
        if inspect.isfunction(value) and callable(original):
            functools.update_wrapper(value, original)
        made[name] = value
        for owner in owners:
            if getattr(owner, name) is original or owner is acc:
                redirect._patch(owner, name, value)
    return made
