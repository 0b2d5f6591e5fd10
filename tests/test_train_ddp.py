"""Two processes (gloo, CPU) follow the same loss trajectory as one process with the same global batch;
so do two FSDP processes (sharded weights, gradients and optimizer state), whose checkpoints are
ordinary ones."""

import contextlib
import copy
import itertools
import json
import os
import socket
import sys
import warnings

import pytest
import torch
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(__file__))
from helpers import free_port, random_model, run_weights, step_losses, tiny_run_config, tiny_splits  # noqa: E402

from vitkit.train import DistInfo  # noqa: E402

# Augmentation off and no dropout: with them on, each process draws its own random numbers, so the
# two runs would differ by design (the data order and the batch split do not depend on the process count).
PLAIN = dict(augment=dict(crop="none", hflip=0.0, label_smoothing=0.0), epochs=2, ckpt_every=0)


# the same runs with a conv stem (3x3 stride-2 conv + BatchNorm + ReLU, three times at patch 8)
CONV_STEM = dict(model_args=dict(stem="conv", stem_width=8))


def _worker(rank, world, runs):
    torch.set_num_threads(1)
    import torch.distributed as dist

    info = DistInfo(rank, world, rank)
    if len(runs) == 1:  # train starts the group and ends it, and the backend's threads with it
        import gc

        from vitkit.train import distributed

        end, models_at_end = distributed.destroy_process_group, []

        def counted_end():  # a DDP model freed after its group would join gloo's threads holding the GIL
            models_at_end.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
            end()

        distributed.destroy_process_group = counted_end
        _train(info, *runs[0])
        assert not dist.is_initialized()
        assert models_at_end == [0]
        assert backend_threads() in (0, None)
        return
    dist.init_process_group("gloo", rank=rank, world_size=world)  # one group for all runs: train leaves it be
    try:
        for run in runs:
            _train(info, *run)
            assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def backend_threads() -> int | None:
    """How many of this process's threads are gloo's (None where /proc does not list them)."""
    if not os.path.isdir("/proc/self/task"):
        return None
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as f:
            names.append(f.read().strip())
    return sum(name.startswith(("pt_gloo", "gloo")) for name in names)


def _train(info, overrides: dict, out: str, how: dict | None = None) -> None:
    """One run of a process; ``how``: {"stop_at": n} asks it to stop at its n-th step, {"resume": True}
    continues it, {"seconds_a_step": s} gives it a clock of s seconds a step (``stepped_clock``)."""
    from vitkit.train import train

    how = how or {}
    polls = itertools.count(1)
    stop = (lambda: next(polls) == how["stop_at"]) if "stop_at" in how else None
    with (warnings.catch_warnings(record=True) as caught,  # DDP's gradient buckets take the weights' layout
          stepped_clock(how.get("seconds_a_step"), info.rank)):
        warnings.simplefilter("always")
        train(tiny_run_config(**PLAIN, **overrides), out, dist=info, splits=tiny_splits(), log=lambda m: None,
              stop=stop, resume=how.get("resume", False))
    strides = [str(w.message) for w in caught if "strides" in str(w.message)]
    assert not strides, strides


@contextlib.contextmanager
def stepped_clock(seconds: float | None, rank: int):
    """While a run lasts, the trainer's clock reads ``seconds`` a step rather than the wall clock, rank 1's
    10 s ahead (the processes agree on the mean); None: the wall clock."""
    from vitkit.train import Trainer

    wall = Trainer.elapsed
    if seconds is not None:
        Trainer.elapsed = lambda self: seconds * self.state.step + 10.0 * rank
    try:
        yield
    finally:
        Trainer.elapsed = wall


def train_two(monkeypatch, *runs: tuple) -> None:
    """Each run (config overrides, run directory[, how: see ``_train``]) in turn by two processes on a
    gloo group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    mp.spawn(_worker, args=(2, list(runs)), nprocs=2, join=True)


def train_one(out, **overrides) -> None:
    """The same run in this process, on one thread as each of the two processes."""
    from vitkit.train import train

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_run_config(**PLAIN, **overrides), out, splits=tiny_splits(), log=lambda m: None)
    finally:
        torch.set_num_threads(n)


def weight_gap(a, b, name: str = "last") -> dict[str, float]:
    """The largest absolute difference of every tensor of two runs' weights in checkpoint ``name`` (the same keys)."""
    wa, wb = run_weights(a, name), run_weights(b, name)
    assert wa.keys() == wb.keys()  # the unwrapped module: no 'module.' prefixes
    return {k: (wa[k].double() - wb[k].double()).abs().max().item() for k in wa}


