"""Mixed precision with autocast and GradScaler, plus streams, events, memory stats and a profile."""
import torch
import torch.cuda as tc
import torch.nn as nn
from torch import cuda
from torch.cuda.amp import GradScaler, autocast
from torch.profiler import ProfilerActivity, profile


def train(model, batches):
    model = model.cuda()  # expect: cuda-method
    opt = torch.optim.AdamW(model.parameters())
    scaler = GradScaler()  # expect: cuda-amp
    for x, y in batches:
        x, y = x.to("cuda"), y.to("cuda:0")  # expect: device-string, device-string
        with autocast(dtype=torch.float16):  # expect: cuda-amp
            loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):  # expect: device-string
        model(x)
    with torch.amp.autocast("cuda"):  # expect: device-string
        model(x)
    scaler2 = torch.amp.GradScaler("cuda")  # expect: device-string
    return scaler2


def timed(model, x):
    stream = tc.Stream()  # expect: cuda-api
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)  # expect: cuda-api, cuda-api
    start.record()
    with torch.cuda.stream(stream):  # expect: cuda-api
        model(x)
    end.record()
    tc.synchronize()  # expect: cuda-api
    torch.cuda.nvtx.range_push("step")  # expect: cuda-api
    torch.cuda.nvtx.range_pop()  # expect: cuda-api
    print("peak", torch.cuda.max_memory_allocated() / 2**20, "MiB")  # expect: cuda-api
    torch.cuda.reset_peak_memory_stats()  # expect: cuda-api
    torch.cuda.empty_cache()  # expect: cuda-api
    return start.elapsed_time(end)


def graphed(model, static_x):
    g = torch.cuda.CUDAGraph()  # expect: cuda-api
    with torch.cuda.graph(g):  # expect: cuda-api
        static_y = model(static_x)
    return g, static_y


def profiled(model, x):
    torch.manual_seed(0)
    torch.cuda.manual_seed(0)  # expect: cuda-api
    torch.cuda.manual_seed_all(0)  # expect: cuda-api
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:  # expect: profiler-cuda
        model(x)
    if x.is_cuda:  # expect: is-cuda
        print(torch.cuda.memory_allocated(), torch.cuda.memory_reserved())  # expect: cuda-api, cuda-api
    return prof
