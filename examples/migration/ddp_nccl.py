"""DistributedDataParallel training on NCCL, launched with torchrun.

Mentions of cuda, "nccl" and torch.cuda.set_device in this docstring are not code.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import ReduceOp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)  # expect: cuda-api
    dist.init_process_group(backend="nccl", init_method="env://")  # expect: nccl-backend
    assert dist.get_backend() == "nccl"  # expect: nccl-backend
    return local_rank


def main(args):
    local_rank = setup(args)
    device = torch.device("cuda", local_rank)  # expect: device-string
    model = nn.Linear(32, 4).cuda(local_rank)  # expect: cuda-method
    model = DDP(model, device_ids=[local_rank], output_device=local_rank)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data), pin_memory=True,
                        pin_memory_device="cuda")  # expect: device-string
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x = x.cuda(non_blocking=True)  # expect: cuda-method
        y = y.to(device, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    flags = torch.ones(1, dtype=torch.int32, device=device)
    dist.all_reduce(flags, op=ReduceOp.BAND)  # expect: reduce-op
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    dist.monitored_barrier()  # expect: dist-unsupported
    dist.send_object_list([{"epoch": 1}], dst=0)  # expect: dist-unsupported
    group = dist.new_group(ranks=[0, 1], backend=dist.Backend.NCCL)  # expect: nccl-backend
    torch.cuda.synchronize()  # expect: cuda-api
    dist.destroy_process_group()
    return group


if __name__ == "__main__":
    main(None)
