"""MoE expert parallel over a HAL communicator, checked against one process; launch with torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m hal.models.ep \\
        --config tiny --device cpu --out DIR

Every rank builds the ``moe`` workload from the same seed with ``communicator=`` (so it keeps only
its experts), takes its equal slice of the global batch, runs the forward pass (tokens travel to
the experts' owners and back with ``Communicator.all_to_all``) and a backward pass of the
cross-entropy, and writes ``DIR/rank<r>.pt`` with its logits, loss and the gradients of its own
experts. :func:`single_process_reference` computes the same quantities in one process; the
tests compare the two.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

import torch

from hal.commandline import CliError, run_cli


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hal.models.ep", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for rank<r>.pt")
    return p.parse_args(argv)


def expert_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gradients of expert parameters present in ``model`` (host copies), by parameter name."""
    return {n: p.grad.detach().to("cpu") for n, p in model.named_parameters()
            if ".experts." in n and p.grad is not None}


def _logits_and_loss(w, batch):
    import torch.nn.functional as F
    w.model.train()
    logits = w.model(batch["tokens"])
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1), reduction="sum")
    return logits, ce


def single_process_reference(config: str = "tiny", global_batch: int = 4, seed: int = 0) -> dict:
    """Logits of the global batch and expert gradients of the summed cross-entropy, one process."""
    from hal.models import get_workload
    w = get_workload("moe", config).build("cpu", torch.float32, seed)
    batch = w.example_batch(global_batch)
    logits, loss = _logits_and_loss(w, batch)
    loss.backward()
    return {"logits": logits.detach(), "loss": float(loss.detach()), "expert_grads": expert_grads(w.model)}


def handle(args: argparse.Namespace) -> int:
    import hal
    from hal.collectives import Communicator
    from hal.models import get_workload
    try:
        backend = hal.get_backend(args.device)
    except hal.HalError as exc:
        raise CliError(str(exc)) from None
    os.makedirs(args.out, exist_ok=True)
    with Communicator.init(backend) as comm:
        try:
            w = get_workload("moe", args.config).build(comm.device, args.dtype, args.seed, communicator=comm)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        gb, world, rank = args.global_batch, comm.world_size, comm.rank
        if gb % world:
            raise CliError(f"--global-batch {gb} is not divisible by {world} ranks")
        local = gb // world
        batch = {k: v[rank * local:(rank + 1) * local] for k, v in w.example_batch(gb).items()}
        logits, loss = _logits_and_loss(w, batch)
        loss.backward()
        torch.save({"rank": rank, "world_size": world, "rows": (rank * local, (rank + 1) * local),
                    "logits": logits.detach().to("cpu"), "loss": float(loss.detach()),
                    "expert_grads": expert_grads(w.model)}, os.path.join(args.out, f"rank{rank}.pt"))
        comm.barrier()
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    return run_cli(lambda: parse(argv), handle, "hal.models.ep")


if __name__ == "__main__":
    sys.exit(main())
