"""Trace which ATen ops each composite ATen op calls, from the real dispatcher of the installed torch.

How (see docs/capabilities.md): every ``OpInfo`` of PyTorch's own test database is run on small CPU
tensors under ``torch.profiler`` with overload names captured. The profiler's RecordFunction fires
for every dispatcher call, composites included, so the event tree gives, for each op, the ATen
overloads it called directly. An op's children are kept only where the kernel that ran on the CPU is
the same composite kernel a PrivateUse1 device (the MLU) gets, i.e. where the CPU dispatch-table
entry is the CompositeImplicitAutograd ("math") or CompositeExplicitAutograd ("default backend")
kernel. Where the CPU has a kernel of its own but a PrivateUse1 device gets a composite, the op's
arguments are captured (TorchDispatchMode) and the composite itself is run with
``OpOverload.redispatch(DispatchKeySet(PrivateUse1), ...)`` on those CPU tensors under the profiler;
failing that, structured functional/in-place variants call their ``structured_delegate`` (from
the ``native_functions.yaml`` packaged with torchgen).

Kernel kinds come from ``torch._C._dispatch_has_kernel_for_dispatch_key``, op lists from the
dispatcher and torchgen's ``native_functions.yaml``. Only the optional OpInfo route
(:func:`trace_composites`, ``generate optable --opinfo``) needs ``torch.testing._internal`` (and the
``expecttest`` package); the default route builds inputs from each op's schema. Everything here runs
in the generator, never at query time. Not thread-safe (it uses the profiler).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import logging
import pathlib
import re
import warnings
from typing import Callable, Iterable, Optional

import torch

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from hal.capabilities.names import normalize_op

LOG = logging.getLogger(__name__)

#: composite keys in the order the dispatcher prefers them for a backend key without its own kernel
_COMPOSITES = (("CompositeExplicitAutogradNonFunctional", "cea"), ("CompositeExplicitAutograd", "cea"),
               ("CompositeImplicitAutograd", "cia"))


def kernel_kind(op: str, key: str) -> str:
    """What the dispatcher runs for ``op`` on runtime key ``key`` ("CPU", "PrivateUse1", "CUDA"):
    ``kernel`` (a kernel registered for that key), ``cea`` (CompositeExplicitAutograd[NonFunctional]),
    ``cia`` (CompositeImplicitAutograd) or ``-`` (nothing: the key's fallback runs).

    From ``torch._C._dispatch_has_kernel_for_dispatch_key`` (what ``torch._ops`` itself uses), in the
    dispatcher's precedence (direct kernel, then the default-backend composites, then the math one);
    it agreed with the dispatch table's text on every one of 3110 (torch 2.13) and 3127 (torch 2.4.1)
    ATen overloads for keys CPU and PrivateUse1."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        if has(op, key):
            return "kernel"
        for composite, kind in _COMPOSITES:
            if has(op, composite):
                return kind
    except RuntimeError:  # no such operator
        return "-"
    return "-"


def aten_ops() -> list[str]:
    """Every ``aten::`` overload the installed torch's dispatcher knows, normalised, sorted."""
    return sorted({normalize_op(n) for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")})


def structured_delegates() -> dict[str, str]:
    """``{"aten::add.Tensor": "aten::add.out", ...}`` from torchgen's packaged native_functions.yaml."""
    try:
        import torchgen
    except ImportError:  # pragma: no cover - torchgen ships with torch
        return {}
    path = pathlib.Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    if not path.is_file():  # pragma: no cover
        return {}
    out: dict[str, str] = {}
    func: Optional[str] = None
    for line in path.read_text().splitlines():
        m = re.match(r"^- func: ([\w.]+)\(", line)
        if m:
            func = m.group(1)
            continue
        m = re.match(r"^\s+structured_delegate: ([\w.]+)", line)
        if m and func:
            out[normalize_op("aten::" + func)] = normalize_op("aten::" + m.group(1))
    return out


def _aten_name(name: str, overload: str) -> Optional[str]:
    if not name.startswith("aten::"):
        return None
    return normalize_op(name + ("." + overload if overload else ""))


def _call_tree(prof) -> list[tuple[str, Optional[str]]]:
    """``[(name, parent name)]`` for every CPU op event, nested by time interval per thread.

    Built from the raw Kineto events rather than ``prof.function_events``, whose tree building
    drops a child that has its parent's name (``sum`` -> ``sum.dim_IntList`` would vanish)."""
    events = []
    for ev in prof.kineto_results.events():
        if ev.device_type() != torch.autograd.DeviceType.CPU:
            continue
        name = ev.name()
        overload = ev.overload_name() if hasattr(ev, "overload_name") else ""
        start = ev.start_ns()
        events.append((ev.start_thread_id(), start, -(start + ev.duration_ns()),
                       _aten_name(name, overload) or name))
    events.sort()
    out: list[tuple[str, Optional[str]]] = []
    stack: list[tuple[int, int, str]] = []  # (thread, end, name)
    for thread, start, neg_end, name in events:
        end = -neg_end
        while stack and (stack[-1][0] != thread or stack[-1][1] < end or stack[-1][1] <= start):
            stack.pop()
        out.append((name, stack[-1][2] if stack else None))
        stack.append((thread, end, name))
    return out


@contextlib.contextmanager
def _profile():
    from torch.autograd.profiler import profile
    cfg = None
    try:
        cfg = torch._C._profiler._ExperimentalConfig(capture_overload_names=True)
    except TypeError:  # older torch: overloads are not captured; names stay overload-less
        LOG.warning("this torch cannot capture overload names in the profiler")
    kwargs = {"experimental_config": cfg} if cfg is not None else {}
    with profile(record_shapes=False, **kwargs) as prof:
        yield prof


class _CaptureArgs(TorchDispatchMode):
    """Keeps the first call of each op whose PrivateUse1 kernel is a composite while the CPU runs a
    kernel of its own (the CPU trace cannot show that composite's callees)."""

    def __init__(self, store: dict):
        super().__init__()
        self.store = store

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = normalize_op(str(func))
        if name.startswith("aten::") and name not in self.store and _cpu_hides_composite(name):
            clone = lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
            self.store[name] = (func, tree_map(clone, args), tree_map(clone, kwargs))
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _cpu_hides_composite(op: str) -> bool:
    return kernel_kind(op, "PrivateUse1") in ("cia", "cea") and kernel_kind(op, "CPU") == "kernel"


def trace_redispatched(captured: dict) -> dict[str, set[str]]:
    """Run each captured op's PrivateUse1 kernel (the composite) on its CPU arguments with
    ``OpOverload.redispatch`` under the profiler; ``{op: {direct ATen callees}}``."""
    from torch._C import DispatchKey, DispatchKeySet
    keys = DispatchKeySet(DispatchKey.PrivateUse1)
    edges: dict[str, set[str]] = {}
    for name, (func, args, kwargs) in sorted(captured.items()):
        marker = "hal_capabilities::redispatch"
        try:
            with _profile() as prof, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.profiler.record_function(marker):
                    func.redispatch(keys, *args, **kwargs)
        except Exception as exc:
            LOG.debug("redispatch of %s failed: %s", name, exc)
            continue
        edges[name] = {c for c, parent in _call_tree(prof)
                       if parent == marker and c.startswith("aten::") and c != name}
    return edges


def trace_calls(calls: Iterable[Callable[[], object]], captured: Optional[dict] = None) -> dict[str, set[str]]:
    """Run each zero-argument callable under the profiler; ``{parent: {direct ATen children}}``.
    With ``captured``, each call runs a second time under :class:`_CaptureArgs` filling it."""
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for call in calls:
        if captured is not None:
            try:
                with _CaptureArgs(captured), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    call()
            except Exception as exc:
                LOG.debug("capture call failed: %s", exc)
        try:
            with _profile() as prof, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                call()
        except Exception as exc:  # an OpInfo sample may legitimately raise (error inputs)
            LOG.debug("trace call failed: %s", exc)
            continue
        for child, parent in _call_tree(prof):
            if not child.startswith("aten::"):
                continue
            if parent and parent.startswith("aten::") and child != parent:
                edges[parent].add(child)
            else:
                edges.setdefault(child, set())
    return edges


def _opinfo_calls(samples_per_op: int = 3) -> Iterable[Callable[[], object]]:
    from torch.testing._internal.common_methods_invocations import op_db  # needs expecttest
    for info in op_db:
        try:
            dtypes = info.supported_dtypes("cpu")
        except Exception:
            continue
        dtype = torch.float32 if torch.float32 in dtypes else (sorted(dtypes, key=str)[0] if dtypes else None)
        if dtype is None:
            continue
        for grad in (False, True):
            if grad and not (info.supports_autograd and dtype.is_floating_point):
                continue
            try:
                samples = list(itertools.islice(info.sample_inputs("cpu", dtype, requires_grad=grad), samples_per_op))
            except Exception:
                continue
            for s in samples:
                if _dense(s):  # sparse/nested inputs dispatch to other keys than CPU
                    yield _make_call(info.op, s, grad)


def _dense(sample) -> bool:
    items = [sample.input, *sample.args, *sample.kwargs.values()]
    flat = []
    for x in items:
        flat.extend(x if isinstance(x, (list, tuple)) else (x,))
    return all(t.layout == torch.strided and not t.is_nested and not t.is_quantized
               for t in flat if isinstance(t, torch.Tensor))


def _make_call(fn, sample, grad: bool) -> Callable[[], object]:
    def call():
        out = fn(sample.input, *sample.args, **sample.kwargs)
        if grad:
            outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                    if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]
            if outs:
                torch.autograd.backward([o.sum() for o in outs])
        return out
    return call


def _extra_calls() -> Iterable[Callable[[], object]]:
    """Training-loop calls OpInfo does not cover (optimizers' foreach/fused paths, modules)."""
    import torch.nn.functional as F

    def adamw(foreach: bool):
        p = [torch.randn(4, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
        opt = torch.optim.AdamW(p, lr=1e-3, foreach=foreach)
        sum(x.sum() for x in p).backward()
        opt.step()

    def sgd(foreach: bool):
        p = [torch.randn(4, 4, requires_grad=True)]
        opt = torch.optim.SGD(p, lr=1e-3, momentum=0.9, foreach=foreach)
        p[0].sum().backward()
        opt.step()
        opt.step()

    def sdpa():
        q = torch.randn(1, 2, 4, 8, requires_grad=True)
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()

    def transformer():
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        layer(torch.randn(2, 3, 8)).sum().backward()

    yield from (lambda: adamw(True), lambda: adamw(False), lambda: sgd(True), lambda: sgd(False), sdpa, transformer)
    yield lambda: F.cross_entropy(torch.randn(3, 5, requires_grad=True), torch.tensor([1, 0, 4])).backward()
    yield lambda: F.embedding(torch.tensor([[1, 2]]), torch.randn(5, 3, requires_grad=True)).sum().backward()


def _schema_value(arg):
    """A small example value for one schema argument (None when none is obvious)."""
    t = arg.type
    kind = type(t).__name__
    if kind == "OptionalType":
        return None
    if kind == "TensorType":
        return torch.empty(0) if arg.alias_info is not None and arg.alias_info.is_write else \
            torch.rand(3, 3) + 0.5
    if kind == "ListType":
        elem = type(t.getElementType()).__name__
        if elem == "TensorType":
            return [torch.rand(3, 3) + 0.5, torch.rand(3, 3) + 0.5]
        if elem == "IntType" or "SymInt" in str(t):
            return [1]
        return []
    name = str(t)
    return {"int": 1, "SymInt": 1, "float": 0.5, "bool": False, "Scalar": 1, "number": 1,
            "ScalarType": torch.float32, "Device": torch.device("cpu"), "Layout": torch.strided,
            "str": "none"}.get(name, _NO_VALUE)


_NO_VALUE = object()


def schema_calls(ops: Iterable[str]) -> dict[str, Callable[[], object]]:
    """``{op: call}`` running each op on example inputs built from its schema alone (small float
    tensors, 1 for ints, defaults where the schema has them). Ops whose schema needs something
    else are skipped; a call may still raise (then it traces nothing)."""
    out: dict[str, Callable[[], object]] = {}
    for op in ops:
        base, _, overload = op.split("::", 1)[1].partition(".")
        try:
            func = getattr(getattr(torch.ops.aten, base), overload or "default")
            schema = func._schema
        except (AttributeError, RuntimeError):
            continue
        args, kwargs, ok = [], {}, True
        for a in schema.arguments:
            if a.has_default_value() and not (a.alias_info is not None and a.alias_info.is_write):
                continue
            value = _schema_value(a)
            if value is _NO_VALUE:
                ok = False
                break
            if a.kwarg_only:
                kwargs[a.name] = value
            else:
                args.append(value)
        if ok:
            out[op] = functools.partial(func, *args, **kwargs)
    return out


def _schema_worker(mode: str, ops: list[str]) -> None:
    """Child-process side of :func:`trace_by_schema`: prints ``START <op>`` before each call and
    one JSON line of callees after it (a crash in an op then names that op)."""
    import json
    import sys
    calls = schema_calls(ops)
    for op in ops:
        print("START " + op, flush=True)
        call = calls.get(op)
        edges: set[str] = set()
        if call is not None:
            if mode == "redispatch":
                edges = trace_redispatched({op: (call.func, call.args, call.keywords)}).get(op, set())
            else:
                edges = trace_calls([call]).get(op, set())
        sys.stdout.write(json.dumps({"op": op, "callees": sorted(edges)}) + "\n")
        sys.stdout.flush()


def trace_by_schema(ops: Iterable[str], redispatch: bool, timeout_s: float = 600) -> dict[str, set[str]]:
    """Direct callees of ``ops`` run on schema-derived inputs: called normally (the CPU runs the
    composite) or, with ``redispatch``, through their PrivateUse1 composite.

    Made-up arguments can crash an op's kernel (a segfault), so the calls run in a child process;
    an op that kills it is skipped and the child restarted after it."""
    import json
    import subprocess
    import sys
    todo = list(ops)
    out: dict[str, set[str]] = {}
    mode = "redispatch" if redispatch else "call"
    while todo:
        proc = subprocess.run([sys.executable, "-c", "import sys; from hal.capabilities.trace import _schema_worker; "
                               "_schema_worker(sys.argv[1], sys.stdin.read().split())", mode],
                              input="\n".join(todo), capture_output=True, text=True, timeout=timeout_s)
        started = None
        for line in proc.stdout.splitlines():
            if line.startswith("START "):
                started = line[6:]
            elif line.startswith("{"):
                rec = json.loads(line)
                out[rec["op"]] = set(rec["callees"])
                started = None
        done = set(out)
        if proc.returncode == 0:
            break
        if started is None:  # died outside a call: give up on the rest rather than loop
            LOG.warning("schema tracing worker exited %s: %s", proc.returncode, proc.stderr[-500:])
            break
        LOG.info("schema tracing: %s crashed the worker (exit %s); skipped", started, proc.returncode)
        todo = [o for o in todo[todo.index(started) + 1:] if o not in done]
    return {k: v for k, v in out.items() if v}


def trace_composites(samples_per_op: int = 3) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(traced, redispatched)``: direct ATen children of every op traced over PyTorch's OpInfo
    database and training calls, and the callees of the composites the CPU hides (see
    :func:`trace_redispatched`)."""
    torch.manual_seed(0)
    captured: dict = {}
    traced = trace_calls(itertools.chain(_opinfo_calls(samples_per_op), _extra_calls()), captured)
    return traced, trace_redispatched(captured)
