"""all_reduce bus bandwidth through the HAL Communicator against raw torch.distributed (and CuPy's
NCCL bindings), in the same processes, on the same NCCL communicator.

Run with torchrun, one process per GPU:
    torchrun --standalone --nproc_per_node 2 benchmarks/bench_collectives.py --json out.json
For each size (16 MiB .. 1 GiB, float32 by default) and path, ``iters`` back-to-back all_reduces are
timed with CUDA events after a warm-up; the median of ``trials`` gives the time per call. Bus
bandwidth = size / time x 2(n-1)/n (nccl-tests' convention). The paths alternate inside each trial
so clock and thermal drift hit them alike. Rank 0 prints the table and writes the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

MiB = 1 << 20


def _time_ms(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def _cupy_allreduce(rank: int, world: int):
    """A CuPy NCCL communicator's in-place SUM all_reduce on torch's current stream, or an error."""
    try:
        import cupy
        from cupy.cuda import nccl
        uid = [nccl.get_unique_id() if rank == 0 else None]
        dist.broadcast_object_list(uid, src=0)
        comm = nccl.NcclCommunicator(world, uid[0], rank)
        kinds = {torch.float32: nccl.NCCL_FLOAT32, torch.bfloat16: nccl.NCCL_BFLOAT16,
                 torch.float16: nccl.NCCL_FLOAT16}

        def run(t: torch.Tensor) -> None:
            comm.allReduce(t.data_ptr(), t.data_ptr(), t.numel(), kinds[t.dtype], nccl.NCCL_SUM,
                           torch.cuda.current_stream().cuda_stream)
        return run, f"cupy {cupy.__version__}, NCCL {nccl.get_version()}"
    except Exception as exc:  # reported, not fatal: the torch paths are the contract
        return None, f"{type(exc).__name__}: {exc}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--sizes-mib", default="16,64,256,1024")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--blocking-wait", action="store_true",
                   help="also time the HAL path on a second group created with TORCH_NCCL_BLOCKING_WAIT=1")
    args = p.parse_args(argv)
    import hal
    from hal.collectives import Communicator
    backend = hal.get_backend("cuda")
    comm = Communicator.init(backend, timeout_s=120)
    rank, world = comm.rank, comm.world_size
    dtype = getattr(torch, args.dtype)
    cupy_run, cupy_info = _cupy_allreduce(rank, world)
    paths = {"torch.distributed": lambda t: dist.all_reduce(t),
             "hal.Communicator": lambda t: comm.all_reduce(t, "sum")}
    if cupy_run is not None:
        paths["cupy.nccl"] = cupy_run
    if args.blocking_wait:
        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
        group = dist.new_group(backend="nccl")
        os.environ.pop("TORCH_NCCL_BLOCKING_WAIT")
        slow = Communicator(backend, group, 120, comm.device)
        paths["hal.Communicator+blocking_wait"] = lambda t: slow.all_reduce(t, "sum")
    rows = []
    factor = 2 * (world - 1) / world
    for mib in [int(s) for s in args.sizes_mib.split(",")]:
        n = mib * MiB // torch.empty((), dtype=dtype).element_size()
        t = torch.ones(n, dtype=dtype, device=comm.device)
        for fn in paths.values():  # warm-up (and a correctness check: all ones summed)
            t.fill_(1)
            fn(t)
            torch.cuda.synchronize()
            assert float(t[:8].float().mean()) == world, "all_reduce gave a wrong sum"
            for _ in range(3):
                fn(t)
        samples: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(args.trials):
            for name, fn in paths.items():
                dist.barrier()
                samples[name].append(_time_ms(lambda fn=fn, t=t: fn(t), args.iters))
        for name, ms in samples.items():
            med = statistics.median(ms)
            alg = mib * MiB / (med / 1e3)
            rows.append({"size_mib": mib, "path": name, "ms": med, "algbw_gbps": alg / 1e9,
                         "busbw_gbps": alg * factor / 1e9, "trials_ms": ms})
        del t
        torch.cuda.empty_cache()
    if rank == 0:
        from tabulate import tabulate
        base = {r["size_mib"]: r["busbw_gbps"] for r in rows if r["path"] == "torch.distributed"}
        print(tabulate([[r["size_mib"], r["path"], f"{r['ms'] * 1e3:.1f}", f"{r['algbw_gbps']:.1f}",
                         f"{r['busbw_gbps']:.1f}", f"{100 * r['busbw_gbps'] / base[r['size_mib']]:.1f}%"]
                        for r in rows], headers=["MiB", "path", "us", "algbw GB/s", "busbw GB/s", "of torch"]))
        checks = {}
        for mib in (1024, 4096):
            at = {r["path"]: r["busbw_gbps"] for r in rows if r["size_mib"] == mib}
            if at:
                checks[f"{mib}MiB"] = {
                    "hal_within_5pct_of_torch": at["hal.Communicator"] >= 0.95 * at["torch.distributed"],
                    "hal_busbw_>=330GB/s": at["hal.Communicator"] >= 330, "busbw_gbps": at}
        within = {r["size_mib"]: r["busbw_gbps"] / base[r["size_mib"]] for r in rows if r["path"] == "hal.Communicator"}
        checks["hal_over_torch_by_size"] = within
        print(json.dumps(checks, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world, "dtype": args.dtype, "iters": args.iters, "trials": args.trials,
                           "cupy": cupy_info, "rows": rows, "checks": checks,
                           "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                                  "TORCH_NCCL_BLOCKING_WAIT")},
                           "versions": backend.versions(), "command": " ".join(sys.argv)}, f, indent=1)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
