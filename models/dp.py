"""Data-parallel training of a reference workload over a HAL communicator; launch with torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m hal.models.dp \\
        --model gpt --config tiny --device cpu --steps 5 --baseline --out report.json

Every rank builds the workload from the same seed (rank 0's parameters are then broadcast), takes
its equal slice of the *global* batch (``--global-batch``, default ``config.batch_size x world``),
runs forward and backward, averages the gradients with one flat ``Communicator.all_reduce(AVG)``
(gloo on the CPU, the backend's engine — NCCL, CNCL — elsewhere; the NCCL-based backend plugin sets ``NCCL_NVLS_ENABLE=0``
unless already set) and steps the optimizer. Each rank uses the device ``$LOCAL_RANK``.

Reported by rank 0 (``--out`` JSON and a table): median step time TN (the slowest rank per step),
samples/s, peak memory (max over ranks, :mod:`hal.models.measure`), communication share (all-reduce
time / step time, both timed with device synchronisation), and the strong-scaling efficiency
``T1 / (N x TN)``. T1 is the single-process step time on the same global batch: ``--baseline``
measures it in rank 0 before the parallel run (the other ranks wait), ``--t1 SECONDS`` takes it
from an earlier run (e.g. ``step_time_s`` of a ``--nproc_per_node=1`` run of this module, which
is exactly T1). ``--dump-grads PATH`` saves rank 0's averaged gradients of the first step (before
the optimizer step) for comparison with single-process training.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Optional

import torch

from hal.commandline import CliError, emit, run_cli


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    from hal.models import workload_arg
    p = argparse.ArgumentParser(prog="python -m hal.models.dp", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt", type=workload_arg,
                   help="gpt, cnn, moe or hf:<arch> (hal.models.hf.HF_NAMES)")
    p.add_argument("--config", default="tiny")
    p.add_argument("--device", default="cpu", help="HAL backend name (cpu, or an accelerator backend)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", action="store_true", help="measure T1 in rank 0 first")
    p.add_argument("--t1", type=float, default=None, help="T1 in seconds from an earlier run")
    p.add_argument("--dump-grads", default=None)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def _flat_grads(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.grad is not None]


def _time_steps(w: Any, batches: list, warmup: int, comm: Any = None) -> tuple[list[float], list[float]]:
    """Train on ``batches``; per measured step returns (step seconds, all-reduce seconds)."""
    steps, comms = [], []
    for i, batch in enumerate(batches):
        w.synchronize()
        t0 = time.perf_counter()
        w.backward(batch)
        c = 0.0
        if comm is not None:
            w.synchronize()
            c0 = time.perf_counter()
            allreduce_grads(w.model, comm)
            w.synchronize()
            c = time.perf_counter() - c0
        w.optimizer_step()
        w.synchronize()
        if i >= warmup:
            steps.append(time.perf_counter() - t0)
            comms.append(c)
    return steps, comms


def allreduce_grads(model: torch.nn.Module, comm: Any) -> None:
    """Average every gradient across ranks with one flat all_reduce (a single bucket)."""
    params = _flat_grads(model)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    comm.all_reduce(flat, "AVG")
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def run(args: argparse.Namespace) -> Optional[dict]:
    import hal
    from hal.collectives import Communicator
    from hal.models import get_workload
    from hal.models.measure import measure_peak
    try:
        backend = hal.get_backend(args.device)
    except hal.HalError as exc:
        raise CliError(str(exc)) from None
    comm = Communicator.init(backend, timeout_s=args.timeout)
    try:
        res = _run(args, comm, get_workload, measure_peak)
        # the ranks leave together: none tears its group down while another still communicates
        # (torch 2.13 CI, 87a7754: rank 1 aborted at exit, 'terminate called without an active exception')
        comm.barrier()
        return res
    except ValueError as exc:
        raise CliError(str(exc)) from None
    finally:
        comm.close()


def _run(args: argparse.Namespace, comm: Any, get_workload: Any, measure_peak: Any) -> Optional[dict]:
    world, rank = comm.world_size, comm.rank
    w = get_workload(args.model, args.config).build(comm.device, args.dtype, args.seed)
    gb = args.global_batch or w.config.batch_size * world
    if gb % world:
        raise CliError(f"--global-batch {gb} is not divisible by the {world} ranks")
    local = gb // world
    for p in w.model.parameters():
        comm.broadcast(p.data, 0)
    n = args.warmup + args.steps
    global_batches = [w.example_batch(gb, index=i) for i in range(n + 1)]

    t1 = args.t1
    if args.baseline:
        if rank == 0:
            w1 = get_workload(args.model, args.config).build(comm.device, args.dtype, args.seed)
            t1 = statistics.median(_time_steps(w1, global_batches[:n], args.warmup)[0])
            del w1
        comm.barrier()

    shards = [{k: v[rank * local:(rank + 1) * local] for k, v in b.items()} for b in global_batches]
    if args.dump_grads:
        w.backward(shards[0])
        allreduce_grads(w.model, comm)
        if rank == 0:
            torch.save({name: p.grad.detach().to("cpu") for name, p in w.model.named_parameters()
                        if p.grad is not None}, args.dump_grads)
        w.optimizer.zero_grad(set_to_none=True)
    steps, comms = _time_steps(w, shards[:n], args.warmup, comm)

    def one() -> None:
        _time_steps(w, shards[n:n + 1], 0, comm)
    peak = measure_peak(one, w.device, w.backend, [w.model, w.optimizer, shards[n]])

    # the slowest rank sets each step's time
    t = torch.tensor(steps + comms + [float(peak["peak_bytes"] or 0)], dtype=torch.float64, device=w.device)
    comm.all_reduce(t, "MAX")
    k = len(steps)
    step_max, comm_max, peak_max = t[:k].tolist(), t[k:2 * k].tolist(), int(t[-1].item())
    if rank != 0:
        return None
    tn = statistics.median(step_max)
    res = {
        "workload": w.name, "config": args.config, "device": str(w.device), "dist_backend": comm.backend.dist_backend,
        "world_size": world, "global_batch": gb, "local_batch": local, "dtype": args.dtype,
        "warmup": args.warmup, "steps": args.steps,
        "step_time_s": tn, "step_times_s": step_max, "samples_per_s": gb / tn,
        "comm_time_s": statistics.median(comm_max), "comm_share": statistics.median(comm_max) / tn,
        "peak_memory_bytes": peak_max or None, "peak_memory_source": peak["source"],
        "t1_s": t1, "scaling_efficiency": (t1 / (world * tn)) if t1 else None,
        "emulated_collectives": sorted(comm.emulated),
        "timing": "host perf_counter with device synchronize; step time = max over ranks, median over steps",
    }
    return res


def table(res: dict) -> str:
    from tabulate import tabulate
    eff = res["scaling_efficiency"]
    rows = [["workload", f"{res['workload']}:{res['config']} x{res['world_size']} ({res['dist_backend']})"],
            ["global / local batch", f"{res['global_batch']} / {res['local_batch']}"],
            ["step time TN (median)", f"{res['step_time_s'] * 1e3:.2f} ms"],
            ["samples/s", f"{res['samples_per_s']:.1f}"],
            ["communication share", f"{res['comm_share'] * 100:.1f}%"],
            ["peak memory (max rank)", "n/a" if not res["peak_memory_bytes"] else f"{res['peak_memory_bytes'] / 2**20:.1f} MiB"],
            ["T1", "n/a (use --baseline or --t1)" if not res["t1_s"] else f"{res['t1_s'] * 1e3:.2f} ms"],
            ["scaling efficiency T1/(N*TN)", "n/a" if eff is None else f"{eff:.3f}"]]
    return tabulate(rows, tablefmt="simple")


def handle(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.warmup < 0:
        raise CliError("--steps must be >= 1 and --warmup >= 0")
    res = run(args)
    if res is not None:
        emit(table(res))
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(res, fh, indent=2)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    return run_cli(lambda: parse(argv), handle, "hal.models.dp")


if __name__ == "__main__":
    sys.exit(main())