def test_two_processes_match_one(tmp_path, monkeypatch):
    from vitkit.train.checkpoint import load_trainer_state

    train_two(monkeypatch, ({}, str(tmp_path / "ddp")))
    train_one(tmp_path / "one")
    one, two = step_losses(tmp_path / "one"), step_losses(tmp_path / "ddp")
    assert len(one) == len(two) == 8
    # the same global batch of 8: per-process means of 4 averaged, gradients all-reduced; only the
    # order of floating-point sums differs
    assert torch.allclose(torch.tensor(one), torch.tensor(two), rtol=1e-4, atol=1e-5), (one, two)
    assert load_trainer_state(tmp_path / "ddp" / "last")["step"] == 8
    assert len(load_trainer_state(tmp_path / "ddp" / "last")["rng"]) == 2  # every process's RNG state
    diffs = weight_gap(tmp_path / "one", tmp_path / "ddp")
    assert max(diffs.values()) < 1e-4, diffs


def test_two_processes_bounded_by_the_clock_replay_bit_for_bit(tmp_path, monkeypatch):
    """Two processes whose clocks disagree, ended by the clock half way through an epoch, replayed by two
    processes on the wall clock: the same records (timings aside) and the same weights."""
    from helpers import same_files, timeless_records

    clocked = dict(max_minutes=1.0, eval_every=1, ema=0.9)
    run, again = tmp_path / "run", tmp_path / "again"
    train_two(monkeypatch, (clocked, str(run), {"seconds_a_step": 12.0}), (dict(clocked, replay=str(run)), str(again)))
    steps = json.loads((run / "summary.json").read_text())["step"]
    # of 8: the clock (12 s a step of 60) ends it at step 6, or 5 where the time kept for the run's end and
    # one more step (train/budget.py) takes the sixth
    assert steps in (5, 6) and json.loads((again / "summary.json").read_text())["step"] == steps
    assert timeless_records(again) == timeless_records(run)
    assert same_files(run, again, "last") and same_files(run, again, "best")


def test_shared_batchnorm_statistics_make_two_processes_match_one(tmp_path, monkeypatch):
    """With a conv stem, two processes of 4 images train as one process of 8 only when the BatchNorm
    statistics are shared (sync_bn; on CPU not the default); each process's own batch statistics take
    the two runs apart."""
    train_two(monkeypatch, ({**CONV_STEM, "sync_bn": True}, str(tmp_path / "sync")), (CONV_STEM, str(tmp_path / "own")))
    train_one(tmp_path / "one", **CONV_STEM)
    one, sync, own = (torch.tensor(step_losses(tmp_path / r), dtype=torch.float64) for r in ("one", "sync", "own"))
    assert len(one) == len(sync) == len(own) == 8
    assert (one - sync).abs().max() < 1e-5, (one, sync)
    for run in ("one", "sync", "own"):  # a conv stem on the CPU: channels-last, in one process as in two
        path = json.loads((tmp_path / run / "summary.json").read_text())["fast_path"]
        assert path.startswith("fp32, eager, channels_last"), path
    sync_gap, own_gap = weight_gap(tmp_path / "one", tmp_path / "sync"), weight_gap(tmp_path / "one", tmp_path / "own")
    assert any("running_var" in k for k in sync_gap)  # the BatchNorm buffers are compared too
    # qkv.bias holds the key biases, which get no gradient in exact arithmetic (softmax ignores a shift
    # shared by all keys): AdamW scales their rounding noise up to steps of lr, so they are held to 1e-4
    key_bias = {k: v for k, v in sync_gap.items() if k.endswith("attn.qkv.bias")}
    assert key_bias and max(key_bias.values()) < 1e-4, key_bias
    assert max(v for k, v in sync_gap.items() if k not in key_bias) < 1e-5, sync_gap
    assert (one - own).abs().max() > 1e-3, (one, own)  # what the sync removes: the test can fail
    assert max(own_gap.values()) > 1e-2, own_gap


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
    from vitkit.core.errors import TrainingError
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


@pytest.mark.parametrize("momentum", [0.1, None])
def test_all_reduce_batchnorm_is_batchnorm_in_a_world_of_one(gloo_group, momentum):
    """Through the all-reduce path (a group of one): outputs, gradients and running statistics as
    BatchNorm2d's, within 1e-6 (absolute plus relative: float32 rounding); the same tensors and
    state_dict keys; plain BatchNorm in eval."""
    from vitkit.train.sync_bn import AllReduceBatchNorm2d, convert_batchnorm

    close = dict(rtol=1e-6, atol=1e-6)
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(5, momentum=momentum)
    torch.nn.init.normal_(ref.weight)
    torch.nn.init.normal_(ref.bias)
    twin = torch.nn.Sequential(copy.deepcopy(ref))
    weight = twin[0].weight
    assert convert_batchnorm(twin) is twin and type(twin[0]) is AllReduceBatchNorm2d
    assert twin[0].weight is weight and list(twin[0].state_dict()) == list(ref.state_dict())
    for step in range(3):
        x = (torch.randn(6, 5, 4, 3) * 3 + 2).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        up = torch.randn(6, 5, 4, 3)
        ref.zero_grad(), twin.zero_grad()
        y, y2 = ref(x), twin(x2)
        (y * up).sum().backward()
        (y2 * up).sum().backward()
        torch.testing.assert_close(y2, y, **close)
        torch.testing.assert_close(x2.grad, x.grad, **close)
        torch.testing.assert_close(twin[0].weight.grad, ref.weight.grad, **close)
        torch.testing.assert_close(twin[0].bias.grad, ref.bias.grad, **close)
        torch.testing.assert_close(twin[0].state_dict(), ref.state_dict(), **close)
    ref.eval(), twin.eval()
    twin[0].load_state_dict(ref.state_dict())  # the same running statistics, to the bit: eval is BatchNorm2d's
    x = torch.randn(2, 5, 4, 3)
    assert torch.equal(ref(x), twin(x))


