"""Two processes (gloo, CPU) follow the same loss trajectory as one process with the same global batch."""

import os
import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
from helpers import step_losses, tiny_run_config, tiny_splits  # noqa: E402

# Augmentation off and no dropout: with them on, each process draws its own random numbers, so the
# two runs would differ by design (the data order and the batch split do not depend on the process count).
PLAIN = dict(augment=dict(crop="none", hflip=0.0, label_smoothing=0.0), epochs=2, ckpt_every=0)


def _worker(rank, world, out):
    torch.set_num_threads(1)
    from vitkit.train import DistInfo, train

    train(tiny_run_config(**PLAIN), out, dist=DistInfo(rank, world, rank), splits=tiny_splits(), log=lambda m: None)


def test_two_processes_match_one(tmp_path, monkeypatch):
    from vitkit.train import train
    from vitkit.train.checkpoint import load_trainer_state

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    mp.spawn(_worker, args=(2, str(tmp_path / "ddp")), nprocs=2, join=True)

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_run_config(**PLAIN), tmp_path / "one", splits=tiny_splits(), log=lambda m: None)
    finally:
        torch.set_num_threads(n)
    one, two = step_losses(tmp_path / "one"), step_losses(tmp_path / "ddp")
    assert len(one) == len(two) == 8
    # the same global batch of 8: per-process means of 4 averaged, gradients all-reduced; only the
    # order of floating-point sums differs
    assert torch.allclose(torch.tensor(one), torch.tensor(two), rtol=1e-4, atol=1e-5), (one, two)
    assert load_trainer_state(tmp_path / "ddp" / "last")["step"] == 8
    assert len(load_trainer_state(tmp_path / "ddp" / "last")["rng"]) == 2  # every process's RNG state
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "one" / "last" / "model.safetensors"), load_file(tmp_path / "ddp" / "last" / "model.safetensors")
    assert a.keys() == b.keys()  # the unwrapped module: no 'module.' prefixes
    diffs = {k: (a[k] - b[k]).abs().max().item() for k in a}
    assert max(diffs.values()) < 1e-4, diffs


@pytest.fixture
def gloo_group():
    """A one-process gloo group in this process, torn down after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_collectives_refuse_a_device_the_group_cannot_serve(gloo_group):
    from vitkit.errors import TrainingError
    from vitkit.train.distributed import DistInfo, all_reduce_sum, broadcast_buffers, check_served, served_device_types

    assert served_device_types() == ("cpu", "cuda")  # gloo takes CPU and CUDA tensors
    check_served(torch.zeros(3, dtype=torch.float64), "all_reduce")
    two = DistInfo(0, 2, 0)  # a rank of two, as the collectives see it: the check runs before anything is sent
    # gloo itself would pass a meta tensor through all_reduce without a word
    expected = r"^all_reduce: a tensor on meta, .*'cpu:gloo,cuda:gloo'.*: cpu, cuda$"
    with pytest.raises(TrainingError, match=expected) as e:
        all_reduce_sum(torch.zeros(3, device="meta"), two)
    assert "\n" not in str(e.value)
    module = torch.nn.BatchNorm1d(4, device="meta")
    with pytest.raises(TrainingError, match=r"^broadcast: a tensor on meta"):
        broadcast_buffers(module, two)
    gloo_group.destroy_process_group()
    gloo_group.init_process_group("cpu:gloo", store=gloo_group.HashStore(), rank=0, world_size=1)
    assert served_device_types() == ("cpu",)
