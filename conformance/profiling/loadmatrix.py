"""``inference_load_matrix``: serving latency of a KV-cache language model over a small grid of
batch x prompt length x output length.

Definitions (written into the result's ``definitions``):

- **TTFT** (time to first token): from the request (prompt already on the device) to the first
  generated token available on the host: prefill of the whole prompt, the argmax, a
  synchronisation.
- **ITL** (inter-token latency): time between two consecutive generated tokens, each decode step
  followed by a synchronisation (the token is streamed to the caller); P50/P95/P99 over every gap
  of every repeat.
- **E2E**: from the request to the last token (TTFT + the output_len - 1 gaps); median of repeats.
- **output tokens/s** = batch x output_len / E2E.
- **KV cache**: estimate 2 x layers x kv_heads x head_dim x (batch x (prompt_len + output_len)) x
  bytes per element; measured as the growth of the backend's allocated bytes while the cache is
  created (accelerators), or on the CPU (whose allocator keeps no statistics) as the bytes of the
  storages the cache holds. ``kv_error_pct`` = (estimate - measured) / measured x 100.

Timing: host wall clock (``time.perf_counter``) around each synchronised token, because latency is
what the caller sees; warm-up runs first. Needs a workload with ``new_cache(batch, max_len)``,
``prefill(tokens, cache)`` and ``decode_step(token, cache)`` (the ``gpt`` workload). Not
thread-safe.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Iterable

import torch

from hal.backend import Backend

DEFINITIONS = {
    "ttft_ms": "time to first token: request (prompt on the device) -> first generated token on the host, "
               "prefill included",
    "itl_ms": "inter-token latency: time between consecutive generated tokens (decode step + sync); "
              "P50/P95/P99 over all gaps of all repeats",
    "e2e_ms": "end-to-end latency: request -> last generated token (median of repeats)",
    "output_tokens_per_s": "batch x output_len / e2e",
    "kv_cache_estimate_bytes": "2 x layers x kv_heads x head_dim x batch x (prompt_len + output_len) x bytes",
    "kv_cache_measured_bytes": "accelerator: allocated-bytes growth while the cache is created; CPU: bytes "
                               "of the cache's storages (the CPU allocator keeps no statistics)",
    "kv_error_pct": "(estimate - measured) / measured x 100",
    "timing": "host wall clock around synchronised tokens, after warm-up; medians over repeats",
}


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _generate_timed(w: Any, backend: Backend, prompt: torch.Tensor, output_len: int) -> tuple[float, list[float], float]:
    max_len = prompt.shape[1] + output_len
    backend.synchronize()
    t0 = time.perf_counter()
    cache = w.new_cache(prompt.shape[0], max_len)
    logits, cache = w.prefill(prompt, cache)
    nxt = logits.argmax(-1)
    backend.synchronize()
    t_prev = time.perf_counter()
    ttft = t_prev - t0
    gaps = []
    for _ in range(output_len - 1):
        nxt = w.decode_step(nxt, cache).argmax(-1)
        backend.synchronize()
        t = time.perf_counter()
        gaps.append(t - t_prev)
        t_prev = t
    return ttft * 1e3, [g * 1e3 for g in gaps], (t_prev - t0) * 1e3


def _kv_measured(w: Any, backend: Backend, batch: int, max_len: int) -> tuple[int, str]:
    if backend.device_type != "cpu":
        backend.synchronize()
        before = backend.memory_stats().allocated
        cache = w.new_cache(batch, max_len)
        backend.synchronize()
        grown = backend.memory_stats().allocated - before
        del cache
        return int(grown), "backend memory_stats().allocated growth"
    from hal.models.measure import live_tensor_bytes
    cache = w.new_cache(batch, max_len)
    return live_tensor_bytes(cache.k + cache.v), "bytes of the cache's storages (CPU)"


def inference_load_matrix(workload: Any, backend: Backend, batches: Iterable[int] = (1, 4),
                          prompt_lens: Iterable[int] = (16, 64), output_lens: Iterable[int] = (16,),
                          warmup: int = 1, repeats: int = 3, seed: int = 0) -> dict:
    """Measure every (batch, prompt_len, output_len) cell; returns ``{"rows": [...], "definitions",
    "skipped": [{cell, reason}], "device", "workload"}``. A cell whose prompt_len + output_len exceeds
    the model's ``seq_len`` is skipped with the reason. Raises ValueError when the workload is not
    built or has no KV-cache API, or for output_len < 1 / repeats < 1."""
    for attr in ("new_cache", "prefill", "decode_step"):
        if not hasattr(workload, attr):
            raise ValueError(f"{getattr(workload, 'name', workload)!r} has no {attr}(): the load matrix "
                             "needs a KV-cache language model (gpt)")
    if getattr(workload, "model", None) is None:
        raise ValueError("workload is not built: call build() first")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, not {repeats}")
    cfg = workload.config
    from hal.models.gpt import kv_cache_bytes
    elem = torch.empty((), dtype=workload.dtype).element_size()
    gen = torch.Generator().manual_seed(seed)
    rows, skipped = [], []
    for b in batches:
        for p in prompt_lens:
            for o in output_lens:
                cell = {"batch": int(b), "prompt_len": int(p), "output_len": int(o)}
                if o < 1:
                    raise ValueError(f"output_len must be >= 1, not {o}")
                if p + o > cfg.seq_len:
                    skipped.append({**cell, "reason": f"prompt_len + output_len = {p + o} > seq_len {cfg.seq_len}"})
                    continue
                prompt = backend.to_device(torch.randint(0, cfg.vocab_size, (b, p), generator=gen),
                                           workload.device)
                for _ in range(warmup):
                    _generate_timed(workload, backend, prompt, o)
                ttfts, gaps, e2es = [], [], []
                for _ in range(repeats):
                    ttft, g, e2e = _generate_timed(workload, backend, prompt, o)
                    ttfts.append(ttft)
                    gaps.extend(g)
                    e2es.append(e2e)
                est = kv_cache_bytes(cfg.n_layer, cfg.n_head, cfg.head_dim, b * (p + o), elem)
                measured, source = _kv_measured(workload, backend, b, p + o)
                e2e = statistics.median(e2es)
                rows.append({**cell, "ttft_ms": statistics.median(ttfts),
                             "itl_ms_p50": _percentile(gaps, 50) if gaps else None,
                             "itl_ms_p95": _percentile(gaps, 95) if gaps else None,
                             "itl_ms_p99": _percentile(gaps, 99) if gaps else None,
                             "e2e_ms": e2e, "output_tokens_per_s": b * o / (e2e / 1e3),
                             "kv_cache_estimate_bytes": int(est), "kv_cache_measured_bytes": int(measured),
                             "kv_error_pct": (100.0 * (est - measured) / measured) if measured else None,
                             "kv_measured_source": source, "repeats": repeats, "warmup": warmup})
    from hal.backend import dtype_name
    return {"rows": rows, "skipped": skipped, "definitions": dict(DEFINITIONS),
            "device": backend.device_properties(0).name or backend.name, "backend": backend.name,
            "workload": {"name": getattr(workload, "name", "?"), "config": getattr(workload, "config_name", "?"),
                         "dtype": dtype_name(workload.dtype)}}
