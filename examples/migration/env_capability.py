"""Environment set-up and capability gates, as in large training launchers."""
import os
import subprocess
import sys
from os import environ, getenv

import torch

os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"  # expect: env-var
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # expect: env-var
os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "1"  # expect: env-var
debug = getenv("CUDA_LAUNCH_BLOCKING") == "1"  # expect: env-var
if "TORCH_NCCL_BLOCKING_WAIT" in os.environ:  # expect: env-var
    del os.environ["TORCH_NCCL_BLOCKING_WAIT"]  # expect: env-var
ifname = environ.get("NCCL_SOCKET_IFNAME", "eth0")  # expect: env-var-unknown
home = os.environ.get("HOME")
child_env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # expect: env-var
subprocess.run([sys.executable, "-c", "pass"], env=child_env, check=True)

major, minor = torch.cuda.get_device_capability()  # expect: cuda-api
if major >= 8:  # expect: capability-gate
    torch.backends.cuda.matmul.allow_tf32 = True  # expect: tf32-flag
    torch.backends.cudnn.allow_tf32 = True  # expect: cudnn-flag
torch.backends.cudnn.benchmark = True  # expect: cudnn-flag
torch.backends.cudnn.deterministic = False  # expect: cudnn-flag
use_bf16 = torch.cuda.get_device_capability(0) >= (8, 0)  # expect: capability-gate, cuda-api
sm = torch.cuda.get_device_properties(0).major * 10  # expect: cuda-api
if torch.cuda.get_device_properties(0).major < 7:  # expect: capability-gate, cuda-api
    raise SystemExit("needs Volta or newer")
torch.backends.cuda.enable_flash_sdp(True)  # expect: cuda-backend-flag
