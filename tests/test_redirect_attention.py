"""conformance.runtime.redirect.headwise_attention: on the CPU, attention over DTensors split by heads runs on each
rank's local tensors (DTensor has no sharding strategy for the CPU flash kernel). Checked on a real 2-rank gloo
mesh against attention over the full tensors: outputs and gradients equal; a sequence-sharded layout is left to
SDPA itself."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hal.conformance.runtime import process_groups
from tests.conftest import free_port

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")


def _rank(rank: int, port: str, out: str) -> None:
    import torch.nn.functional as F
    from torch.distributed.device_mesh import DeviceMesh
    try:
        from torch.distributed.tensor import Shard, distribute_tensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import Shard, distribute_tensor

    from hal.conformance.runtime.redirect import headwise_attention
    # torch 2.4.1's gloo group joins its threads in its destructor holding the GIL, while a thread may still be
    # freeing a collective's tensors, which needs it: a hang (seen here in CI, rank 0 in ~ProcessGroupGloo). The
    # audit's own mechanism (conformance.runtime.process_groups) lets the group go once its threads have settled
    patches = process_groups.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        mesh = DeviceMesh("cpu", [0, 1])
        torch.manual_seed(0)  # the same full tensors on both ranks
        q, k, v = (torch.randn(2, 4, 6, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        want.square().sum().backward()
        dq, dk, dv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        heads = [distribute_tensor(x, mesh, [Shard(1)]) for x in (dq, dk, dv)]
        got = headwise_attention(F.scaled_dot_product_attention, *heads, (), {"is_causal": True})
        full = got.full_tensor()
        full.square().sum().backward()
        grads = [x.grad.full_tensor() for x in heads]
        seq = [distribute_tensor(x.detach(), mesh, [Shard(2)]) for x in (q, k, v)]
        left = headwise_attention(F.scaled_dot_product_attention, *seq, (), {"is_causal": True})
        if rank == 0:
            torch.save({"out": (full - want).abs().max().item(),
                        "grads": max((g - x.grad).abs().max().item() for g, x in zip(grads, (q, k, v))),
                        "head_sharded": [p.is_shard(1) for p in got.placements], "seq_left": left is None}, out)
    finally:
        process_groups.remove(patches)  # destroys the group, held until its threads settled


def test_attention_over_head_sharded_dtensors_equals_attention_over_the_full_tensors(tmp_path):
    out = str(tmp_path / "result.pt")
    mp.spawn(_rank, args=(free_port(), out), nprocs=2, join=True)
    res = torch.load(out)
    assert res["out"] < 1e-12 and res["grads"] < 1e-12, res
    assert res["head_sharded"] == [True] and res["seq_left"], res
