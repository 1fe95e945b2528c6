"""Error statistics of tensors against their float64 references, many comparisons in one vectorised pass.

:func:`error_stats` takes the target values and the reference values (same shape, any float
dtype; both are upcast to float64) and returns max absolute error, max relative error, mean
relative error (``sum|d| / sum|ref|``), RMS relative error (``sqrt(sum d^2 / sum ref^2)``),
cosine similarity, the element-rule mismatch fraction, NaN/Inf mismatches and, for 16-bit
target dtypes, max/mean ULP error. Large tensors are compared on a fixed pseudo-random sample of
``max_elements`` positions (:func:`sample_index`): the sample is a function of the shape only, so
the target and the reference pick the same positions. Pure functions; thread-safe.
"""
from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

#: default number of elements compared per tensor before sampling kicks in.
DEFAULT_MAX_ELEMENTS = 1 << 15
_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}
#: the largest finite magnitude of each floating format: ``torch.finfo(dtype).min`` and ``max`` are sentinels
#: (transformers' attention masks fill with ``finfo(dtype).min``: float32's in the target, float64's in the float64
#: reference, and autocast casts float32's to bfloat16's -inf), so a value of exactly one of these magnitudes, in the
#: target or in the reference, compares as that sign's infinity. A computed value that overflows (the naive float16
#: softmax's exp) is no sentinel: its infinity against a finite reference stays a mismatch.
_LARGEST = {d: torch.finfo(d).max for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}
_SENTINELS = tuple(_LARGEST.values())
_sentinels_on: Dict[torch.device, torch.Tensor] = {}
#: (shape, max_elements) -> (flat index, multi-dimensional index) of the sample
_index_cache: Dict[Tuple[Tuple[int, ...], int], Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]] = {}


def _sample(shape, max_elements: int) -> Optional[Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]]:
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape) if shape else 1
    if n <= max_elements:
        return None
    key = (shape, max_elements)
    hit = _index_cache.get(key)
    if hit is None:
        g = torch.Generator().manual_seed(n % (2 ** 31))
        flat = torch.randint(0, n, (max_elements,), generator=g)
        if len(_index_cache) > 4096:
            _index_cache.clear()
        hit = _index_cache[key] = (flat, tuple(torch.unravel_index(flat, shape)))
    return hit


