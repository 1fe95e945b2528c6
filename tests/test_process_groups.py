"""conformance.runtime.process_groups: the groups an audited program destroys are held until the audit releases them.

The hang this prevents is a race (torch 2.4.1, 2 audited mp.spawn runs in 10; see the module docstring). These
tests check the mechanism deterministically on a real gloo group: a group destroyed under the patch is held, and
the program sees a destroyed group. Initialising a group again on the same port works, because the held groups
are released first. Removing the patches releases the rest.
"""
import socket

import pytest
import torch
import torch.distributed as dist

from hal.conformance.runtime import process_groups

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


@pytest.fixture
def patched():
    saved = process_groups.install()
    try:
        yield saved
    finally:
        process_groups.remove(saved)
        if dist.is_initialized():
            dist.destroy_process_group()
        process_groups.HELD.clear()


def test_destroyed_groups_are_held_and_a_new_group_on_the_same_port_releases_them(patched):
    from torch.distributed import destroy_process_group  # as a program imports it, after the patch
    port = _port()
    _init(port)
    world = dist.group.WORLD
    sub = dist.new_group([0])
    destroy_process_group(sub)
    assert process_groups.HELD == [sub]
    destroy_process_group()  # every registered group
    assert not dist.is_initialized()
    assert any(g is world for g in process_groups.HELD)
    _init(port)  # the held groups' store had this port: they are released first
    assert process_groups.HELD == []
    x = torch.ones(3)
    dist.all_reduce(x)  # the new group works
    assert x.tolist() == [1.0, 1.0, 1.0]


def test_remove_restores_torchs_functions_and_releases_the_held_groups():
    real = (dist.destroy_process_group, dist.init_process_group, dist.distributed_c10d.destroy_process_group)
    saved = process_groups.install()
    assert dist.destroy_process_group is not real[0] and dist.distributed_c10d.destroy_process_group is not real[2]
    _init(_port())
    dist.destroy_process_group()
    assert len(process_groups.HELD) == 1
    process_groups.remove(saved)
    assert process_groups.HELD == []
    assert (dist.destroy_process_group, dist.init_process_group,
            dist.distributed_c10d.destroy_process_group) == real


def test_a_spawned_workers_names_bound_at_import_are_rebound_to_the_patch():
    """An mp.spawn worker imports the program (``from torch.distributed import destroy_process_group``, as the DDP
    tutorial's multigpu.py does) before the audit patches anything: rebinding.rebind points those names at the patch."""
    from hal.conformance.runtime.rebinding import rebind
    program = {"destroy_process_group": dist.destroy_process_group, "init_process_group": dist.init_process_group}
    exec("def train(rank):\n    return destroy_process_group, init_process_group\n", program)
    saved = process_groups.install()
    try:
        rebind(program["train"], saved)
        assert program["train"](0) == (dist.destroy_process_group, dist.init_process_group)
        assert program["destroy_process_group"] is not saved[0][2]  # no longer torch's own
    finally:
        process_groups.remove(saved)
