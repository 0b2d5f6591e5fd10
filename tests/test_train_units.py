"""Units of vitkit.train: config, parameter groups, schedule, loader, checkpoints, lock."""

import errno
import os

import pytest
import torch

import vitkit
from vitkit.core.errors import CheckpointError, ConfigError, TrainingError
from vitkit.train import checkpoint as tck
from vitkit.train import distributed
from vitkit.train.config import OptimConfig, RunConfig, ScheduleConfig, resolve_config
from vitkit.train.distributed import DistInfo, collectives_for
from vitkit.train.loader import BatchLoader
from vitkit.train.optim import build_optimizer, param_groups
from vitkit.train.schedule import Schedule


class _Set:  # the ImageSet surface the loader uses
    def __init__(self, n):
        self.images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
        self.labels = torch.arange(n) % 3

    def __len__(self):
        return len(self.labels)


# ----------------------------------------------------------------------------------------- config
def test_config_layers_and_strictness(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text('epochs = 3\nmodel = "vit_test"\n[optim]\nlr = 0.01\n[augment]\npad = 1\n')
    cfg = resolve_config(f, {"optim.lr": 0.5, "seed": None}, ["optim.weight_decay=0.2", "augment.crop=rrc"])
    assert (cfg.epochs, cfg.model, cfg.optim.lr, cfg.optim.weight_decay, cfg.seed) == (3, "vit_test", 0.5, 0.2, 0)
    assert cfg.augment.pad == 1 and cfg.augment.crop == "rrc" and cfg.augment.hflip == 0.0

    f.write_text("[optim]\nlrr = 0.01\n")
    with pytest.raises(ConfigError, match=r"r.toml: config.optim: unknown field\(s\) 'lrr'"):
        resolve_config(f)
    f.write_text('epochs = "ten"\n')
    with pytest.raises(ConfigError, match=r"r.toml: config.epochs: expected an integer, got 'ten'"):
        resolve_config(f)
    f.write_text("epochs = [\n")
    with pytest.raises(ConfigError, match="r.toml: not valid TOML"):
        resolve_config(f)
    with pytest.raises(ConfigError, match=r"config.optim.name: expected one of 'adamw', 'adam', 'sgd', 'lion', 'muon', got 'lamb'"):
        resolve_config(None, None, ["optim.name=lamb"])
    with pytest.raises(ConfigError, match="batch_size: 10 is not divisible by accum_steps 3"):
        resolve_config(None, {"batch_size": 10, "accum_steps": 3})
    with pytest.raises(ConfigError, match="nope.toml: no such config file"):
        resolve_config(tmp_path / "nope.toml")
    # the eval crop takes the range of Preprocess.crop_pct: 1e-9 would resize a 32-px image to 3.2e10 px
    with pytest.raises(ConfigError, match=r"^data.crop_pct: expected a finite number in \[0.1, 1\], got "):
        resolve_config(None, None, ["data.crop_pct=1e-9"])
    with pytest.raises(ConfigError, match=r"^config.data.crop_pct: expected a finite number, got nan"):
        resolve_config(None, None, ["data.crop_pct=NaN"])


def test_strategy_is_checked():
    """--strategy picks ddp (the default) or fsdp; anything else, or fsdp in fp16, is a one-line error."""
    from vitkit.train.config import RunConfig

    assert resolve_config().strategy == "ddp" and resolve_config(None, {"strategy": "fsdp"}).strategy == "fsdp"
    with pytest.raises(ConfigError, match=r"^config.strategy: expected one of 'ddp', 'fsdp', got 'zero'$"):
        resolve_config(None, None, ["strategy=zero"])
    with pytest.raises(ConfigError, match=r"^strategy: expected one of 'ddp', 'fsdp', got 'zero'$"):
        RunConfig(strategy="zero").validate()  # built in code, not parsed
    with pytest.raises(ConfigError, match=r"^strategy: 'fsdp' trains in bf16 or fp32, not fp16 .*; use "
                                          r"precision bf16$"):
        resolve_config(None, {"strategy": "fsdp", "precision": "fp16"})


def test_channels_last_is_automatic_and_refused_under_fsdp():
    assert resolve_config().channels_last is None  # auto: where it pays
    assert resolve_config(None, None, ["channels_last=false"]).channels_last is False
    assert resolve_config(None, {"strategy": "fsdp", "channels_last": False}).channels_last is False
    with pytest.raises(ConfigError, match=r"^channels_last: 'fsdp' shards contiguous parameters only .*; use "
                                          r"channels_last = false or null, or strategy ddp$"):
        resolve_config(None, {"strategy": "fsdp", "channels_last": True})


def test_shipped_recipes_parse():
    root = os.path.join(os.path.dirname(__file__), "..", "configs")
    names = sorted(n for n in os.listdir(root) if n.endswith(".toml"))
    assert {"demo.toml", "pretrain.toml", "finetune.toml", "small-data.toml"} <= set(names)
    for n in names:
        text = open(os.path.join(root, n)).read()
        assert text.startswith("#") and "vitkit " in text.splitlines()[0], n  # header: the command
        cfg = resolve_config(os.path.join(root, n))
        vitkit.get_config(cfg.model)


def test_demo_defaults_are_the_demo_recipe():
    cfg = resolve_config(os.path.join(os.path.dirname(__file__), "..", "configs", "demo.toml"))
    from vitkit.train.config import DEMO_BUDGET, merge

    assert cfg.to_dict() == merge(RunConfig().to_dict(), DEMO_BUDGET)


def test_distinfo_from_env():
    assert DistInfo.from_env({}) == DistInfo(0, 1, 0)
    d = DistInfo.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert d.enabled and not d.is_main and d.rank == 1
    with pytest.raises(ConfigError, match="WORLD_SIZE='x' is not an integer"):
        DistInfo.from_env({"WORLD_SIZE": "x"})
    with pytest.raises(ConfigError, match="RANK=2 / WORLD_SIZE=2"):
        DistInfo.from_env({"RANK": "2", "WORLD_SIZE": "2"})


# ------------------------------------------------------------------------------------------ optim
def test_collectives_backend_and_device(monkeypatch):
    assert collectives_for(torch.device("cpu")) == distributed.Collectives("gloo")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    # CUDA: NCCL for the GPU's tensors, gloo for the step flags and sums, which stay on the CPU
    assert collectives_for(torch.device("cuda", 1)) == distributed.Collectives("cpu:gloo,cuda:nccl")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    assert collectives_for(torch.device("cuda", 0)).backend == "gloo"  # gloo serves CUDA tensors too
    assert collectives_for(torch.device("mps")).backend == "gloo"


def test_init_process_group_sets_the_local_gpu_first(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: calls.append(("init", kw)))
    distributed.init_process_group(DistInfo(1, 2, 1), torch.device("cuda", 1))
    assert calls == [("set_device", torch.device("cuda", 1)),
                     ("init", dict(backend="cpu:gloo,cuda:nccl", rank=1, world_size=2))]
    calls.clear()
    distributed.init_process_group(DistInfo(1, 2, 1), torch.device("cpu"))
    assert calls == [("init", dict(backend="gloo", rank=1, world_size=2))]
    distributed.init_process_group(DistInfo(0, 1, 0), torch.device("cpu"))  # one process: no group
    assert len(calls) == 1
    # ... unless it asks for one (FSDP): a group of one, in memory
    assert distributed.init_process_group(DistInfo(0, 1, 0), torch.device("cuda", 0), alone=True)
    assert calls[1] == ("set_device", torch.device("cuda", 0))
    assert calls[2][1].pop("store").__class__ is torch.distributed.HashStore
    assert calls[2] == ("init", dict(backend="cpu:gloo,cuda:nccl", rank=0, world_size=1))


def test_param_groups_exclude_biases_norms_and_embeddings():
    m = vitkit.create_model("vit_test", seed=0)
    groups = param_groups(m, 0.1)
    no_decay = {n for g in groups if g["weight_decay"] == 0 for n in g["names"]}
    decay = {n for g in groups if g["weight_decay"] > 0 for n in g["names"]}
    assert {"pos_embed", "cls_token", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias", "head.bias"} <= no_decay
    assert {"blocks.0.attn.qkv.weight", "patch_embed.proj.weight", "head.weight"} <= decay
    assert not decay & no_decay and len(decay | no_decay) == len(list(m.parameters()))


def test_bn_lr_scale_takes_the_batchnorm_parameters_alone():
    m = vitkit.create_model("vit_hybrid_whiten_patch4_32", depth=1, stem_early_convs=1, stem_convs=1, seed=0)
    bn = {f"{mn}.{pn}" for mn, mod in m.named_modules() if isinstance(mod, torch.nn.BatchNorm2d)
          for pn, _ in mod.named_parameters(recurse=False)}
    assert len(bn) == 8  # the stem's four BatchNorms, a weight and a bias each
    opt = build_optimizer(m, OptimConfig(name="muon", lr=0.01, bn_lr_scale=4.0, muon_convs=True))
    lr = {n: g["lr"] for g in opt.param_groups for n in g["names"]}
    assert {lr[n] for n in bn} == {0.04}
    assert {v for n, v in lr.items() if n not in bn} == {0.01}
    assert len(lr) == len([p for p in m.parameters() if p.requires_grad])
    assert [g["names"] for g in build_optimizer(m, OptimConfig(lr=0.01)).param_groups] == [
        g["names"] for g in param_groups(m, 0.05)]  # the default keeps the groups as they were
    with pytest.raises(ConfigError, match="optim.bn_lr_scale: must be > 0, got 0"):
        OptimConfig(bn_lr_scale=0).validate()


def test_layer_decay_scales():
    m = vitkit.create_model("vit_test", seed=0)  # depth 2
    opt = build_optimizer(m, OptimConfig(lr=1.0, layer_decay=0.5))
    scale = {n: g["lr_scale"] for g in opt.param_groups for n in g["names"]}
    assert scale["head.weight"] == 1.0 and scale["norm.weight"] == 1.0
    assert scale["blocks.1.mlp.fc1.weight"] == 0.5 and scale["blocks.0.mlp.fc1.weight"] == 0.25
    assert scale["patch_embed.proj.weight"] == 0.125 and scale["pos_embed"] == 0.125
    sgd = build_optimizer(m, OptimConfig(name="sgd", lr=0.1, momentum=0.9))
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.9


# --------------------------------------------------------------------------------------- schedule
def test_schedule_warmup_then_cosine_and_linear():
    s = Schedule(ScheduleConfig(decay="cosine", warmup_steps=10, warmup_fraction=0.0), 1.0, 110)
    assert s.lr(0) == pytest.approx(0.1) and s.lr(9) == pytest.approx(1.0)
    assert s.lr(10) == pytest.approx(1.0) and s.lr(60) == pytest.approx(0.5) and s.lr(110) == pytest.approx(0.0)
    lin = Schedule(ScheduleConfig(decay="linear", warmup_steps=0, warmup_fraction=0.0, min_lr_ratio=0.1), 2.0, 100)
    assert lin.lr(0) == pytest.approx(2.0) and lin.lr(50) == pytest.approx(1.1) and lin.lr(100) == pytest.approx(0.2)
    assert not s.done(109, 0.0) and s.done(110, 0.0)


def test_step_schedule_decays_by_the_rate_every_share_of_the_run():
    # 100 steps, a decay of 0.5 every 30 of them counted from the start (warmup included, as timm's step)
    s = Schedule(ScheduleConfig(decay="step", warmup_steps=5, warmup_fraction=0.0, step_every=0.3, step_rate=0.5),
                 2.0, 100)
    assert s.lr(0) == pytest.approx(0.4) and s.lr(4) == pytest.approx(2.0)  # warmup
    assert [s.lr(k) for k in (5, 29, 30, 59, 60, 89, 90, 99)] == pytest.approx([2.0, 2.0, 1.0, 1.0, 0.5, 0.5,
                                                                                0.25, 0.25])
    floor = Schedule(ScheduleConfig(decay="step", warmup_fraction=0.0, step_every=0.1, min_lr_ratio=0.01), 1.0, 100)
    assert floor.lr(95) == pytest.approx(0.01)  # 0.1 ** 9, held at the floor
    clock = Schedule(ScheduleConfig(decay="step", warmup_fraction=0.0, step_every=0.5), 1.0, 1000, budget_seconds=10.0)
    assert clock.lr(3, 4.9) == pytest.approx(1.0) and clock.lr(4, 5.0) == pytest.approx(0.1)  # by the clock's share
    with pytest.raises(ConfigError, match="schedule.step_every: must be in"):
        ScheduleConfig(decay="step", step_every=0.0).validate()


def test_schedule_fitted_to_budget():
    # 1000 steps would take far longer than the 100 s budget: the decay follows the clock instead
    s = Schedule(ScheduleConfig(decay="cosine", warmup_fraction=0.1), 1.0, 1000, budget_seconds=100.0)
    assert s.lr(0, 0.0) == pytest.approx(1 / 100)  # warmup: max(step / warmup steps, time share)
    assert s.lr(5, 5.0) == pytest.approx(0.5)
    assert s.lr(20, 55.0) == pytest.approx(0.5)  # halfway through the decay part of the budget
    assert s.lr(30, 100.0) == pytest.approx(0.0, abs=1e-12)
    assert s.done(30, 100.0) and not s.done(30, 99.0)


def test_schedule_at_a_recorded_share_of_the_budget_is_the_schedule_at_that_time():
    """A replay gives the schedule each step's share of the budget (seconds / budget, as recorded) in place
    of the seconds: the same learning rate, bit for bit; NaN, a step not bounded by the clock, takes the
    schedule of the steps alone."""
    import math

    for warmup in (dict(warmup_fraction=0.1), dict(warmup_steps=8, warmup_fraction=0.05)):
        s = Schedule(ScheduleConfig(decay="cosine", **warmup), 1.0, 1000, budget_seconds=60.0)
        for step, seconds in ((0, 0.0), (3, 1.7), (7, 4.1), (20, 13.3), (90, 59.99), (91, 61.0)):
            assert s.share(seconds) == seconds / 60.0
            assert s.lr(step, share=s.share(seconds)) == s.lr(step, seconds)  # equal floats, not approx
    plain = Schedule(ScheduleConfig(decay="cosine", warmup_steps=10, warmup_fraction=0.0), 1.0, 110)
    clocked = Schedule(plain.cfg, 1.0, 110, budget_seconds=60.0)
    assert math.isnan(plain.share(30.0))
    assert [clocked.lr(k, share=math.nan) for k in range(0, 120, 7)] == [plain.lr(k) for k in range(0, 120, 7)]


# ----------------------------------------------------------------------------------------- loader
def test_loader_order_sharding_and_resume():
    ds = _Set(40)
    one = BatchLoader(ds, 8, seed=3)
    assert len(one) == 5
    ids = torch.cat([x[:, 0, 0, 0] for _, x, _ in one.epoch(0)]).long()
    assert len(ids) == 40 and len(ids.unique()) == 40  # each image once
    assert not torch.equal(ids, torch.cat([x[:, 0, 0, 0] for _, x, _ in one.epoch(1)]).long())  # reshuffled
    assert torch.equal(torch.cat([x for _, x, _ in one.epoch(2)]), torch.cat([x for _, x, _ in BatchLoader(ds, 8, seed=3).epoch(2)]))
    # resume mid-epoch: the remaining batches are the same
    tail = [x for _, x, _ in one.epoch(0, start=3)]
    assert all(torch.equal(a, b) for a, b in zip(tail, [x for _, x, _ in one.epoch(0)][3:]))
    # two ranks: their slices make up the global batch
    r0 = BatchLoader(ds, 8, seed=3, dist=DistInfo(0, 2, 0))
    r1 = BatchLoader(ds, 8, seed=3, dist=DistInfo(1, 2, 1))
    for (_, x, _), (_, a, _), (_, b, _) in zip(one.epoch(0), r0.epoch(0), r1.epoch(0)):
        assert torch.equal(x, torch.cat([a, b]))
    with pytest.raises(ConfigError, match="batch_size: 8 is not divisible by processes x accum_steps = 3 x 1"):
        BatchLoader(ds, 8, dist=DistInfo(0, 3, 0))


# ------------------------------------------------------------------------------------ checkpoints
def test_checkpoint_roundtrip_and_enospc(tmp_path, monkeypatch):
    m = vitkit.create_model("vit_test", seed=0)
    m.labels = [str(i) for i in range(10)]
    torch.manual_seed(5)
    state = {"step": 3, "rng": [tck.rng_state()]}
    tck.save_checkpoint(tmp_path, "last", m, state)
    assert tck.find_checkpoint(tmp_path) == tmp_path / "last"
    back = tck.load_trainer_state(tmp_path / "last")  # weights_only=True
    a = torch.rand(3)
    tck.set_rng_state(back["rng"][0])
    assert torch.equal(torch.rand(3), a) and back["step"] == 3
    assert vitkit.load(tmp_path).labels == m.labels

    # a full disk while writing: a clear error, the previous checkpoint intact, no temp left behind
    def full(state, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tck, "_write_trainer_state", full)
    with torch.no_grad():
        m.head.bias.fill_(1.0)
    with pytest.raises(CheckpointError, match=r"could not save checkpoint .*last: no space left on device; "
                                              r"the previous checkpoint .*last is intact"):
        tck.save_checkpoint(tmp_path, "last", m, {"step": 4})
    assert tck.load_trainer_state(tmp_path / "last")["step"] == 3
    assert float(vitkit.load(tmp_path / "last").head.bias.detach().abs().sum()) == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_interrupted_swap_leaves_previous_loadable(tmp_path, monkeypatch):
    m = vitkit.create_model("vit_test", seed=0)
    tck.save_checkpoint(tmp_path, "last", m, {"step": 1})
    real = os.replace
    calls = []

    def crash_between_renames(a, b):
        calls.append(b)
        real(a, b)
        if str(b).endswith(".last.old"):
            raise KeyboardInterrupt  # as if killed right after moving the old checkpoint aside

    monkeypatch.setattr(tck.os, "replace", crash_between_renames)
    with pytest.raises(KeyboardInterrupt):
        tck.save_checkpoint(tmp_path, "last", m, {"step": 2})
    monkeypatch.setattr(tck.os, "replace", real)
    found = tck.find_checkpoint(tmp_path)
    assert found.name == ".last.old" and tck.load_trainer_state(found)["step"] == 1


def test_run_lock(tmp_path):
    lock = tck.RunLock(tmp_path).acquire()
    with pytest.raises(TrainingError, match=rf"run directory is in use by process {os.getpid()} on .*lock file"):
        tck.RunLock(tmp_path).acquire()
    lock.release()
    # a stale lock (its process is gone) is taken over
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".lock").write_text(f"{socket.gethostname()} {int(dead.stdout)}\n")
    tck.RunLock(tmp_path).acquire().release()
    assert not (tmp_path / ".lock").exists()


def test_ema_decay_warms_up_to_the_configured_value():
    from vitkit.train.ema import ema_decay

    assert ema_decay(0.999, 0) == pytest.approx(0.1)  # the first update moves the average 90% of the way
    assert ema_decay(0.999, 90) == pytest.approx(0.91)
    assert ema_decay(0.999, 10**6) == 0.999
    ds = [ema_decay(0.9999, s) for s in range(0, 100000, 500)]
    assert ds == sorted(ds) and ds[-1] <= 0.9999


def test_batch_indices_are_the_images_an_epoch_yields():
    loader = BatchLoader(_Set(40), 8, seed=5, dist=DistInfo(rank=1, world_size=2, local_rank=1))
    for epoch in (0, 1):
        for s, x, _ in loader.epoch(epoch):
            assert torch.equal(x[:, 0, 0, 0].long(), loader.batch_indices(epoch, s))  # each image is its index


# ------------------------------------------------------------------------------------------- Lion
def test_lion_moves_each_weight_by_lr_times_the_sign_of_its_interpolated_momentum():
    from vitkit.train.optim import Lion

    p = torch.nn.Parameter(torch.tensor([1.0, 1.0, 1.0]))
    opt = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    p.grad = torch.tensor([2.0, -3.0, 0.0])
    opt.step()  # m = 0: the sign of the gradient; decay 1 - lr * wd
    torch.testing.assert_close(p.detach(), torch.tensor([0.95 - 0.1, 0.95 + 0.1, 0.95]))
    m = opt.state[p]["exp_avg"]
    torch.testing.assert_close(m, 0.01 * torch.tensor([2.0, -3.0, 0.0]))
    p.grad = torch.tensor([-0.001, -0.001, 1.0])
    before = p.detach().clone()
    opt.step()  # sign(0.9 m + 0.1 g): the momentum outweighs a small opposite gradient
    sign = torch.sign(0.9 * torch.tensor([0.02, -0.03, 0.0]) + 0.1 * torch.tensor([-0.001, -0.001, 1.0]))
    torch.testing.assert_close(p.detach(), before * (1 - 0.05) - 0.1 * sign)


def test_adam_adds_the_groups_weight_decay_to_the_gradient():
    model = vitkit.create_model("vit_test", seed=0)
    opt = build_optimizer(model, OptimConfig(name="adam", lr=0.1, weight_decay=0.5, betas=(0.8, 0.99), eps=1e-6))
    assert type(opt) is torch.optim.Adam
    assert sorted({g["weight_decay"] for g in opt.param_groups}) == [0.0, 0.5]
    layer = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -2.0]]))
    opt = build_optimizer(layer, OptimConfig(name="adam", lr=0.1, weight_decay=0.5))
    layer.weight.grad = torch.zeros(1, 2)
    opt.step()  # the gradient becomes 0.5 * w: Adam's first step is -lr * sign(w) (AdamW's: w * (1 - lr * wd))
    torch.testing.assert_close(layer.weight.detach(), torch.tensor([[0.9, -1.9]]))


def test_build_optimizer_makes_lion_with_the_groups_weight_decay():
    from vitkit.train.optim import Lion

    model = vitkit.create_model("vit_test", seed=0)
    opt = build_optimizer(model, OptimConfig(name="lion", lr=3e-4, weight_decay=0.1, betas=(0.9, 0.99)))
    assert isinstance(opt, Lion)
    assert sorted({g["weight_decay"] for g in opt.param_groups}) == [0.0, 0.1]
    assert all(g["betas"] == (0.9, 0.99) and g["lr"] == 3e-4 for g in opt.param_groups)
