"""Triton layer_norm, rms_norm and fused add + rms_norm over the trailing dims, forward and backward.

One program normalises one row held in registers (rows up to :data:`MAX_BLOCK` elements; the
wrappers send longer rows to torch). Statistics are float32; the forward saves the per-row mean and
1/std (float32) for the backward; no normalised activations are stored.

Backward: which kernels run is a :class:`BwdPlan` per norm, row width and dtype, measured on the
H200 (:data:`BWD_TUNED`; untuned widths take :func:`default_bwd_plan`). The fused plan is one kernel:
each of ``programs_per_sm * SMs`` programs computes the input gradient of a strip of rows, row by
row, and the weight/bias gradients as partial sums over its strip (``[programs, N]`` float32, added
up by ``_norm_part_sum``); wider rows take fewer programs per SM. At 16384 wide, where the row, its
weight and the row-wide accumulators no longer fit the registers, the fused plan may hold the row as two
column tiles and read each twice (``_norm_bwd_split``: the row's statistics first, then dx, the second read
served by the L2), so only the accumulators stay row-wide. The two-stage plan (layer_norm from
16384 wide, every norm at 32768, where a row-wide float32 accumulator per program spills) takes two
kernels: ``_norm_bwd_dx`` writes the input gradient, one row per program (the row in registers up
to :data:`DX_SINGLE_MAX` elements by default and up to 16384 in the tuned layer_norm plans, else two
passes over column tiles), and ``_norm_bwd_dwdb`` is
column-tiled, grid ``(column tiles, row groups)`` with the row groups sized to the SM count (about
``4 * SMs`` programs), each program summing ``dy * xhat`` (and ``dy``) over its strip of rows for
its columns into a ``[row groups, N]`` float32 buffer (dw's and db's share one allocation, db's rows after
dw's, each kernel given its pointer and db's offset: one ``torch.empty`` fewer per call). Either way one more kernel, ``_norm_part_sum``,
adds up the partial sums column by column and writes dw (and db) in the weight's (and bias's) dtype and
shape: one launch where ``sum(0)``, a cast and a view per gradient were three to five ops of host time
(issue 23).

The public wrappers (:func:`layer_norm`, :func:`rms_norm`, :func:`add_rms_norm`) take every call
of their op: what the kernels do not take, or what :mod:`routing` sends to torch (small inputs, where
launch overhead exceeds the GPU time), goes straight to torch's function, decided once at forward.

``add_rms_norm(x, residual)`` returns ``(rms_norm(h), h)`` with ``h = x + residual`` rounded to the
storage dtype first, exactly what the unfused torch sequence computes; its backward adds the
gradient flowing into ``h`` to the normalisation's.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from hal.backend import dtype_name
from hal.backends.cuda.kernels import routing, supports_add_rms_norm, supports_layer_norm, supports_rms_norm
from hal.backends.cuda.kernels._rows import as_rows, next_power_of_2, num_warps_for, self_checking, sm_count
from hal.backends.cuda.kernels.launcher import Launcher, aligned, int_class
from hal.ops import torch_impl

#: untuned widths: rows up to this many elements take the fused one-kernel backward; wider rows the two-stage one
FUSED_BWD_MAX_N = 4096
#: the dx kernel keeps rows up to this many elements (power of two) in registers; wider rows loop
DX_SINGLE_MAX = 8192
#: column tile of the looped dx kernel
DX_TILE = 4096
#: tile of the weight-gradient kernel: rows x columns
DW_BLOCK_M, DW_BLOCK_N = 16, 256
#: programs per SM the weight-gradient grid aims at
DW_PROGRAMS_PER_SM = 4


@triton.jit
def _norm_fwd(X, R, Y, H, W, B, Mean, Rstd, stride_x, stride_r, stride_y, stride_h, N, eps,
              BLOCK: tl.constexpr, IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
              HAS_B: tl.constexpr, STATS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(H.dtype.element_ty)
        tl.store(H + row * stride_h + cols, h, mask=mask)
        x = h.to(tl.float32)
    if IS_RMS:
        xc = x
    else:
        mean = tl.sum(x, 0) / N
        xc = tl.where(mask, x - mean, 0.0)
        if STATS:
            tl.store(Mean + row, mean)
    var = tl.sum(xc * xc, 0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    if STATS:
        tl.store(Rstd + row, rstd)
    y = xc * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd(DY, X, W, Mean, Rstd, DH, DX, PART, stride_dy, stride_x, stride_dh, stride_dx, M, N,
              rows_per_prog, db_off, BLOCK: tl.constexpr, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
              HAS_B: tl.constexpr, HAS_DH: tl.constexpr):
    # xhat = (x - mean) * rstd ; g = dy * w
    # layer_norm: dx = rstd * (g - mean(g * xhat) * xhat - mean(g))
    # rms_norm:   dx = rstd * (g - mean(g * xhat) * xhat)
    # program pid's dw (db) partial sums -> row pid of PART (of PART + db_off), each [programs, N] float32
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK], tl.float32)
    db_acc = tl.zeros([BLOCK], tl.float32)
    first = pid.to(tl.int64) * rows_per_prog
    for i in range(0, rows_per_prog):
        row64 = first + i
        # the last program may have fewer rows: past M everything is masked (dy = 0 adds nothing)
        rmask = mask & (row64 < M)
        x = tl.load(X + row64 * stride_x + cols, mask=rmask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row64 * stride_dy + cols, mask=rmask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row64, mask=row64 < M, other=0.0)
        if IS_RMS:
            xhat = x * rstd
        else:
            xhat = tl.where(mask, (x - tl.load(Mean + row64, mask=row64 < M, other=0.0)) * rstd, 0.0)
        if HAS_W:
            g = dy * w
        else:
            g = dy
        c1 = tl.sum(g * xhat, 0) / N
        if IS_RMS:
            dx = (g - xhat * c1) * rstd
        else:
            c2 = tl.sum(g, 0) / N
            dx = (g - xhat * c1 - c2) * rstd
        if HAS_DH:
            dx += tl.load(DH + row64 * stride_dh + cols, mask=rmask, other=0.0).to(tl.float32)
        tl.store(DX + row64 * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=rmask)
        if HAS_W:
            dw_acc += dy * xhat
        if HAS_B:
            db_acc += dy
    if HAS_W:
        tl.store(PART + pid * N + cols, dw_acc, mask=mask)
    if HAS_B:
        tl.store(PART + db_off + pid * N + cols, db_acc, mask=mask)


@triton.jit
def _split_sums(DY, X, W, row64, stride_dy, stride_x, start, N, mean, rstd, rvalid, TILE: tl.constexpr,
                HAS_W: tl.constexpr):
    """``(sum(g * xhat), sum(g))`` over one column tile of one row (``_norm_bwd_split``'s first pass; the loads
    ask the L2 to keep the tile for the second)."""
    cols = start + tl.arange(0, TILE)
    cmask = cols < N
    mask = cmask & rvalid
    x = tl.load(X + row64 * stride_x + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    dy = tl.load(DY + row64 * stride_dy + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    if HAS_W:
        g = dy * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        g = dy
    return tl.sum(g * xhat, 0), tl.sum(g, 0)


@triton.jit
def _split_dx(DY, X, W, DH, DX, row64, stride_dy, stride_x, stride_dh, stride_dx, start, N, mean, rstd, c1, c2,
              rvalid, acc_w, acc_b, TILE: tl.constexpr, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
              HAS_B: tl.constexpr, HAS_DH: tl.constexpr):
    """dx of one column tile of one row (``_norm_bwd_split``'s second pass: the tile read again, from the L2)
    and the tile's dw (db) accumulators with the row added."""
    cols = start + tl.arange(0, TILE)
    cmask = cols < N
    mask = cmask & rvalid
    # another eviction policy than the first pass's loads: the compiler must not merge the two reads (it would keep
    # the whole row in registers, which is what this kernel avoids)
    x = tl.load(X + row64 * stride_x + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    dy = tl.load(DY + row64 * stride_dy + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    if HAS_W:
        g = dy * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        g = dy
    if IS_RMS:
        dx = (g - xhat * c1) * rstd
    else:
        dx = (g - xhat * c1 - c2) * rstd
    if HAS_DH:
        dx += tl.load(DH + row64 * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(DX + row64 * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    if HAS_W:
        acc_w += dy * xhat
    if HAS_B:
        acc_b += dy
    return acc_w, acc_b


@triton.jit
def _norm_bwd_split(DY, X, W, Mean, Rstd, DH, DX, PART, stride_dy, stride_x, stride_dh, stride_dx, M, N,
                    rows_per_prog, db_off, TILE: tl.constexpr, S: tl.constexpr, IS_RMS: tl.constexpr,
                    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_DH: tl.constexpr):
    """``_norm_bwd`` for wide rows: the row in ``S`` (2 or 4) column tiles of ``TILE``, read twice (the row's
    statistics, then dx: the second read hits the L2), so that only the dw/db accumulators stay row-wide in
    registers, one ``[TILE]`` pair per tile. Same arguments and partial sums as ``_norm_bwd``."""
    pid = tl.program_id(0)
    a0 = tl.zeros([TILE], tl.float32)
    b0 = a0
    a1 = a0
    b1 = a0
    a2 = a0
    b2 = a0
    a3 = a0
    b3 = a0
    first = pid.to(tl.int64) * rows_per_prog
    for i in range(0, rows_per_prog):
        row64 = first + i
        rvalid = row64 < M
        rstd = tl.load(Rstd + row64, mask=rvalid, other=0.0)
        if IS_RMS:
            mean = 0.0
        else:
            mean = tl.load(Mean + row64, mask=rvalid, other=0.0)
        s1, s2 = _split_sums(DY, X, W, row64, stride_dy, stride_x, 0, N, mean, rstd, rvalid, TILE, HAS_W)
        t1, t2 = _split_sums(DY, X, W, row64, stride_dy, stride_x, TILE, N, mean, rstd, rvalid, TILE, HAS_W)
        s1 += t1
        s2 += t2
        if S == 4:
            t1, t2 = _split_sums(DY, X, W, row64, stride_dy, stride_x, 2 * TILE, N, mean, rstd, rvalid, TILE, HAS_W)
            s1 += t1
            s2 += t2
            t1, t2 = _split_sums(DY, X, W, row64, stride_dy, stride_x, 3 * TILE, N, mean, rstd, rvalid, TILE, HAS_W)
            s1 += t1
            s2 += t2
        c1 = s1 / N
        c2 = s2 / N
        a0, b0 = _split_dx(DY, X, W, DH, DX, row64, stride_dy, stride_x, stride_dh, stride_dx, 0, N, mean, rstd, c1,
                           c2, rvalid, a0, b0, TILE, IS_RMS, HAS_W, HAS_B, HAS_DH)
        a1, b1 = _split_dx(DY, X, W, DH, DX, row64, stride_dy, stride_x, stride_dh, stride_dx, TILE, N, mean, rstd, c1,
                           c2, rvalid, a1, b1, TILE, IS_RMS, HAS_W, HAS_B, HAS_DH)
        if S == 4:
            a2, b2 = _split_dx(DY, X, W, DH, DX, row64, stride_dy, stride_x, stride_dh, stride_dx, 2 * TILE, N, mean,
                               rstd, c1, c2, rvalid, a2, b2, TILE, IS_RMS, HAS_W, HAS_B, HAS_DH)
            a3, b3 = _split_dx(DY, X, W, DH, DX, row64, stride_dy, stride_x, stride_dh, stride_dx, 3 * TILE, N, mean,
                               rstd, c1, c2, rvalid, a3, b3, TILE, IS_RMS, HAS_W, HAS_B, HAS_DH)
    cols = tl.arange(0, TILE)
    if HAS_W:
        tl.store(PART + pid * N + cols, a0, mask=cols < N)
        tl.store(PART + pid * N + TILE + cols, a1, mask=TILE + cols < N)
        if S == 4:
            tl.store(PART + pid * N + 2 * TILE + cols, a2, mask=2 * TILE + cols < N)
            tl.store(PART + pid * N + 3 * TILE + cols, a3, mask=3 * TILE + cols < N)
    if HAS_B:
        tl.store(PART + db_off + pid * N + cols, b0, mask=cols < N)
        tl.store(PART + db_off + pid * N + TILE + cols, b1, mask=TILE + cols < N)
        if S == 4:
            tl.store(PART + db_off + pid * N + 2 * TILE + cols, b2, mask=2 * TILE + cols < N)
            tl.store(PART + db_off + pid * N + 3 * TILE + cols, b3, mask=3 * TILE + cols < N)


@triton.jit
def _norm_bwd_dx(DY, X, W, Mean, Rstd, DH, DX, stride_dy, stride_x, stride_dh, stride_dx, N,
                 TILE: tl.constexpr, SINGLE: tl.constexpr, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
                 HAS_DH: tl.constexpr):
    """dx of one row (the formulas of ``_norm_bwd``); writes nothing else."""
    row = tl.program_id(0).to(tl.int64)
    rstd = tl.load(Rstd + row)
    if IS_RMS:
        mean = 0.0
    else:
        mean = tl.load(Mean + row)
    if SINGLE:
        cols = tl.arange(0, TILE)
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        if HAS_W:
            g = dy * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            g = dy
        c1 = tl.sum(g * xhat, 0) / N
        if IS_RMS:
            dx = (g - xhat * c1) * rstd
        else:
            dx = (g - xhat * c1 - tl.sum(g, 0) / N) * rstd
        if HAS_DH:
            dx += tl.load(DH + row * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    else:
        acc1 = tl.zeros([TILE], tl.float32)
        acc2 = tl.zeros([TILE], tl.float32)
        for start in range(0, N, TILE):
            cols = start + tl.arange(0, TILE)
            mask = cols < N
            x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            if HAS_W:
                g = dy * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            else:
                g = dy
            acc1 += g * xhat
            acc2 += g
        c1 = tl.sum(acc1, 0) / N
        c2 = tl.sum(acc2, 0) / N
        for start in range(0, N, TILE):
            cols = start + tl.arange(0, TILE)
            mask = cols < N
            x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
            xhat = (x - mean) * rstd
            if HAS_W:
                g = dy * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            else:
                g = dy
            if IS_RMS:
                dx = (g - xhat * c1) * rstd
            else:
                dx = (g - xhat * c1 - c2) * rstd
            if HAS_DH:
                dx += tl.load(DH + row * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd_dwdb(DY, X, Mean, Rstd, PART, stride_dy, stride_x, M, N, rows_per_group, db_off,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
                   HAS_B: tl.constexpr):
    """Partial dw = sum(dy * xhat) and db = sum(dy) of one row group for BLOCK_N columns -> row ``group``
    of the ``[groups, N]`` float32 partial sums at PART (dw's) and PART + db_off (db's)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    group = tl.program_id(1)
    first = group.to(tl.int64) * rows_per_group
    last = tl.minimum(first + rows_per_group, M)
    dw = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    db = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, rows_per_group, BLOCK_M):
        rows = first + start + tl.arange(0, BLOCK_M)
        rmask = rows < last
        m2 = rmask[:, None] & cmask[None, :]
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=m2, other=0.0).to(tl.float32)
        if HAS_W:
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=m2, other=0.0).to(tl.float32)
            rstd = tl.load(Rstd + rows, mask=rmask, other=0.0)
            if IS_RMS:
                xhat = x * rstd[:, None]
            else:
                mean = tl.load(Mean + rows, mask=rmask, other=0.0)
                xhat = (x - mean[:, None]) * rstd[:, None]
            dw += tl.where(m2, dy * xhat, 0.0)
        if HAS_B:
            db += dy
    if HAS_W:
        tl.store(PART + group * N + cols, tl.sum(dw, 0), mask=cmask)
    if HAS_B:
        tl.store(PART + db_off + group * N + cols, tl.sum(db, 0), mask=cmask)


@triton.jit
def _norm_part_sum(PART, DW, DB, P, N, db_off, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_P: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """dw (db) = the ``[P, N]`` float32 partial sums at PART (PART + db_off) added up over P, for BLOCK_N columns,
    in DW's (DB's) dtype."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc_w = tl.zeros([BLOCK_P, BLOCK_N], tl.float32)
    acc_b = tl.zeros([BLOCK_P, BLOCK_N], tl.float32)
    for p0 in range(0, P, BLOCK_P):
        r = p0 + tl.arange(0, BLOCK_P)
        m = (r < P)[:, None] & cmask[None, :]
        off = r.to(tl.int64)[:, None] * N + cols[None, :]
        if HAS_W:
            acc_w += tl.load(PART + off, mask=m, other=0.0)
        if HAS_B:
            acc_b += tl.load(PART + db_off + off, mask=m, other=0.0)
    if HAS_W:
        tl.store(DW + cols, tl.sum(acc_w, 0).to(DW.dtype.element_ty), mask=cmask)
    if HAS_B:
        tl.store(DB + cols, tl.sum(acc_b, 0).to(DB.dtype.element_ty), mask=cmask)


#: the partial sums' tile per program and step: rows of partial sums, columns (a program per column tile)
PART_BLOCK_P, PART_BLOCK_N = 128, 32

_FWD, _BWD, _BWD_DX, _BWD_DWDB = Launcher(_norm_fwd), Launcher(_norm_bwd), Launcher(_norm_bwd_dx), Launcher(_norm_bwd_dwdb)
_BWD_SPLIT = Launcher(_norm_bwd_split)
_PART_SUM = Launcher(_norm_part_sum)

#: launch parameters per row width (computed once per N): forward (block, warps); backward below
_fwd_params: dict = {}
_bwd_params: dict = {}


def _fwd(n: int):
    # keyed by the warps heuristic too: benchmarks/bench_kernels.py --sweep swaps it at run time
    key = (n, num_warps_for)
    p = _fwd_params.get(key)
    if p is None:
        block = next_power_of_2(n)
        p = _fwd_params[key] = (block, num_warps_for(block))
    return p


@dataclasses.dataclass(frozen=True)
class BwdPlan:
    """How :func:`norm_backward` runs for one norm, row width and dtype.

    ``fused``: one ``_norm_bwd`` kernel, ``min(rows, programs_per_sm * SMs)`` programs, each a strip
    of rows (the row of ``block`` elements in registers) with its dw/db partial sums, then one
    ``sum(0)``; with ``split`` > 1 the ``_norm_bwd_split`` kernel, the row in ``split`` column tiles read
    twice (statistics, then dx from the L2), only the dw/db accumulators row-wide. Else the two-stage path:
    ``_norm_bwd_dx`` (the row in registers when ``single``, else looped in tiles of ``block``) and the
    column-tiled ``_norm_bwd_dwdb``. ``warps``: the first kernel's. :attr:`name` is the plan's name in
    :data:`BWD_TUNED` and the tuner's tables; :func:`plan_named` reads it back."""

    fused: bool
    block: int
    single: bool
    warps: int
    programs_per_sm: int = 4
    #: fused only: the row in this many column tiles (``_norm_bwd_split``: 2 or 4), read twice; 1: held whole
    split: int = 1

    @property
    def name(self) -> str:
        if self.fused:
            return f"fused p{self.programs_per_sm} w{self.warps}" + (f" s{self.split}" if self.split > 1 else "")
        return f"two-stage single w{self.warps}" if self.single else f"two-stage looped w{self.warps}"


def plan_named(name: str, n: int) -> BwdPlan:
    """The plan called ``name`` for rows of ``n`` elements: ``"two-stage"`` (:func:`two_stage_plan`),
    ``"two-stage single wW"`` (the dx row in registers, W warps), ``"two-stage looped wW"`` or
    ``"fused pP wW"``, ``"fused pP wW sS"`` (the row in S = 2 or 4 tiles, :attr:`BwdPlan.split`)
    (:class:`BwdPlan`). Raises ValueError for another name."""
    words = name.split()
    block = next_power_of_2(n)
    try:
        if words == ["two-stage"]:
            return two_stage_plan(n)
        warps = int(words[-1][1:]) if words[0] == "two-stage" else int(words[2][1:])
        if words[0] == "two-stage" and len(words) == 3 and words[1] in ("single", "looped") and words[2][0] == "w":
            single = words[1] == "single"
            return BwdPlan(False, block if single else DX_TILE, single, warps)
        if words[0] == "fused" and len(words) == 3 and words[1][0] == "p" and words[2][0] == "w":
            return BwdPlan(True, block, True, warps, int(words[1][1:]))
        if words[0] == "fused" and len(words) == 4 and words[1][0] == "p" and words[2][0] == "w" \
                and words[3] in ("s2", "s4"):
            return BwdPlan(True, block, True, warps, int(words[1][1:]), int(words[3][1:]))
    except (IndexError, ValueError):
        pass
    raise ValueError(f"not a norm backward plan name: {name!r}")


#: measured on the H200 (benchmarks/tune_norm_bwd.py, reports/cuda/tune_norm_bwd.json): per
#: (norm, dtype, row block), the name of the fastest plan (:func:`plan_named`). Fewer programs as rows
#: widen: each keeps a row-wide float32 accumulator. Blocks not listed take :func:`default_bwd_plan`.
#: add_rms_norm (the same kernel plus dh) has its own entries, tuned with that extra gradient; rms_norm's serve it
#: where it has none. The three ``fused ... s2`` entries at 16384 wide (the row in two tiles read twice,
#: ``_norm_bwd_split``) were tuned on an H100 (reports/cuda/h100/tune_norm_bwd_split-62ff08f.json, 8192 and 16384 wide only),
#: where they beat the H200's choices by 1.16-1.37x (layer_norm bfloat16 16384 x 16384: 752 against 1032 us; rms_norm
#: float32 1112 against 1292; add_rms_norm float32 1522 against 1870); where a split plan was within 3% of the old
#: choice, the old one stays.
BWD_TUNED: dict = {
    ("layer_norm", "float32", 1024): "fused p8 w4",
    ("rms_norm", "float32", 1024): "fused p8 w4",
    ("layer_norm", "float32", 4096): "fused p2 w8",
    ("rms_norm", "float32", 4096): "fused p2 w16",
    ("layer_norm", "float32", 8192): "fused p1 w8",
    ("rms_norm", "float32", 8192): "fused p1 w16",
    ("layer_norm", "float32", 16384): "two-stage single w16",
    ("rms_norm", "float32", 16384): "fused p2 w8 s2",  # H100 (below)
    ("layer_norm", "float32", 32768): "two-stage",
    ("rms_norm", "float32", 32768): "two-stage",
    ("layer_norm", "bfloat16", 1024): "fused p8 w4",
    ("rms_norm", "bfloat16", 1024): "fused p8 w4",
    ("layer_norm", "bfloat16", 4096): "fused p2 w8",
    ("rms_norm", "bfloat16", 4096): "fused p2 w8",
    ("layer_norm", "bfloat16", 8192): "fused p1 w8",
    ("rms_norm", "bfloat16", 8192): "fused p1 w16",
    ("layer_norm", "bfloat16", 16384): "fused p1 w8 s2",  # H100 (below)
    ("rms_norm", "bfloat16", 16384): "fused p1 w16",
    ("layer_norm", "bfloat16", 32768): "two-stage",
    ("rms_norm", "bfloat16", 32768): "two-stage",
    # add_rms_norm (reports/cuda/tune_norm_bwd-add_rms_norm.json, b2568f4): at 16384 wide rms_norm's plans, and no plan
    # reaches Liger's fused_add_rms_norm there (fp32 1298 vs 1108 us, bf16 654 vs 620 at 16384 x 16384)
    ("add_rms_norm", "float32", 1024): "fused p4 w8",
    ("add_rms_norm", "float32", 4096): "fused p2 w8",
    ("add_rms_norm", "float32", 8192): "fused p2 w16",
    ("add_rms_norm", "float32", 16384): "fused p2 w8 s2",  # H100 (below)
    ("add_rms_norm", "float32", 32768): "two-stage",
    ("add_rms_norm", "bfloat16", 1024): "fused p4 w8",
    ("add_rms_norm", "bfloat16", 4096): "fused p2 w16",
    ("add_rms_norm", "bfloat16", 8192): "fused p1 w8",
    ("add_rms_norm", "bfloat16", 16384): "fused p1 w16",
    ("add_rms_norm", "bfloat16", 32768): "two-stage",
}


def default_bwd_plan(n: int) -> BwdPlan:
    """The untuned plan for rows of ``n`` elements: fused up to :data:`FUSED_BWD_MAX_N`, else two-stage."""
    block = next_power_of_2(n)
    if n <= FUSED_BWD_MAX_N:
        return BwdPlan(True, block, True, num_warps_for(block))
    return two_stage_plan(n)


def two_stage_plan(n: int) -> BwdPlan:
    """The two-stage plan for rows of ``n`` elements."""
    block = next_power_of_2(n)
    if block <= DX_SINGLE_MAX:
        return BwdPlan(False, block, True, 16 if block >= 8192 else num_warps_for(block))
    return BwdPlan(False, DX_TILE, False, num_warps_for(DX_TILE))


def bwd_plan(n: int, dtype: torch.dtype, is_rms: bool, has_dh: bool = False) -> BwdPlan:
    """The plan for rows of ``n`` elements of ``dtype`` (cached): :data:`BWD_TUNED`'s where it has one (with
    ``has_dh``, add_rms_norm's backward, its own entry first, then rms_norm's)."""
    key = (n, dtype, is_rms, has_dh, num_warps_for)
    p = _bwd_params.get(key)
    if p is None:
        dn, block = dtype_name(dtype), next_power_of_2(n)
        name = BWD_TUNED.get(("add_rms_norm", dn, block)) if has_dh else None
        if name is None:
            name = BWD_TUNED.get(("rms_norm" if is_rms else "layer_norm", dn, block))
        p = _bwd_params[key] = default_bwd_plan(n) if name is None else plan_named(name, n)
    return p


def _like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``t``'s shape and dtype on its device (``empty_like`` where that
    gives a contiguous one: one argument for torch to parse instead of three)."""
    return torch.empty_like(t) if t.dim() == 1 else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _flat(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if t is None or (t.dim() == 1 and t.is_contiguous()):
        return t
    return t.reshape(-1).contiguous()


def dw_groups(rows: int, n: int, sms: int) -> tuple[int, int]:
    """``(row groups, rows per group)`` of the weight-gradient grid for ``rows x n``: about
    ``DW_PROGRAMS_PER_SM * sms`` programs over the column tiles, each group a multiple of
    ``DW_BLOCK_M`` rows, no empty group."""
    col_tiles = -(-n // DW_BLOCK_N)
    want = max(1, -(-DW_PROGRAMS_PER_SM * sms // col_tiles))
    groups = max(1, min(want, -(-rows // DW_BLOCK_M)))
    per = -(-rows // groups)
    per = -(-per // DW_BLOCK_M) * DW_BLOCK_M
    return -(-rows // per), per


def norm_forward(x, residual, weight, bias, eps: float, is_rms: bool, n: int, stats: bool = True):
    """Returns ``(y, h, mean, rstd)``; ``h`` is None without a residual, ``mean`` None for RMS; without
    ``stats`` (a forward no backward will follow) the per-row statistics are neither allocated nor
    written, and ``mean`` and ``rstd`` are None."""
    x2 = as_rows(x if x.shape[-1] == n else x.reshape(-1, n))
    rows = x2.shape[0]
    dev = x.device
    y = torch.empty_like(x2)  # [rows, n] contiguous (_rows.as_rows), one argument to parse
    if residual is not None:
        r2 = as_rows(residual if residual.shape[-1] == n else residual.reshape(-1, n))
        h = torch.empty_like(x2)
    else:
        r2 = h = None
    mean = torch.empty(rows, dtype=torch.float32, device=dev) if stats and not is_rms else None
    rstd = torch.empty(rows, dtype=torch.float32, device=dev) if stats else None
    block, warps = _fwd(n)
    w, b = _flat(weight), _flat(bias)
    if rows:
        r_, h_ = (x2, y) if r2 is None else (r2, h)
        w_ = x2 if w is None else w
        b_ = x2 if b is None else b
        s_ = y if rstd is None else rstd  # Mean and Rstd are not written without stats
        args = (x2, r_, y, h_, w_, b_, s_ if mean is None else mean, s_, x2.stride(0), r_.stride(0), y.stride(0),
                h_.stride(0), n, float(eps))
        # the launch key (launcher's contract): the tensors' device and dtypes, the int arguments' values, the
        # constexprs (block and warps follow from n); the caller's tensors checked for alignment (what this
        # function allocates comes from PyTorch's CUDA allocator, whose blocks are aligned far beyond 16 bytes)
        key = (x2.get_device(), x2.dtype, r_.dtype, None if w is None else w.dtype, None if b is None else b.dtype,
               is_rms, r2 is None, stats) + args[8:13] if aligned(x2, r_, w_, b_) else None
        _FWD((rows, 1, 1), key, args, dict(BLOCK=block, IS_RMS=is_rms, HAS_RES=r2 is not None, HAS_W=w is not None,
                                           HAS_B=b is not None, STATS=stats, num_warps=warps))
    if x.dim() != 2 or x.shape[1] != n:  # else y already has x's shape (a view costs host time)
        y = y.view(x.shape)
        h = None if h is None else h.view(x.shape)
    return y, h, mean, rstd


def norm_backward(dy, x, weight, bias, mean, rstd, dh, is_rms: bool, n: int, plan: Optional[BwdPlan] = None):
    """Returns ``(dx, dw, db)``: dw (db) None without a weight (bias), else in the weight's (bias's) dtype and
    shape (``bias`` is read for those only); ``dh`` is the extra gradient into ``h`` (added to dx).
    ``plan`` (default :func:`bwd_plan`'s for ``n``, x's dtype and the norm) says which kernels run."""
    dy2 = as_rows(dy if dy.shape[-1] == n else dy.reshape(-1, n))
    x2 = as_rows(x if x.shape[-1] == n else x.reshape(-1, n))
    dh2 = None if dh is None else as_rows(dh if dh.shape[-1] == n else dh.reshape(-1, n))
    rows = x2.shape[0]
    dev = x.device
    dx = torch.empty_like(x2)
    has_w, has_bias = weight is not None, bias is not None
    # dw's and db's float32 partial sums, [programs, n] each, share one buffer (db's at row ``programs``):
    # one allocation fewer per call
    parts = has_w + has_bias
    w = _flat(weight)
    plan = plan or bwd_plan(n, x.dtype, is_rms, dh is not None)
    mean_ = rstd if mean is None else mean
    w_ = x2 if w is None else w
    dh_ = dy2 if dh2 is None else dh2
    # launch keys (launcher's contract): device, dtypes, which optional tensors are there, the plan (its
    # constexprs), and the int arguments' values or, for row counts, their specialisation class
    base = (x2.get_device(), dy2.dtype, x2.dtype, w_.dtype, dh_.dtype, is_rms, has_w, has_bias, dh2 is None,
            plan.block, plan.single, plan.warps, plan.split) if aligned(dy2, x2, w_, dh_) else None  # the rest: ours
    if plan.fused or not rows:
        progs = max(1, min(rows, plan.programs_per_sm * sm_count(dev))) if rows else 1
        per = -(-rows // progs) if rows else 0
        new = torch.empty if rows else torch.zeros  # no rows: no program writes the partial sums
        part = new((parts * progs, n), dtype=torch.float32, device=dev) if parts else rstd
        db_off = progs * n if has_w else 0
        if rows:
            args = (dy2, x2, w_, mean_, rstd, dh_, dx, part, dy2.stride(0), x2.stride(0), dh_.stride(0),
                    dx.stride(0), rows, n, per, db_off)
            key = None if base is None else base + args[8:12] + (int_class(rows), n, int_class(per),
                                                                 int_class(db_off))
            flags = dict(IS_RMS=is_rms, HAS_W=has_w, HAS_B=has_bias, HAS_DH=dh2 is not None, num_warps=plan.warps)
            if plan.split > 1:
                _BWD_SPLIT((progs, 1, 1), key, args, dict(TILE=plan.block // plan.split, S=plan.split, **flags))
            else:
                _BWD((progs, 1, 1), key, args, dict(BLOCK=plan.block, **flags))
    else:
        args = (dy2, x2, w_, mean_, rstd, dh_, dx, dy2.stride(0), x2.stride(0), dh_.stride(0), dx.stride(0), n)
        _BWD_DX((rows, 1, 1), None if base is None else base + args[7:], args,
                dict(TILE=plan.block, SINGLE=plan.single, IS_RMS=is_rms, HAS_W=has_w, HAS_DH=dh2 is not None,
                     num_warps=plan.warps))
        part, progs, db_off = rstd, 0, 0
        if parts:
            progs, per = dw_groups(rows, n, sm_count(dev))
            part = torch.empty((parts * progs, n), dtype=torch.float32, device=dev)
            db_off = progs * n if has_w else 0
            args = (dy2, x2, mean_, rstd, part, dy2.stride(0), x2.stride(0), rows, n, per, db_off)
            key = None if base is None else base + args[5:7] + (int_class(rows), n, int_class(per),
                                                                int_class(db_off))
            _BWD_DWDB((-(-n // DW_BLOCK_N), progs, 1), key, args,
                      dict(BLOCK_M=DW_BLOCK_M, BLOCK_N=DW_BLOCK_N, IS_RMS=is_rms, HAS_W=has_w, HAS_B=has_bias,
                           num_warps=8))
    dw = _like(weight) if has_w else None
    db = _like(bias) if has_bias else None
    if parts:
        args = (part, part if dw is None else dw, part if db is None else db, progs, n, db_off)
        # dw, db and the partial sums: ours (allocated here, contiguous and aligned)
        key = (x2.get_device(), None if dw is None else dw.dtype, None if db is None else db.dtype,
               int_class(progs), n, int_class(db_off))
        _PART_SUM((-(-n // PART_BLOCK_N), 1, 1), key, args,
                  dict(HAS_W=has_w, HAS_B=has_bias, BLOCK_P=PART_BLOCK_P, BLOCK_N=PART_BLOCK_N, num_warps=4))
    return (dx if x.dim() == 2 and x.shape[1] == n else dx.view(x.shape)), dw, db


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, n):  # type: ignore[override]
        y, _, mean, rstd = norm_forward(x, None, weight, bias, eps, False, n)
        ctx.save_for_backward(x, weight, bias, mean, rstd)  # bias: its dtype and shape, for db
        ctx.n = n
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = norm_backward(dy, x, weight, bias, mean, rstd, None, False, ctx.n)
        return dx, dw, db, None, None


class RmsNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps, n):  # type: ignore[override]
        y, h, _, rstd = norm_forward(x, residual, weight, None, eps, True, n)
        ctx.save_for_backward(h if h is not None else x, weight, rstd)
        ctx.n, ctx.has_res = n, residual is not None
        if h is not None:
            return y, h
        return y

    @staticmethod
    def backward(ctx, dy, dh=None):  # type: ignore[override]
        h, weight, rstd = ctx.saved_tensors
        dx, dw, _ = norm_backward(dy, h, weight, None, None, rstd, dh if ctx.has_res else None, True, ctx.n)
        return dx, (dx if ctx.has_res else None), dw, None, None


def _n(normalized_shape: Sequence[int]) -> int:
    n = 1
    for s in normalized_shape:
        n *= int(s)
    return n


def _eps(input: torch.Tensor, eps: Optional[float]) -> float:
    return torch.finfo(input.dtype).eps if eps is None else float(eps)


#: routing's per-op floors (routing.floors): each wrapper compares the input's size with its op's first;
#: below it the call is torch's whatever the dtype, the mode and the predicate would say
_FLOORS = routing.floors()
#: what a call the kernel does not take runs: torch's builtins (``F.layer_norm``'s and ``F.rms_norm``'s
#: arguments and results, one Python frame fewer)
_torch_layer_norm = torch_impl.direct("layer_norm")
_torch_rms_norm = torch_impl.direct("rms_norm")


@self_checking
def layer_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm`` over the trailing ``normalized_shape`` dims, for every call: the kernel where
    :func:`~hal.backends.cuda.kernels.supports_layer_norm` accepts the call and :mod:`routing` says so,
    else torch's layer_norm."""
    try:
        small = input.numel() < _FLOORS["layer_norm"]  # below: torch, any dtype and mode
    except AttributeError:  # not a tensor: the predicate says so
        small = False
    if not small and supports_layer_norm(input, normalized_shape, weight, bias) is None:
        mode = routing.mode(input, weight, bias)
        if routing.decide("layer_norm", input.dtype, mode, input.numel()):
            if mode == "train":
                return LayerNormFunction.apply(input, weight, bias, eps, _n(normalized_shape))
            return norm_forward(input, None, weight, bias, eps, False, _n(normalized_shape), stats=False)[0]
    return _torch_layer_norm(input, normalized_shape, weight, bias, eps)


@self_checking
def rms_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None) -> torch.Tensor:
    """``F.rms_norm`` over the trailing ``normalized_shape`` dims (eps None: the dtype's machine eps), for
    every call: the kernel where the predicate and :mod:`routing` allow, else torch's rms_norm."""
    try:
        small = input.numel() < _FLOORS["rms_norm"]  # below: torch, any dtype and mode
    except AttributeError:  # not a tensor: the predicate says so
        small = False
    if not small and supports_rms_norm(input, normalized_shape, weight) is None:
        mode = routing.mode(input, weight)
        if routing.decide("rms_norm", input.dtype, mode, input.numel()):
            if mode == "train":
                return RmsNormFunction.apply(input, None, weight, _eps(input, eps), _n(normalized_shape))
            return norm_forward(input, None, weight, None, _eps(input, eps), True, _n(normalized_shape), stats=False)[0]
    return _torch_rms_norm(input, normalized_shape, weight, eps)


@self_checking
def add_rms_norm(input: torch.Tensor, residual: torch.Tensor, normalized_shape: Sequence[int],
                 weight: Optional[torch.Tensor] = None, eps: Optional[float] = None):
    """``h = input + residual``; returns ``(rms_norm(h), h)`` in one pass, for every call: the kernel
    where the predicate and :mod:`routing` allow, else the unfused torch sequence."""
    try:
        small = input.numel() < _FLOORS["add_rms_norm"]  # below: torch, any dtype and mode
    except AttributeError:  # not a tensor: the predicate says so
        small = False
    if not small and supports_add_rms_norm(input, residual, normalized_shape, weight) is None:
        mode = routing.mode(input, residual, weight)
        if routing.decide("add_rms_norm", input.dtype, mode, input.numel()):
            if mode == "train":
                y, h = RmsNormFunction.apply(input, residual, weight, _eps(input, eps), _n(normalized_shape))
                return y, h
            y, h, _, _ = norm_forward(input, residual, weight, None, _eps(input, eps), True, _n(normalized_shape),
                                      stats=False)
            return y, h
    return torch_impl.add_rms_norm(input, residual, normalized_shape, weight, eps)