def test_batchnorm_sync_is_on_by_default_on_cuda_where_it_applies():
    from vitkit.train.sync_bn import wants_sync_bn

    conv, plain = random_model(stem="conv"), random_model()
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert wants_sync_bn(None, conv, 2, cuda) and not wants_sync_bn(None, conv, 2, cpu)  # auto: CUDA only
    assert wants_sync_bn(True, conv, 2, cpu) and not wants_sync_bn(False, conv, 2, cuda)
    assert not wants_sync_bn(True, conv, 1, cuda) and not wants_sync_bn(True, plain, 2, cuda)  # nothing to share


# FSDP through what a run uses of it: EMA, validation and best/, gradient accumulation (micro-batches of 2
# a process), clipping (optim.clip_grad, on by default), gradient checkpointing, and a conv stem whose
# BatchNorm buffers (not sharded, unlike the parameters) share their statistics. FSDP shards contiguous
# parameters only (channels_last: auto is off under it), and the runs without it that it is compared
# with train contiguous too
FSDP = dict(strategy="fsdp", ema=0.9, eval_every=1, accum_steps=2, grad_checkpointing=True, sync_bn=True,
            channels_last=False, **CONV_STEM)


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """The run directories of four runs by two processes, started once for the tests below: 'fsdp', the
    same run under 'ddp', and 'resumed', the FSDP run stopped at its third step and resumed."""
    root = tmp_path_factory.mktemp("fsdp")
    dirs = {name: root / name for name in ("fsdp", "ddp", "resumed")}
    with pytest.MonkeyPatch.context() as monkeypatch:
        train_two(monkeypatch, (FSDP, str(dirs["fsdp"])), ({**FSDP, "strategy": "ddp"}, str(dirs["ddp"])),
                  (FSDP, str(dirs["resumed"]), {"stop_at": 3}), (FSDP, str(dirs["resumed"]), {"resume": True}))
    return dirs


def test_fsdp_trains_as_ddp_and_writes_ordinary_checkpoints(two_process_runs):
    """Two FSDP processes follow DDP's losses and end with its weights, EMA and optimizer state within float
    tolerance (the shards' gradients are reduce-scattered instead of all-reduced: the sums run in another
    order); last/ loads into a plain model and trainer.pt has DDP's layout."""
    from vitkit.io.checkpoint import load
    from vitkit.train.checkpoint import load_trainer_state

    fsdp, ddp = two_process_runs["fsdp"], two_process_runs["ddp"]
    a, b = torch.tensor(step_losses(fsdp)), torch.tensor(step_losses(ddp))
    assert len(a) == len(b) == 8
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a, b)
    for name in ("last", "best"):  # best/: the EMA's weights
        gap = weight_gap(fsdp, ddp, name)
        assert max(gap.values()) < 1e-4, (name, gap)
    plain = load(fsdp / "last")  # an ordinary VisionTransformer: full tensors, no sharding
    ddp_weights = run_weights(ddp)
    for k, v in plain.state_dict().items():
        assert type(v) is torch.Tensor and v.shape == ddp_weights[k].shape
        assert (v - ddp_weights[k]).abs().max() < 1e-4, k
    sa, sb = load_trainer_state(fsdp / "last"), load_trainer_state(ddp / "last")
    oa, ob = sa["optimizer"], sb["optimizer"]
    assert [g["params"] for g in oa["param_groups"]] == [g["params"] for g in ob["param_groups"]]
    assert oa["state"].keys() == ob["state"].keys()
    for i, state in oa["state"].items():
        assert state.keys() == ob["state"][i].keys()
        for key, v in state.items():
            assert type(v) is torch.Tensor and torch.allclose(v, ob["state"][i][key], rtol=1e-3, atol=1e-6), (i, key)
    assert all(type(t) is torch.Tensor and t.shape == u.shape and torch.allclose(t, u, atol=1e-4)
               for t, u in zip(sa["ema"], sb["ema"], strict=True))