def sample_index(shape, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Optional[Tuple[torch.Tensor, ...]]:
    """Multi-dimensional index of a fixed sample of ``max_elements`` positions, or None (all).

    Deterministic in (shape, max_elements): seeded by the element count, so independent runs
    and the target/reference pair compare the same positions.
    """
    hit = _sample(shape, max_elements)
    return None if hit is None else hit[1]


def sample_flat_index(shape, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Optional[torch.Tensor]:
    """The positions of :func:`sample_index` as indices into the row-major flattening of ``shape`` (what
    ``torch.take`` reads: one plain gather instead of an advanced index over every dim), or None (all)."""
    hit = _sample(shape, max_elements)
    return None if hit is None else hit[0]


_device_index_cache: Dict[tuple, Optional[torch.Tensor]] = {}
_ABSENT = object()


def sample_flat_index_on(shape, max_elements: int, device: torch.device) -> Optional[torch.Tensor]:
    """:func:`sample_flat_index` on ``device``, copied there once (:func:`host_to`: no synchronisation, which
    inside a compared step on the H200 waited for the step's queued kernels at each new shape) and cached: the
    samplers index every op output with the same few index sets, and a host-to-device copy per op would cost a
    transfer each time. Looked up by ``(shape, max_elements, device)`` as given (a ``torch.Size`` finds the entry of the equal
    tuple), small shapes' None cached too: this runs for every op output the tracers record. Bounded (cleared
    past 4096 entries)."""
    k = (shape, max_elements, device)
    hit = _device_index_cache.get(k, _ABSENT)
    if hit is _ABSENT:
        hit = sample_flat_index(shape, max_elements)
        if hit is not None:
            hit = host_to(hit, device)
        if len(_device_index_cache) > 4096:
            _device_index_cache.clear()
        _device_index_cache[k] = hit
    return hit  # type: ignore[return-value]


def to_home(x: torch.Tensor, home: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``x.to(home, dtype)``, but from an accelerator to the CPU the copy lands in pinned memory without a
    staging pass and in ``x``'s own dtype (a cross-device copy with a cast is a pageable copy, then the cast
    on the host), the device is synchronised once, and the cast runs on the host: on the H200 the float64
    shadows' synchronous pageable copies were 870 ms of a 2 s step. Falls back to ``x.to(home, dtype)``
    where the device module has no ``synchronize``."""
    if x.device.type != "cpu" and home.type == "cpu":
        sync = getattr(getattr(torch, x.device.type, None), "synchronize", None)
        if sync is not None:
            y = x.to(home, non_blocking=True)  # pinned when the backend pins non-blocking host copies
            sync(x.device)
            return y if dtype is None or y.dtype == dtype else y.to(dtype)
    return x.to(home, dtype)


def sampled_values(t: torch.Tensor, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Tuple[torch.Tensor, bool]:
    """``(values, may_alias)``: ``t`` flattened (a view of it when it can be) when small, else its
    values at the :func:`sample_index` positions (a gathered copy, ``torch.take`` of the flat index: on the
    CPU 2-3x faster than the advanced index, and less host time per call), on ``t``'s device in ``t``'s
    dtype. Nothing moves to the host and nothing synchronises. When ``may_alias``, the values may
    change with ``t``: a caller keeping them copies them first, or before ``t`` is written."""
    flat = sample_flat_index_on(t.shape, max_elements, t.device)
    if flat is None:
        return t.detach().reshape(-1), True
    return torch.take(t.detach(), flat), False


def take_sample(t: torch.Tensor, max_elements: int = DEFAULT_MAX_ELEMENTS) -> torch.Tensor:
    """Flattened float64 CPU values of ``t`` at :func:`sample_index` positions (all if small).

    Always a copy: a float64 CPU tensor is never returned as a view of ``t``'s storage (a sample kept
    for later would otherwise change with ``t``: ``clip_grad_norm_`` scales in place the very tensor
    a backward op produced, since AccumulateGrad keeps it as ``.grad``)."""
    out = to_home(sampled_values(t, max_elements)[0], torch.device("cpu"), torch.float64)
    if out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
        out = out.clone()
    return out


def take_samples(ts: Sequence[torch.Tensor], max_elements: int = DEFAULT_MAX_ELEMENTS) -> List[torch.Tensor]:
    """:func:`take_sample` of each of ``ts`` (equal values), with one transfer per device and dtype instead of
    one per tensor: the samples of one device and dtype are gathered there, joined and brought to the host in one
    copy (one synchronisation; on the H200 a script's 27 gradients took 27 synchronising copies), then cast to
    float64 and split (on the CPU the same, the copy being the join). Each result is a copy, never a view of its
    tensor (views of one fresh host buffer)."""
    out: List[Optional[torch.Tensor]] = [None] * len(ts)
    groups: Dict[tuple, List[int]] = {}
    for i, t in enumerate(ts):
        groups.setdefault((t.device, t.dtype), []).append(i)
    for idx in groups.values():
        vals = [sampled_values(ts[i], max_elements)[0] for i in idx]
        joined = torch.cat(vals)  # a copy even of one tensor: a float64 CPU view would come back from to_home as is
        host = to_home(joined, torch.device("cpu"), torch.float64)
        for i, part in zip(idx, host.split([v.numel() for v in vals])):
            out[i] = part
    return out  # type: ignore[return-value]


def error_stats(target: torch.Tensor, ref: torch.Tensor, *, target_dtype: torch.dtype,
                rtol: float, atol: float, normwise: bool, rule: str = "element") -> Dict[str, float]:
    """Metrics of ``target`` against ``ref`` (flattened, same numel) plus a verdict.

    ``normwise`` selects the element-rule scale ``max(|ref|, rms(ref))`` instead of ``|ref|``.
    ``rule="element"``: ``exceeds`` when a NaN/Inf position differs or the element-rule mismatch
    fraction is over the allowed fraction (per-op acceptance, DIOPI style).
    ``rule="aggregate"``: ``exceeds`` when a NaN/Inf position differs, the RMS relative error is
    over ``rtol`` or the cosine similarity is under 0.99 (accumulated/inherited error), and some element's
    error is over ``atol`` (both measures are scale-free: under the floor they measure noise).
    Returns plain floats (JSON-ready). Raises ValueError when the element counts differ.
    One comparison of :func:`error_stats_many`.
    """
    return error_stats_many([StatsRequest(target, ref, target_dtype, rtol, atol, normwise, rule)])[0]


@dataclasses.dataclass
class StatsRequest:
    """One comparison for :func:`error_stats_many` (the arguments of :func:`error_stats`)."""

    target: torch.Tensor
    ref: torch.Tensor
    target_dtype: torch.dtype
    rtol: float
    atol: float
    normwise: bool
    rule: str = "element"
    #: element-wise magnitudes (``ref``'s element count) the element rule's scale is at least (an attention
    #: backward's: :func:`attention.math_attention_grads`); None: the scale is ``|ref|`` or ``max(|ref|, rms(ref))``
    magnitude: Optional[torch.Tensor] = None


#: elements per vectorised pass of :func:`error_stats_many`: on the CPU, temporaries that stay in the
#: cache (measured here: 1 ns an element at 64K elements, 3-30 ns at 1M and more; 128K, the scratch buffers'
#: bound, judged a nanoGPT tiny window 12% faster than 64K, fewer passes' fixed costs); on a device, more
_CHUNK_ELEMENTS = {"cpu": 1 << 17}
_DEVICE_CHUNK_ELEMENTS = 1 << 24
#: rows meet in one matrix when their lengths' bit lengths (at least 10) divided by this are equal: on the CPU
#: 1 (padding at most doubles a row: padded elements cost time there); on a device 4 (rows of 1K-8K elements
#: meet, then 8K-128K ...: a bucket is ~40 kernel launches and two synchronisations of host time, far more
#: than the padding costs the device; gpt tiny on the H200 had 5 buckets, 1.9 ms each)
_LENGTH_CLASS = {"cpu": 1}
_DEVICE_LENGTH_CLASS = 4


def error_stats_many(requests: Sequence[StatsRequest], device: Optional[torch.device] = None
                     ) -> List[Dict[str, float]]:
    """:func:`error_stats` of many comparisons at once: requests of similar length are padded into
    one matrix and reduced row by row in a few vectorised passes, instead of a dozen small tensor
    ops per comparison. This is what the tracers use to judge every op output of a step after it ran.

    Values are upcast to float64 on ``device`` (default: the CPU; a device that computes float64
    natively can take them where they already are, saving the copies); one result dict per request,
    in order. Raises ValueError when a request's target and reference element counts differ.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    limit = _CHUNK_ELEMENTS.get(dev.type, _DEVICE_CHUNK_ELEMENTS)
    per_class = _LENGTH_CLASS.get(dev.type, _DEVICE_LENGTH_CLASS)
    out: List[Optional[Dict[str, float]]] = [None] * len(requests)
    buckets: Dict[int, List[int]] = {}
    for i, q in enumerate(requests):
        n, m = q.target.numel(), q.ref.numel()
        if n != m:
            raise ValueError(f"target has {n} elements, the reference {m}")
        if n == 0:
            out[i] = {"n": 0, "max_abs": 0.0, "max_rel": 0.0, "mean_rel": 0.0, "rms_rel": 0.0, "cosine": 1.0,
                      "mismatch_frac": 0.0, "nan_inf_mismatch": 0, "exceeds": False, "rule": q.rule}
            continue
        # rows of similar length share a matrix (on the CPU padding at most doubles a row, or pads it to 1024;
        # see _LENGTH_CLASS), and of one device on each side, so each side is laid out where it is and moved
        # once; the dtypes of a bucket are laid out in runs (:func:`_padded`), not a bucket each (on the H200 a
        # bucket is ~2 ms of host time, and an autocast step has float16 and float32 rows of every length)
        key = (max(10, (n - 1).bit_length()) // per_class, q.target.device, q.ref.device)
        buckets.setdefault(key, []).append(i)
    pending = []  # on a device each matrix's results are read after every matrix is queued: one wait, not one each
    for idx in buckets.values():
        # runs of one dtype pair, and in them of one length (longest first): one copy per run (:func:`_fill_padded`)
        idx.sort(key=lambda i: (str(requests[i].target.dtype), str(requests[i].ref.dtype), -requests[i].target.numel()))
        start, longest = 0, 0
        for k, i in enumerate(idx):
            n = requests[i].target.numel()
            if k > start and max(longest, n) * (k + 1 - start) > limit:
                pending.append(_stats_rows(requests, idx[start:k], dev, out))
                start, longest = k, 0
            longest = max(longest, n)
        pending.append(_stats_rows(requests, idx[start:], dev, out))
    for fill in pending:
        if fill is not None:
            fill()
    return out  # type: ignore[return-value]


def host_to(host: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """A CPU tensor on ``dev`` without synchronising: itself on the CPU; on CUDA through pinned memory,
    non-blocking (the caching host allocator keeps the pinned block until the copy has run: a copy from pageable
    memory waits for every kernel queued before it, on a step in flight the whole step); elsewhere ``to``."""
    if dev.type == "cpu":
        return host
    if dev.type == "cuda":
        return host.pin_memory().to(dev, non_blocking=True)
    return host.to(dev)


def _padded(xs: List[torch.Tensor], lens: List[int], home: torch.device,
            lengths: Optional[torch.Tensor], slot: str) -> torch.Tensor:
    """``xs`` (one device; dtypes in contiguous runs) flattened as the rows of a float64 ``[len(xs), max(lens)]``
    matrix on ``home``, zero-padded: from CPU tensors to the CPU :func:`_padded_rows` (in the :func:`scratch`
    buffer ``slot``), else :func:`_padded_scatter` of each run of one dtype where they are, then :func:`to_home`
    (and one concatenation there). ``lengths``: ``lens`` as a ``[len(xs), 1]`` tensor on ``xs``' device, when the
    caller has one there (else it is made)."""
    if home.type == "cpu" and xs[0].device.type == "cpu":
        return _padded_rows(xs, lens, slot)
    return _padded_runs(xs, lens, home, lengths)


def _padded_runs(xs: List[torch.Tensor], lens: List[int], home: torch.device, lengths: Optional[torch.Tensor]
                 ) -> torch.Tensor:
    """:func:`_padded`'s matrix made where ``xs`` are: one :func:`_padded_scatter` per run of one dtype."""
    longest = max(lens)
    runs, start = [], 0
    for k in range(1, len(xs) + 1):
        if k == len(xs) or xs[k].dtype != xs[start].dtype:
            part = _padded_scatter(xs[start:k], lens[start:k], None if lengths is None else lengths[start:k], longest)
            runs.append(to_home(part, home, torch.float64))
            start = k
    return runs[0] if len(runs) == 1 else torch.cat(runs)


class _Scratch(threading.local):
    """Per-thread work buffers of the CPU statistics, kept between calls (:func:`scratch`)."""

    def __init__(self) -> None:
        self.bufs: Dict[Tuple[str, torch.dtype], torch.Tensor] = {}


#: a statistics pass on the CPU takes its matrices from :func:`scratch` up to this many elements (1 MiB of
#: float64 per buffer, a pass's usual size: ten buffers, ~10 MiB kept per thread at most); larger ones
#: (a single row longer than that) are allocated per call
SCRATCH_MAX_ELEMENTS = 1 << 17
_scratch = _Scratch()


def scratch(slot: str, rows: int, cols: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A ``[rows, cols]`` CPU tensor of ``dtype`` (uninitialised) for the work buffer named ``slot``: a view of
    a buffer this thread keeps and reuses on the next call for the same slot. A fresh buffer of a few hundred
    KiB is memory the C allocator maps and the kernel faults in on every pass (glibc serves it with mmap, or
    trims it back after the free): on a gpt tiny step that was a third of the statistics' time on the CPU.
    The view is valid until the thread asks for the same slot again: callers keep no result that aliases it.
    Above :data:`SCRATCH_MAX_ELEMENTS` elements a fresh tensor is returned (nothing is kept)."""
    n = rows * cols
    if n > SCRATCH_MAX_ELEMENTS:
        return torch.empty(rows, cols, dtype=dtype, device="cpu")
    key = (slot, dtype)
    buf = _scratch.bufs.get(key)
    if buf is None or buf.numel() < n:
        buf = _scratch.bufs[key] = torch.empty(max(n, _CHUNK_ELEMENTS["cpu"]), dtype=dtype, device="cpu")
    return buf[:n].view(rows, cols)


def _padded_rows(xs: List[torch.Tensor], lens: List[int], slot: str) -> torch.Tensor:
    """The float64 CPU matrix of :func:`_padded`: each run of full-length rows of one dtype is one concatenation
    into its rows (cast on the way), each shorter row one copy into a zeroed row (a masked scatter is
    single-threaded on the CPU: 8x slower on 16K-element rows; a copy per row was 5 us of view and copy calls
    each, a third of a gpt tiny window's statistics). The matrix is the :func:`scratch` buffer ``slot`` (one slot
    per matrix alive at once: two calls with one slot share it)."""
    out = scratch(slot, len(xs), max(lens))
    with torch.no_grad():  # the program's tensors may require grad by now (out= refuses those under grad mode)
        _fill_padded(xs, lens, out)
    return out


def _fill_padded(xs: List[torch.Tensor], lens: List[int], out: torch.Tensor) -> None:
    """:func:`_padded_rows`' copies into ``out``: per run of rows of one length and dtype, one concatenation (rows as
    long as the matrix: straight into their rows; shorter ones: then one copy into their columns, tails zeroed)."""
    longest, flat = out.shape[1], out.view(-1)
    k, rows = 0, len(xs)
    while k < rows:
        n, dtype, j = lens[k], xs[k].dtype, k + 1
        while j < rows and lens[j] == n and xs[j].dtype == dtype:
            j += 1
        run = [x if x.dim() == 1 else x.reshape(-1) for x in xs[k:j]]
        if n == longest:
            torch.cat(run, out=flat[k * longest:j * longest])
        else:
            out[k:j, :n].copy_(run[0] if j == k + 1 else torch.stack(run))
            out[k:j, n:].zero_()
        k = j


#: tensors flattened and joined into one 1-D tensor in C++ (DDP's bucket helper): one call, whatever their number
flatten_join = torch._C._nn.flatten_dense_tensors


def _padded_scatter(xs: List[torch.Tensor], lens: List[int], lengths: Optional[torch.Tensor] = None,
                    longest: Optional[int] = None) -> torch.Tensor:
    """The matrix of :func:`_padded` in ``xs``' dtype (one) and device, ``longest`` wide (default: the longest
    row): one concatenation and one masked scatter, whatever their number (a copy per row would be a launch per
    row on a device; the rows are flattened and joined in one C++ call, not two Python calls a row)."""
    # the program's tensors may require grad: one row is detached (a view made under no_grad would still require it),
    # the joined rows are a new tensor made under no_grad
    with torch.no_grad():
        cat = xs[0].detach().reshape(-1) if len(xs) == 1 else flatten_join(xs)
    longest = max(lens) if longest is None else longest
    if all(n == longest for n in lens):
        return cat.view(len(lens), longest)
    if lengths is None:
        lengths = host_to(torch.tensor(lens).unsqueeze(1), cat.device)
    mask = torch.arange(longest, device=cat.device) < lengths
    return cat.new_zeros(len(lens), longest).masked_scatter_(mask, cat)


def _sentinel_infinities(x: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``x`` with every value of a sentinel magnitude (:data:`_SENTINELS`) made that sign's infinity (a new tensor;
    ``x`` itself when none is, on the CPU, where asking costs no synchronisation)."""
    sentinels = _sentinels_on.get(dev)
    if sentinels is None:
        sentinels = _sentinels_on[dev] = host_to(torch.tensor(_SENTINELS, dtype=torch.float64), dev)
    hit = torch.isin(x.abs(), sentinels)
    if not _queued(dev) and not bool(hit.any()):
        return x
    return x.masked_fill(hit & (x > 0), math.inf).masked_fill_(hit & (x < 0), -math.inf)


def _queued(dev: torch.device) -> bool:
    """Whether the statistics on ``dev`` are queued without a synchronisation until their results are read (a
    device: yes; the CPU, where nothing is queued: no)."""
    return dev.type != "cpu"


def _stats_rows(requests: Sequence[StatsRequest], idx: List[int], dev: torch.device,
                out: List[Optional[Dict[str, float]]]) -> Optional[Callable[[], None]]:
    """Statistics of the requests ``idx`` (one device per side, dtypes in runs), zero-padded into one
    ``[rows, longest]`` matrix (padding is finite and error-free, so it adds nothing to any sum or
    maximum; it is taken off the counts), into ``out``: now on the CPU (returns None); on a device the
    kernels are queued and the returned function reads their results (the one synchronisation) and fills
    ``out``."""
    f64 = torch.float64
    qs = [requests[i] for i in idx]
    lens = [q.target.numel() for q in qs]
    bits16 = [_MANTISSA_BITS.get(q.target_dtype, 0) for q in qs]
    # every per-row parameter in one host table, moved in one copy (each small tensor made on a device is a
    # copy of its own, synchronous from pageable memory): length, rtol, atol, norm-wise, mantissa bits, the
    # target's smallest normal exponent, and the fast path's sum scale (2**1000 over the format's largest magnitude)
    params = host_to(torch.tensor([[n, q.rtol, q.atol, q.normwise, b, -13 if q.target_dtype == torch.float16 else -125,
                                    2.0 ** 1000 / _LARGEST.get(q.target_dtype, 2.0 ** 1000)]
                               for n, q, b in zip(lens, qs, bits16)], dtype=f64), dev)
    n_col, rtol, atol = params[:, 0:1], params[:, 1:2], params[:, 2:3]

    def lengths_on(xs: List[torch.Tensor]) -> Optional[torch.Tensor]:
        return n_col if xs[0].device == n_col.device else None
    targets, refs = [q.target for q in qs], [q.ref for q in qs]
    t = _padded(targets, lens, dev, lengths_on(targets), "target")
    r = _padded(refs, lens, dev, lengths_on(refs), "ref")
    # on the CPU, finite row sums mean finite elements (a NaN or Inf carries into the sum, and into the sum of both
    # sums; a sum that overflows only sends the chunk down the exact path): two passes without temporaries instead
    # of two isfinite masks. On a device the masks cost a few launches, where that test's synchronisation waited
    # for every float64 shadow queued before the statistics
    # (the sums scaled so that a row holding a value near the format's largest magnitude, a sentinel maybe, takes the
    # exact path too)
    if not _queued(dev) and bool(torch.isfinite(t.sum(1).add_(r.sum(1)).mul_(params[:, 6])).all()):  # usual case
        both, tb, rb = None, t, r
        nonfin_rows = torch.zeros(len(qs), dtype=f64, device=dev)
        nb = params[:, 0]
    else:
        # sentinel values (_SENTINELS) are that sign's infinity, on both sides
        t, r = _sentinel_infinities(t, dev), _sentinel_infinities(r, dev)
        t_fin, r_fin = torch.isfinite(t), torch.isfinite(r)
        both = t_fin & r_fin
        # non-finite in one but not the other, or different non-finite values
        nonfin = (t_fin != r_fin) | ((~t_fin) & (~r_fin) & ~((t == r) | (torch.isnan(t) & torch.isnan(r))))
        nonfin_rows = nonfin.sum(1).to(f64)
        tb = torch.where(both, t, 0.0)
        rb = torch.where(both, r, 0.0)
        nb = (both.sum(1).to(f64) - (t.shape[1] - params[:, 0])).clamp_(min=1)

    # few temporaries, reused in place, and on the CPU taken from the thread's scratch buffers (:func:`scratch`):
    # each fresh buffer of this size is memory the allocator maps and faults in again
    def sq(a: torch.Tensor) -> torch.Tensor:  # row-wise sum(a * a), one reduction, no temporary
        return torch.linalg.vector_norm(a, 2, dim=1).square_()

    def buf(slot: str, dtype: torch.dtype = f64) -> Optional[torch.Tensor]:  # out= of a [rows, longest] temporary
        return scratch(slot, t.shape[0], t.shape[1], dtype) if dev.type == "cpu" else None
    d = torch.sub(tb, rb, out=buf("d")).abs_()
    ar = torch.abs(rb, out=buf("ar"))
    sr2, sd2, st2 = sq(rb), sq(d), sq(tb)
    rms_ref = (sr2 / nb).sqrt_()
    scale = ar
    if any(q.normwise for q in qs):  # max(|ref|, rms(ref)) on the norm-wise rows: a per-row floor, 0 elsewhere
        scale = torch.maximum(ar, torch.where(params[:, 3] != 0, rms_ref, 0.0).unsqueeze(1), out=buf("scale"))
    if any(q.magnitude is not None for q in qs):  # at least the given magnitudes (a row without: its own |ref|)
        mags = [q.ref if q.magnitude is None else q.magnitude for q in qs]
        scale = torch.fmax(scale, _padded(mags, lens, dev, lengths_on(mags), "magnitude").abs(), out=buf("scale"))
    # |out - ref| > atol + rtol * scale (masked and padded positions have d = 0 there, never counted): one
    # compare into a byte mask and one sum, not four passes over a float64 buffer
    work = torch.addcmul(atol, scale, rtol, out=buf("work"))
    bad_rows = torch.gt(d, work).sum(1, dtype=f64)
    rel = torch.div(d, ar, out=work).masked_fill_(ar <= torch.clamp(atol, min=1e-300), 0.0)  # d / |ref| over atol
    # t.r from the three squares (no product buffer): |t|^2 + |r|^2 - |t - r|^2 = 2 t.r; the rounding is
    # ~1e-16 of |t|^2 + |r|^2, far below what the cosine is judged at
    cols = [d.sum(1), sd2, ar.sum(1), sr2, st2, (st2 + sr2 - sd2) / 2, nb, rms_ref,
            nonfin_rows, bad_rows, rel.amax(1), d.amax(1)]
    if any(bits16):
        # ULP of the reference value in the target's format (normal range); rows of other dtypes ignore it.
        # d / ulp as d * 2**(bits - max(floor(log2 |ref|), min_exp)): exact (a power of two), the power built from
        # its exponent field and floor(log2 |ref|) read from |ref|'s, all integer passes (frexp and ldexp, a pow per
        # element, were 12% of a CPU statistics pass, and on torch 2.4 ldexp made inf of a subnormal reference's)
        if dev.type == "cpu":  # where's out= form takes no Python scalar; a 0-d tensor would be a launch on a device
            a = torch.where(ar > 0, ar, ar.new_ones(()), out=buf("ulp"))
        else:
            a = torch.where(ar > 0, ar, 1.0)
        bits, min_exp = params[:, 4:6].to(torch.int64).unbind(1)
        # a > 0 and finite: its sign bit is 0, its exponent field less the bias is floor(log2 a) (a subnormal reads
        # -1023, under every format's min_exp, as frexp's exponent would be); a's own buffer holds the integers
        k = torch.maximum(a.view(torch.int64).bitwise_right_shift_(52).sub_(1023), min_exp.unsqueeze(1))
        k = k.neg_().add_(bits.unsqueeze(1) + 1023).bitwise_left_shift_(52)
        u = torch.mul(d, k.view(f64), out=buf("u"))
        cols += [u.amax(1), u.sum(1)]
    table = torch.stack(cols, 1)
    if not _queued(dev):
        _fill_rows(idx, qs, lens, bits16, table.tolist(), out)
        return None
    return lambda: _fill_rows(idx, qs, lens, bits16, table.tolist(), out)


def _fill_rows(idx: List[int], qs: List[StatsRequest], lens: List[int], bits16: List[int], rows: List[list],
               out: List[Optional[Dict[str, float]]]) -> None:
    """The result dicts of :func:`_stats_rows`' requests from their rows of the statistics table."""
    from .thresholds import MISMATCH_FRACTION, MODULE_COSINE_MIN

    for k, (i, q, n, row) in enumerate(zip(idx, qs, lens, rows)):
        sd, sd2, sr, sr2_, st2, str_, nb_, rms_ref_, nonfin_, bad_, max_rel, max_abs = row[:12]
        denom = math.sqrt(st2) * math.sqrt(sr2_)
        cosine = str_ / denom if denom > 0 else (1.0 if st2 == sr2_ else 0.0)
        s: Dict[str, Any] = {
            "n": n,
            "max_abs": max_abs,
            "max_rel": max_rel,
            "mean_rel": sd / sr if sr > 0 else (0.0 if sd == 0 else math.inf),
            "rms_rel": math.sqrt(sd2 / sr2_) if sr2_ > 0 else (0.0 if sd2 == 0 else math.inf),
            "rms_abs": math.sqrt(sd2 / nb_),
            "rms_ref": rms_ref_,
            "cosine": cosine,
            "mismatch_frac": (bad_ + nonfin_) / n,
            "nan_inf_mismatch": int(nonfin_),
        }
        if bits16[k]:
            s["ulp_max"] = row[12]
            s["ulp_mean"] = row[13] / n
        if q.rule == "aggregate":
            # rms_rel and cosine are scale-free: on a tensor whose every error is within atol (gradients of
            # ~1e-8 through masked attention, say) they measure noise, so they count only above the atol floor
            significant = max_abs > q.atol
            s["exceeds"] = bool(nonfin_ > 0 or significant and (s["rms_rel"] > q.rtol + q.atol
                                                                or cosine < MODULE_COSINE_MIN))
        else:
            s["exceeds"] = bool(nonfin_ > 0 or s["mismatch_frac"] > MISMATCH_FRACTION)
        s["rule"] = q.rule
        out[i] = s


_warmed: set = set()


def warm_statistics(device: torch.device) -> None:
    """Run :func:`error_stats_many` once on ``device`` over tiny requests that take every kernel path it has
    (each target dtype, the element and the norm-wise rule, rows of two lengths in one padded matrix, finite
    and non-finite values), so a kernel's first use in the process is paid here, not inside a compared step:
    on the H200 the first norm-wise (total) comparisons cost 205 ms of host time once and 1-2 ms afterwards.
    Once per device per process; a failure is ignored (the real statistics report their own). Not
    thread-safe (a second concurrent call only repeats the work)."""
    dev = torch.device(device)
    if str(dev) in _warmed:
        return
    _warmed.add(str(dev))
    f64 = torch.float64
    try:
        for finite in (True, False):
            reqs = []
            for dt in (torch.float16, torch.bfloat16, torch.float32, f64):
                for n, normwise, rule in ((8, False, "element"), (5, True, "aggregate")):
                    r = torch.linspace(-1.0, 1.0, n, dtype=f64, device=dev)
                    t = r.to(dt) if finite else torch.full((n,), math.nan, dtype=dt, device=dev)
                    reqs.append(StatsRequest(t, r, dt, 1e-3, 1e-5, normwise, rule))
            error_stats_many(reqs, dev)
    except Exception:  # pragma: no cover - a device that cannot run them will say so in the real statistics
        pass
