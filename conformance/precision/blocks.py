"""Where a sampled float64 shadow compares a large output: fixed runs, grids and blocks of positions.

Pure functions of shapes (and views of tensors): an op of one shape is always compared at the same place, in the
target run and in any later run, so samples of two runs line up. :class:`UnshadowedError` is what a planner raises
when an output is too large to shadow in full and has no sampled variant. Thread-safe (the caches are
``functools.lru_cache``).
"""
from __future__ import annotations

import functools
import math
from typing import Tuple

import torch


class UnshadowedError(RuntimeError):
    """The op's output is too large to shadow in full and no sampled variant exists."""


def span(n: int, m: int) -> slice:
    """A fixed run of ``min(n, m)`` of ``n`` consecutive positions: a function of ``n`` and ``m`` only, so an op
    of one shape is always compared at the same place."""
    m = max(1, min(n, m))
    start = (n * 7919 + m * 104729) % (n - m + 1)
    return slice(start, start + m)


@functools.lru_cache(maxsize=4096)
def grid(n_rows: int, n_cols: int, max_elements: int) -> Tuple[slice, slice]:
    """A fixed run of rows and one of columns with about ``max_elements`` cells in all."""
    side = max(1, int(math.sqrt(max_elements)))
    nr = min(n_rows, max(side, max_elements // max(1, n_cols)))
    nc = min(n_cols, max(1, max_elements // nr))
    return span(n_rows, nr), span(n_cols, nc)


@functools.lru_cache(maxsize=4096)
def block(shape: Tuple[int, ...], max_elements: int) -> Tuple[int, Tuple[int, ...], slice]:
    """Where a large point-wise output is compared: ``(d, fixed, run)``, every dim before ``d`` at one fixed
    index (``fixed``), a run of dim ``d``, every later dim whole: about ``max_elements`` elements, a view."""
    inner, d = 1, len(shape) - 1
    while d > 0 and inner * shape[d] <= max_elements:
        inner *= shape[d]
        d -= 1
    fixed = tuple(span(shape[g], 1).start for g in range(d))
    return d, fixed, span(shape[d], max(1, max_elements // inner))


def block_slices(where: Tuple[int, Tuple[int, ...], slice], n: int) -> Tuple[slice, ...]:
    """The block ``where`` (:func:`block`) over the first ``n`` dims as keep-dim slices (a fixed position: a slice of
    one), the same for every tensor whose first ``n`` dims are the block's."""
    d, fixed, run = where
    return tuple(slice(fixed[g], fixed[g] + 1) if g < d else (run if g == d else slice(None)) for g in range(n))


def block_of(x: torch.Tensor, shape: Tuple[int, ...], where: Tuple[int, Tuple[int, ...], slice]) -> torch.Tensor:
    """The part of ``x`` (which broadcasts to ``shape``) that meets the block ``where`` (:func:`block`): a view."""
    d, fixed, run = where
    off = len(shape) - x.dim()
    idx = []
    for j, size in enumerate(x.shape):
        g = j + off
        idx.append((0 if size == 1 else fixed[g]) if g < d else (run if g == d and size != 1 else slice(None)))
    return x[tuple(idx)]


def broadcasts_to(shape, target) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without growing it (``torch.broadcast_shapes``
    without its Python cost: the samplers ask once per operand of every large point-wise op)."""
    if len(shape) > len(target):
        return False
    return all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(target)))
