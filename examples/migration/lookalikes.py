"""Nothing in this file is device-specific, although it talks about cuda a lot.

Examples in docs: model.cuda(), torch.cuda.synchronize(), init_process_group("nccl"),
os.environ["CUDA_VISIBLE_DEVICES"], x.to(0), torch.float64.
"""
import argparse
import logging

import numpy as np
import torch

log = logging.getLogger("cuda_tools")
# model.cuda()  torch.cuda.synchronize()  dist.init_process_group("nccl")  x.double()
use_cuda = False
cuda_graph_enabled = False
nccl_timeout_s = 1800
my_cuda_helper = {"cuda": 1, "nccl": 2}
CUDA_MESSAGE = "cuda is not available; use torch.cuda.is_available() to check"


def describe(args):
    """Say which device "cuda:0" the user asked for (this string is a docstring)."""
    if args.cuda:
        log.info("cuda requested; backend nccl")
    print("torch.cuda.synchronize() is not called here", "cuda", "cuda:1", "nccl")
    name = "CUDA_VISIBLE_DEVICES"
    return f"{name}=cuda:{args.rank} nccl"


class Recorder:
    def __init__(self):
        self.cuda_time = 0.0
        self.is_cuda_run = False

    def cuda_enabled(self):
        return self.is_cuda_run


def numeric(x):
    host = np.asarray(x, dtype=np.float64)
    return torch.from_numpy(host.astype(np.float32)).to(torch.float32)


parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true", help="use cuda (the default is cuda:0)")
parser.add_argument("--log-backend", default="nccl")
parser.add_argument("--gpu-count", type=int, default=8)