def test_fsdp_resumes_exactly(two_process_runs):
    """Stopped mid-epoch and resumed, two FSDP processes end with the weights of an uninterrupted run, bit for
    bit: the checkpoint gathers the shards and the resume shards them again, with no arithmetic."""
    full, run = two_process_runs["fsdp"], two_process_runs["resumed"]
    assert len(step_losses(run)) == 8
    assert step_losses(run) == step_losses(full)
    for name in ("last", "best"):
        assert max(weight_gap(full, run, name).values()) == 0.0, name


def test_fsdp_alone_is_plain_training(tmp_path):
    """One FSDP process (a group of its own, shards of the whole) trains exactly as one plain process."""
    import torch.distributed as dist

    train_one(tmp_path / "fsdp", **FSDP)
    assert not dist.is_initialized()  # the run ended the group it started
    train_one(tmp_path / "plain", **{**FSDP, "strategy": "ddp"})
    assert step_losses(tmp_path / "fsdp") == step_losses(tmp_path / "plain")
    for name in ("last", "best"):
        assert max(weight_gap(tmp_path / "fsdp", tmp_path / "plain", name).values()) == 0.0, name


def test_a_torn_down_group_leaves_no_backend_threads_behind():
    """Ending a group ends gloo's worker threads then and there. torch.distributed.nn.functional binds
    the group that exists when it is first imported (DDP imports it) as a default argument, which
    kept the group, and its threads, alive until the interpreter's exit, where they could abort a
    rank that had finished its work ("terminate called without an active exception"). A fresh
    interpreter, so that nothing has imported that module yet."""
    import subprocess

    if backend_threads() is None:
        pytest.skip("threads are counted from /proc (Linux)")
    script = (
        "import torch\n"
        "from test_train_ddp import backend_threads\n"
        "from vitkit.train.distributed import DistInfo, process_group, served_device_types\n"
        "with process_group(DistInfo(), torch.device('cpu'), alone=True):\n"
        "    served_device_types()\n"
        "    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))\n"
        "    assert backend_threads() > 0\n"
        "print(backend_threads())\n")
    here = os.path.dirname(__file__)
    path = [here, os.path.join(here, "..", "src"), os.environ.get("PYTHONPATH", "")]
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "0", done.stdout + done.stderr


def _clocked_worker(rank, world, overrides: dict, out: str, ahead: float) -> None:
    """One process of a run bounded by the clock, its own clock ``ahead`` seconds ahead on rank 1 (as a
    process that started training earlier reads it); the learning rates it stepped with, to out/lr<rank>.json."""
    torch.set_num_threads(1)
    from vitkit.train import train, trainer
    from vitkit.train.schedule import Schedule

    if rank == 1:
        plain = trainer.Trainer.elapsed
        trainer.Trainer.elapsed = lambda self: plain(self) + ahead
    rates, apply = [], Schedule.apply
    Schedule.apply = lambda self, *a, **k: rates.append(apply(self, *a, **k)) or rates[-1]
    info = DistInfo(rank, world, rank) if world > 1 else DistInfo()
    train(tiny_run_config(**{**PLAIN, **overrides}), out, dist=info, log=lambda m: None)
    with open(os.path.join(out, f"lr{rank}.json"), "w") as f:
        json.dump(rates, f)


@pytest.mark.parametrize("processes", [1, 2])
def test_the_test_figure_a_run_prints_is_what_eval_scores(tmp_path, monkeypatch, processes):
    """A run bounded by the clock, 27 test images (divisible by neither 2 processes nor the batch): the
    test accuracy and loss the run reports are those `vitkit eval` gives for the run, even where the
    processes' clocks disagree; every process steps with the same learning rates (the time they agree on)."""
    from helpers import image_folder

    from vitkit.tools.evaluate import evaluate

    data = image_folder(tmp_path / "data", classes=("a", "b", "c"), n=8, test=9)
    run = tmp_path / "run"
    overrides = dict(max_minutes=1.0, epochs=3, data=dict(path=str(data)))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    mp.spawn(_clocked_worker, args=(processes, overrides, str(run), 30.0), nprocs=processes, join=True)
    summary = json.loads((run / "summary.json").read_text())
    scored = evaluate(run)
    assert scored["num_images"] == 27 and scored["scored"] == "test part: all 27 images"
    assert summary["test_acc"] == round(scored["top1"], 5)
    # the loss summed over the processes' shares in another order than eval's one pass: float32 rounding, so one
    # unit of the 5 decimals the summary keeps
    assert summary["test_loss"] == pytest.approx(scored["loss"], abs=1e-5)
    rates = [json.loads((run / f"lr{r}.json").read_text()) for r in range(processes)]
    assert len(rates[0]) == 9 and all(r == rates[0] for r in rates)
