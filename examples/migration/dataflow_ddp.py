"""Device strings, ranks and backends carried in variables (the patterns the dataflow audit follows).

Written for this repository after patterns seen in nanoGPT, pytorch/examples, llm.c and mae;
every line an MLU port must change carries an ``# expect:`` comment.
"""
import argparse
import os

import torch
import torch.cuda.nccl as nccl  # expect: cuda-api
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.nn as nn

backend = "nccl"  # expect: nccl-backend
DEFAULT_DEVICE = "cuda"  # expect: device-string


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("-d", "--device", type=str, default="cuda")  # expect: device-string
    p.add_argument("--gpu", type=int, default=None)
    p.add_argument("--dist-backend", default="nccl")  # expect: nccl-backend
    return p.parse_args()


def setup(args):
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    args.gpu = local_rank
    dist.init_process_group(backend=backend)
    if args.dist_backend == "nccl":  # expect: nccl-backend
        print("nccl", nccl.version())  # expect: cuda-api
    if dist.is_nccl_available():  # expect: cuda-api
        print("nccl", torch.version.cuda)  # expect: cuda-api
    return local_rank


def build(args, local_rank):
    model = nn.Linear(8, 8).to(local_rank)  # expect: to-int
    model.to(args.gpu)  # expect: to-int
    loc = f"cuda:{local_rank}"  # expect: device-string
    state = torch.load("ckpt.pt", map_location=loc)
    dev = torch.device("cuda:{}".format(local_rank))  # expect: device-string
    buf = torch.zeros(2, device="cuda:%d" % local_rank)  # expect: device-string
    place = {"cuda:0": "cpu"}  # expect: device-string
    state = torch.load("ckpt.pt", map_location=place)
    return model, state, dev, buf


def train(args, device=DEFAULT_DEVICE):
    device_type = "cuda" if "cuda" in args.device else "cpu"  # expect: device-string, device-string
    assert device_type in {"cuda"}, "needs an accelerator"  # expect: device-string
    if device_type == "cuda":  # expect: device-string
        pin = True
    else:
        pin = False
    if str(device).startswith("cuda"):  # expect: device-string
        pin = pin and True
    use_accel = torch.accelerator.is_available()  # expect: torch-too-new
    return torch.ones(1).to(device), pin, use_accel


def remote_stage(worker, stage_cls, *args):
    return rpc.remote(worker, stage_cls, args=("cuda:0",) + args)  # expect: device-string


def load_hf(model_cls):
    return model_cls.from_pretrained("gpt2", device_map="cuda")  # expect: device-string
