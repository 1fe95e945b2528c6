"""A small CUDA training script, written the way GPU code usually is (the ``make demo`` target).

It trains a tiny MLP on synthetic data with AMP and a GradScaler, uses DistributedDataParallel on
NCCL when launched by torchrun (``WORLD_SIZE`` > 1), reads CUDA/NCCL environment variables, gates
TF32 on the compute capability and computes its metric in float64. Every one of those is something
``hal-audit --device mlu`` reports. Without a GPU it falls back to the CPU, so it also runs here.

    python examples/cuda_train.py --steps 5
    hal-audit examples/cuda_train.py --device mlu --out out/demo --fix
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

# NCCL tuning the cluster team asked for; harmless when not distributed
os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
os.environ.setdefault("NCCL_DEBUG", "WARN")


def build_model(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))


def setup():
    """Initialise DDP when launched with torchrun; returns (rank, world_size, device)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device(f"cuda:{local_rank}")
    else:
        device = torch.device("cpu")
    if world_size > 1:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return rank, world_size, device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    print("visible GPUs:", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
    rank, world_size, device = setup()
    torch.manual_seed(0)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(0)
        major, _minor = torch.cuda.get_device_capability()
        if major >= 8:  # Ampere and newer: TF32 matmuls
            torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.benchmark = True

    model = build_model(args.width)
    if device.type == "cuda":
        model = model.cuda()
    if world_size > 1:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    use_amp = device.type == "cuda"
    scaler = torch.cuda.amp.GradScaler(enabled=use_amp)

    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 16, generator=gen)
    y = (x[:, :1] * 0.5 - x[:, 1:2] ** 2).contiguous()
    start = time.perf_counter()
    for _step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch,), generator=gen)
        xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
        with torch.cuda.amp.autocast(enabled=use_amp):
            loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start

    with torch.no_grad():  # evaluation metric in double precision
        pred = model(x.to(device)).double()
        mse = torch.mean((pred - y.to(device, dtype=torch.float64)) ** 2).item()
    if rank == 0:
        print(f"steps={args.steps} world_size={world_size} device={device} mse={mse:.6f} time={elapsed:.3f}s")
    if world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
