"""The op-status query: can backend B run ATen overload X on inputs of these dtypes, and why.

Rule, in order (docs/capabilities.md explains it):

1. the op is not in the ATen op table of the torch the table was built with -> ``unknown``
   (unless the backend lists it natively: then ``native``);
2. the backend has its own kernel for the overload (its manifest's ``native`` list) -> ``native``;
3. PyTorch implements it for every backend (CompositeImplicitAutograd or CompositeExplicitAutograd
   [NonFunctional] in the dispatcher) -> as supported as the ops it calls: ``composite`` when every
   callee is native or composite, otherwise the worst callee's status (``fallback``/``unsupported``),
   with ``via`` naming the callees that decided it;
4. otherwise the backend's CPU fallback runs it -> ``fallback`` (``unsupported`` when the backend has
   no fallback, the policy disables it, or the CPU has no kernel either).

Dtype rules then apply: a dtype the backend computes narrower adds a note (float64 -> float32 on
MLU, silently); a dtype the backend cannot hold (quantized on MLU, bfloat16 below architecture 5)
makes it ``unsupported``. Every MLU verdict is ``predicted`` (from a manifest, never measured).
Pure functions over cached data; resolution is serialised by a lock: thread-safe.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import threading
from typing import Iterable, Optional, Sequence, Union

from hal.capabilities import optable, versions
from hal.capabilities.manifest import Manifest, load_manifest
from hal.capabilities.names import base_name, normalize_op

STATUSES = ("native", "composite", "fallback", "unsupported", "unknown")
_RANK = {s: i for i, s in enumerate(STATUSES)}
Arch = Union[None, int, Sequence[int]]

#: Composites whose implementation picks a backend-specific callee at run time, so a CPU trace does
#: not show what another device calls: {op: (selector op or None, candidates in preference order, default)}.
#: scaled_dot_product_attention asks _fused_sdp_choice (a per-backend kernel) for flash / efficient /
#: cudnn / CPU-flash and otherwise runs the math composite (aten/src/ATen/native/transformers/attention.cpp).
DEVICE_SELECTED = {
    "aten::scaled_dot_product_attention": (
        "aten::_fused_sdp_choice",
        ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
         "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"),
        "aten::_scaled_dot_product_attention_math"),
    # _convolution picks its backend in C++ (ConvBackend: cuDNN, MIOpen, oneDNN, else the slow kernels);
    # a CPU trace shows only the CPU's oneDNN/slow-conv callees (no selector op: None)
    "aten::_convolution": (
        None, ("aten::cudnn_convolution", "aten::miopen_convolution", "aten::mkldnn_convolution"),
        "aten::_slow_conv2d_forward"),
}


#: Ops newer torch releases emit where older ones emit another op for the same Python call:
#: {newer op: (older op, why)}. Used when the running torch is newer than the one a manifest pairs with.
VERSION_EQUIVALENTS = {
    "aten::_safe_softmax": ("aten::_softmax", "torch >= 2.5 calls _safe_softmax in softmax under SDPA's math path "
                            "and in masked attention; torch 2.4 calls _softmax (only fully masked rows differ: "
                            "0 instead of NaN)"),
}


@dataclasses.dataclass(frozen=True)
class OpStatus:
    """The verdict for one op on one backend.

    ``status``: native | composite | fallback | unsupported | unknown. ``reason``: one line.
    ``via``: the ATen ops the verdict rests on (for a composite, the callees that decided it).
    ``dtype_notes``: silent dtype changes and dtype limits. ``hints``: risk hints (e.g. the vendor's
    public-API list flags the op's Python API as not validated). ``predicted``: True when the
    verdict comes from a manifest rather than a measurement on the device."""

    op: str
    backend: str
    status: str
    reason: str
    via: tuple[str, ...] = ()
    dtype_notes: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()
    predicted: bool = True

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class _Verdict:
    status: str
    reason: str
    via: tuple[str, ...]


def _dev(backend: str) -> str:
    return backend.upper() if backend in ("mlu", "cuda", "cpu") else backend


def _fallback_enabled(man: Manifest, override: Optional[bool]) -> bool:
    return bool(man.fallback.get("default_enabled", False)) if override is None else override


def _fallback_text(man: Manifest, enabled: bool) -> str:
    fb = man.fallback
    env = fb.get("env")
    if not enabled:
        return (f"{env}=0: " if env else "") + f"the {_dev(man.backend)} backend has no CPU fallback, the op raises"
    if env:
        return f"torch_{man.backend} falls back to the CPU ({env}=1 default, warns {fb.get('warns', 'once')})" \
            if man.backend == "mlu" else f"falls back to the CPU ({env}=1)"
    return "HAL falls back to the CPU"


class _Resolver:
    """Memoised recursive resolution of one (manifest, fallback policy) pair."""

    def __init__(self, man: Manifest, fallback: bool):
        self.man = man
        self.fallback = fallback
        self.table = optable.load()["ops"]
        self.built = optable.load()["provenance"]["torch"]
        self.memo: dict[str, _Verdict] = {}
        pairing = str(man.provenance.get("torch_pairing", ""))
        self.version = versions.version_for_pairing(pairing) if pairing and \
            not self.built.startswith(pairing) else None
        self.version_ops = versions.ops_of(self.version) if self.version else None

    def resolve(self, op: str, stack: tuple[str, ...] = ()) -> _Verdict:
        if op in self.memo:
            return self.memo[op]
        if op in stack:  # a cycle in traced edges: the op is being decided above us
            return _Verdict("composite", "recursive call", ())
        v = self._resolve(op, stack + (op,))
        self.memo[op] = v
        return v

    def equivalent(self, op: str) -> Optional[tuple[str, str]]:
        """``(op the target's torch emits instead, why)`` when ``op`` is absent from the torch the
        manifest pairs with and :data:`VERSION_EQUIVALENTS` knows its older spelling, else None."""
        if self.version_ops is None or op in self.version_ops or op not in VERSION_EQUIVALENTS:
            return None
        older, why = VERSION_EQUIVALENTS[op]
        return (older, why) if older in self.version_ops else None

    def _version_skew(self, op: str, stack: tuple[str, ...], ver: Optional[str]) -> _Verdict:
        """An op of the running torch that the target's torch lacks is never "unsupported": the
        target's torch emits something else for the same call (version skew, not a missing kernel)."""
        dev = _dev(self.man.backend)
        eq = self.equivalent(op)
        head = f"{op} is an op of torch {self.built} that torch {ver} (the {dev} manifest's pairing) does not have"
        if eq is None:
            return _Verdict("unknown", f"{head}; what torch {ver} emits for the same call is not known here "
                                       "(version skew, not a missing kernel)", (op,))
        older, why = eq
        v = self.resolve(older, stack)
        return _Verdict(v.status, f"{head}; torch {ver} emits {older} for the same call ({why}): {v.reason}", v.via)

    def _resolve(self, op: str, stack: tuple[str, ...]) -> _Verdict:
        man, dev = self.man, _dev(self.man.backend)
        if op in man.native_ops:
            return _Verdict("native", f"{dev} kernel registered for {op}", (op,))
        ns = op.split("::", 1)[0]
        if ns != "aten":
            if ns in man.fallback.get("no_fallback_namespaces", ()):
                return _Verdict("unsupported", f"{op} is a {ns} op with no kernel here and no CPU fallback", (op,))
            return _Verdict("unknown", f"{op} is not an ATen op and the {dev} manifest does not list it", (op,))
        entry = self.table.get(op)
        vops, ver = self.version_ops, self.version
        if entry is None:
            if vops is not None and op in vops:
                return _Verdict("unknown", f"{op} exists in torch {ver} but not in torch {self.built}, which the op "
                                           "table was built with: its decomposition is not known", (op,))
            return _Verdict("unknown", f"{op} is not an op of torch {self.built} (the dispatcher does not know it)",
                            (op,))
        if vops is not None and op not in vops:
            return self._version_skew(op, stack, ver)
        if entry["k"] != "-":
            kind = "CompositeImplicitAutograd" if entry["k"] == "cia" else "CompositeExplicitAutograd"
            callees = entry.get("c", [])
            if op in DEVICE_SELECTED:
                selector, fused, default = DEVICE_SELECTED[op]
                chosen = next((c for c in fused if c in man.native_ops), None) \
                    if selector is None or selector in man.native_ops else None
                callees = [c for c in (selector, chosen) if c] if chosen else [default]
            newer = [c for c in callees if vops is not None and c not in vops]
            callees = [c for c in callees if c not in newer]
            if not callees:
                if newer:
                    note = (f"in torch {self.built} it calls {', '.join(newer)}, absent from torch {ver}; its torch "
                            f"{ver} callees were not traced: assumed supported")
                elif entry.get("t") in ("traced", "schema", "redispatch", "schema-redispatch"):
                    note = "calls no other ATen op"
                else:
                    note = "its callees were not traced; assumed supported"
                return _Verdict("composite", f"{op} is {kind} ({note})", (op,))
            sub = {c: self.resolve(c, stack) for c in callees}
            worst = max(sub.values(), key=lambda v: _RANK[v.status] if v.status != "unknown" else -1)
            if worst.status in ("native", "composite"):
                leaves = tuple(sorted({x for v in sub.values() for x in v.via}))
                return _Verdict("composite", f"{op} is {kind}; every op it reaches runs natively on {dev}", leaves)
            bad = [c for c, v in sub.items() if v.status == worst.status]
            deep = tuple(sorted({x for c in bad for x in sub[c].via}))
            first = bad[0]
            leaf = deep[0] if deep else first
            if worst.status == "fallback":
                why = (f"no {dev} kernel for {leaf} (called by the {kind} {op}"
                       + (f" via {first}" if first != leaf else "") + f"); {_fallback_text(man, True)}")
            else:
                why = f"{op} is {kind} and calls {first}: {sub[first].reason}"
            return _Verdict(worst.status, why, deep or (first,))
        if man.backend == "cpu" or entry.get("cpu", "-") == "-":
            where = "the CPU has no kernel for it either" if man.backend != "cpu" else "the CPU has no kernel for it"
            return _Verdict("unsupported", f"no {dev} kernel for {op} and {where}", (op,))
        if not self.fallback:
            return _Verdict("unsupported", f"no {dev} kernel for {op}; {_fallback_text(man, False)}", (op,))
        return _Verdict("fallback", f"no {dev} kernel for {op}; {_fallback_text(man, True)}", (op,))


@functools.lru_cache(maxsize=16)
def _resolver(backend: str, fallback: Optional[bool], path: Optional[str]) -> _Resolver:
    man = load_manifest(backend, path) if path else load_manifest(backend)
    return _Resolver(man, _fallback_enabled(man, fallback))


_lock = threading.Lock()


_ARCH_NAMES = {"mlu220": 2, "mlu270": 2, "mlu290": 2, "mlu370": 3, "mlu580": 5, "mlu590": 5}


def parse_arch(text: str) -> int:
    """The architecture major of ``--arch``: ``5``, ``5.0``, an MLU board generation (``mlu370`` ->
    3, ``mlu590`` -> 5: mlu.md infers MLU370 = 3.x and MLU590 = 5.x from torch_mlu's bf16 rule) or a
    CUDA ``sm90``/``sm_90`` (-> 9). Raises ValueError with a one-line message otherwise."""
    t = str(text).strip().lower()
    if t in _ARCH_NAMES:
        return _ARCH_NAMES[t]
    m = re.fullmatch(r"mlu([235])[0-9]0(-[a-z0-9]+)?", t)
    if m:
        return int(m.group(1))
    m = re.fullmatch(r"sm_?(\d+?)(\d)", t)
    if m:
        return int(m.group(1))
    m = re.fullmatch(r"(\d+)(\.\d+)?", t)
    if m:
        return int(m.group(1))
    raise ValueError(f"--arch {text!r}: expected MAJOR[.MINOR] (e.g. 5), an MLU generation (mlu370, mlu590) "
                     "or a CUDA sm (sm90)")


def _arch_major(arch: Arch) -> Optional[int]:
    if arch is None:
        return None
    if isinstance(arch, int):
        return arch
    return int(tuple(arch)[0])


def _dtype_rules(man: Manifest, dtypes: Iterable[str], arch: Arch) -> tuple[list[str], Optional[str]]:
    rules = man.dtypes
    if not rules:
        return [], None
    notes: list[str] = []
    blocker: Optional[str] = None
    dev = _dev(man.backend)
    major = _arch_major(arch)
    for raw in dtypes:
        d = str(raw).replace("torch.", "")
        down = rules.get("downcasts", {}).get(d)
        if down:
            notes.append(f"{d} is computed as {down} on {dev} (silently)")
        if d in rules.get("unsupported", ()):
            blocker = blocker or f"{d} is not supported on {dev} (torch_{man.backend} declares quantized dtypes unsupported)"
        need = rules.get("min_arch_major", {}).get(d)
        if need is not None:
            if major is None:
                notes.append(f"{d} needs {dev} architecture major >= {need} (architecture not given)")
            elif major < need:
                blocker = blocker or f"{d} needs {dev} architecture major >= {need}; this device is {major}.x"
    return list(dict.fromkeys(notes)), blocker


def _hints(man: Manifest, op: str) -> tuple[str, ...]:
    if "api_support" not in man.data:
        return ()
    name = base_name(op).split("::", 1)[1].lstrip("_")
    out = []
    for api in (f"torch.{name}", f"torch.Tensor.{name}", f"torch.nn.functional.{name}",
                f"torch.linalg.{name.removeprefix('linalg_')}", f"torch.special.{name.removeprefix('special_')}"):
        flag = man.api_support(api)
        if flag is None:
            continue
        if not flag["supported"]:
            out.append(f"torch_{man.backend}'s API list marks {api} unsupported/not validated (risk hint)")
        elif flag["limitation_note"]:
            out.append(f"torch_{man.backend}'s API list gives {api} a limitation note (risk hint)")
    return tuple(out)


def op_status(backend: str, op: str, dtypes: Sequence[str] = (), arch: Arch = None, *,
              fallback_to_cpu: Optional[bool] = None, manifest_path: Optional[str] = None) -> OpStatus:
    """Status of ATen overload ``op`` (any spelling: ``aten::add.Tensor``, ``aten.add.Tensor``,
    ``aten::addmm`` = ``aten.addmm.default``) with input ``dtypes`` on ``backend``.

    ``arch``: the device's architecture (``(major, minor)`` or major) for dtype gates, None when
    unknown. ``fallback_to_cpu``: override the backend's default fallback policy (MLU:
    ``ENABLE_FALLBACK_TO_CPU``). A backend without a manifest gives ``unknown`` with the reason
    (e.g. the CUDA manifest before it is generated on a CUDA build). Raises ValueError for an empty
    op name."""
    name = normalize_op(op)
    try:
        with _lock:
            res = _resolver(backend, fallback_to_cpu, manifest_path)
            v = res.resolve(name)
    except FileNotFoundError as exc:
        return OpStatus(name, backend, "unknown", f"{exc}; generate it with python -m hal.capabilities.generate "
                                                  f"{backend}", (name,), predicted=True)
    notes, blocker = _dtype_rules(res.man, dtypes, arch)
    status, reason = v.status, v.reason
    if blocker and status in ("native", "composite", "fallback"):
        status, reason = "unsupported", f"{blocker} ({v.status}: {v.reason})"
    return OpStatus(name, backend, status, reason, v.via, tuple(notes), _hints(res.man, name),
                    predicted=res.man.predicted)


def target_equivalent(backend: str, op: str, *, manifest_path: Optional[str] = None) -> Optional[tuple[str, str]]:
    """``(op, why)``: what the torch that ``backend``'s manifest pairs with emits instead of ``op``
    when ``op`` exists only in the running (newer) torch; None when ``op`` exists there too, the
    pairing is the running torch, or no equivalent is known (see :data:`VERSION_EQUIVALENTS`)."""
    name = normalize_op(op)
    try:
        with _lock:
            return _resolver(backend, None, manifest_path).equivalent(name)
    except FileNotFoundError:
        return None


def target_torch(backend: str) -> Optional[str]:
    """The torch release ``backend``'s manifest pairs with (``"2.4"`` for torch_mlu r2.4), or None."""
    try:
        man = load_manifest(backend)
    except (FileNotFoundError, ValueError):
        return None
    pairing = man.provenance.get("torch_pairing")
    return str(pairing) if pairing else None


def ops_status(backend: str, ops: Iterable[str], dtypes: Sequence[str] = (), arch: Arch = None) -> list[OpStatus]:
    """:func:`op_status` for each op (same dtypes), in order."""
    return [op_status(backend, o, dtypes, arch) for o in ops]
