"""grid_sample under DistributedDataParallel: 2 gloo processes train like one process."""

import gc
import os
import socket

import pytest
import torch
import torch.distributed as dist

# torch.distributed.nn binds group.WORLD into its functions' default arguments when it is
# imported. Imported later (building an optimiser imports it through torch._dynamo), it
# would hold the live group, so destroy_process_group could not free it: gloo's threads
# would outlive the interpreter, and tearing them down at exit aborted a rank now and then.
import torch.distributed.nn  # noqa: F401
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import gridsampler3d as gs

STEPS = 3


class TinyRegistration(torch.nn.Module):
    """Predicts a displacement from (moving, fixed) and warps the moving volume with it."""

    def __init__(self):
        super().__init__()
        self.field = torch.nn.Conv3d(2, 3, kernel_size=3, padding=1, dtype=torch.float64)
        self.warp = gs.Warp3d()

    def forward(self, moving, fixed):
        displacement = self.field(torch.cat([moving, fixed], dim=1))
        return self.warp(moving, displacement)


def _data():
    generator = torch.Generator().manual_seed(1)
    moving = torch.rand(4, 1, 6, 7, 5, generator=generator, dtype=torch.float64)
    fixed = torch.rand(4, 1, 6, 7, 5, generator=generator, dtype=torch.float64)
    return moving, fixed


def _train(model, moving, fixed):
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(STEPS):
        optimiser.zero_grad()
        loss = torch.nn.functional.mse_loss(model(moving, fixed), fixed)
        loss.backward()
        optimiser.step()
    return [parameter.detach().clone() for parameter in model.parameters()]


def _worker(rank, world_size, port, result_path):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    parameters = _train_shard(rank)
    if rank == 0:
        torch.save(parameters, result_path)
    # Tear the group down only once every rank is done with it: a rank that leaves while its
    # peer still talks to it makes gloo abort the peer (seen about 1 run in 7 here).
    dist.barrier()
    # DistributedDataParallel sits in a reference cycle, and its reducer holds the group:
    # collect it now, so that destroy_process_group frees the group and joins gloo's threads
    # while the interpreter is whole, not at exit.
    gc.collect()
    dist.destroy_process_group()


def _train_shard(rank):
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyRegistration())
    moving, fixed = _data()
    shard = slice(rank * 2, rank * 2 + 2)  # each rank trains on its half of the batch
    return _train(model, moving[shard], fixed[shard])


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_ddp_two_processes_equal_one(tmp_path):
    result_path = tmp_path / "parameters.pt"
    mp.spawn(_worker, args=(2, _free_port(), str(result_path)), nprocs=2, join=True)
    torch.manual_seed(0)
    model = TinyRegistration()
    initial = [parameter.detach().clone() for parameter in model.parameters()]
    single = _train(model, *_data())  # the whole batch in one process
    assert not torch.allclose(single[0], initial[0])  # training moved the weights
    distributed = torch.load(result_path)
    assert len(single) == len(distributed)
    for one, two in zip(single, distributed):
        # Not bitwise: all-reduce adds the two halves' gradients in another order than one
        # process summing the whole batch; over the training steps that drifts by float64 rounding.
        torch.testing.assert_close(two, one, rtol=1e-10, atol=1e-12)
