"""Muon for the blocks' weight matrices, AdamW for the rest, in one optimizer (train/optim.py)."""

import pytest
import torch
from helpers import tiny_run_config, tiny_splits

import vitkit
from vitkit.core.errors import ConfigError
from vitkit.train import RunConfig, train
from vitkit.train.optim import MuonAdamW, build_optimizer, orthogonalize


def test_orthogonalize_brings_the_singular_values_near_one():
    g = torch.randn(48, 16, generator=torch.Generator().manual_seed(0)) @ torch.diag(torch.logspace(-1, 1, 16))
    s = torch.linalg.svdvals(orthogonalize(g))
    assert s.min() > 0.5 and s.max() < 1.5  # Newton-Schulz's quintic: U S' V^T, S' within about (0.5, 1.5)
    assert orthogonalize(g.T).shape == (16, 48)


def _grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def test_the_matrix_steps_are_torchs_muon_and_the_others_torchs_adamw():
    w = torch.randn(24, 40, generator=torch.Generator().manual_seed(1))
    b = torch.randn(40, generator=torch.Generator().manual_seed(2))
    mine = [w.clone().requires_grad_(), b.clone().requires_grad_()]
    ref = [w.clone().requires_grad_(), b.clone().requires_grad_()]
    opt = MuonAdamW([dict(params=[mine[0]], muon=True, weight_decay=0.1), dict(params=[mine[1]], weight_decay=0.05)],
                    lr=0.02, ns_dtype=torch.bfloat16)
    muon = torch.optim.Muon([ref[0]], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([ref[1]], lr=0.02, weight_decay=0.05)
    for step in range(3):
        _grads(mine, step)
        _grads(ref, step)
        opt.step()
        muon.step()
        adamw.step()
    # the same Newton-Schulz iteration in bf16, its products grouped another way: to bf16's precision
    torch.testing.assert_close(mine[0], ref[0], atol=2e-3, rtol=0)
    torch.testing.assert_close(mine[1], ref[1], atol=1e-6, rtol=1e-6)


def test_the_blocks_matrices_take_muon_and_nothing_else_does():
    model = vitkit.create_model("vit_test", num_classes=3)
    opt = build_optimizer(model, RunConfig.from_dict({"optim": {"name": "muon"}}).optim)
    names = {n: g["muon"] for g in opt.param_groups for n in g["names"]}
    assert names["blocks.0.attn.qkv.weight"] and names["blocks.1.mlp.fc2.weight"]
    assert not any(names[n] for n in names if not n.startswith("blocks.") or not n.endswith(".weight")
                   or "norm" in n)
    assert not names["head.weight"] and not names["patch_embed.proj.weight"]
    # the same matrices at no weight decay (a group's decay was once read from its value: at 0, nothing took Muon)
    for convs in (False, True):
        at = {wd: {n: g["muon"] for g in build_optimizer(model, RunConfig.from_dict(
            {"optim": {"name": "muon", "weight_decay": wd, "muon_convs": convs}}).optim).param_groups for n in g["names"]}
            for wd in (0.0, 0.05)}
        assert at[0.0] == at[0.05] and any(at[0.0].values())
    with pytest.raises(ConfigError, match="optim.muon_momentum"):
        RunConfig.from_dict({"optim": {"name": "muon", "muon_momentum": 1.0}}).validate()


def test_a_conv_filter_takes_the_muon_step_of_its_flattened_matrix():
    w = torch.randn(16, 6, 3, 3, generator=torch.Generator().manual_seed(3))
    mine, ref = w.clone().requires_grad_(), w.flatten(1).clone().requires_grad_()  # (16, 54)
    opt = MuonAdamW([dict(params=[mine], muon=True, weight_decay=0.1)], lr=0.02, ns_dtype=torch.bfloat16)
    muon = torch.optim.Muon([ref], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for step in range(3):
        _grads([mine], step)
        ref.grad = mine.grad.flatten(1).clone()
        opt.step()
        muon.step()
    assert mine.shape == (16, 6, 3, 3)
    torch.testing.assert_close(mine.flatten(1), ref, atol=2e-3, rtol=0)  # bf16 Newton-Schulz, as above


def test_muon_convs_puts_the_conv_stems_filters_under_muon():
    model = vitkit.create_model("vit_test", num_classes=3, stem="conv", patch_size=4, stem_width=8)
    opt = build_optimizer(model, RunConfig.from_dict({"optim": {"name": "muon", "muon_convs": True}}).optim)
    names = {n: g["muon"] for g in opt.param_groups for n in g["names"]}
    convs = [n for n, p in model.named_parameters() if p.ndim == 4]
    assert len(convs) >= 3 and all(names[n] for n in convs)  # the stem's convs and its 1x1 projection
    assert names["blocks.0.attn.qkv.weight"] and not names["head.weight"]
    assert not any(names[n] for n in names if "norm" in n or n.endswith(".bias"))
    off = build_optimizer(model, RunConfig.from_dict({"optim": {"name": "muon"}}).optim)
    assert not any(g["muon"] for g in off.param_groups for n in g["names"] if n in convs)  # off by default
    with pytest.raises(ConfigError, match="optim.muon_convs: needs optim.name='muon'"):
        RunConfig.from_dict({"optim": {"name": "adamw", "muon_convs": True}}).validate()


def test_a_run_with_muon_learns_and_resumes_exactly(tmp_path):
    cfg = tiny_run_config(optim={"name": "muon", "lr": 0.01})
    whole = train(cfg, tmp_path / "whole", splits=tiny_splits(), log=lambda m: None)
    assert whole["status"] == "completed" and whole["val_acc"] > 0.5
    calls = iter(range(100))
    train(cfg, tmp_path / "part", splits=tiny_splits(), log=lambda m: None, stop=lambda: next(calls) >= 5)
    train(cfg, tmp_path / "part", splits=tiny_splits(), log=lambda m: None, resume=True)
    a, b = vitkit.load(tmp_path / "whole" / "last"), vitkit.load(tmp_path / "part" / "last")
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), k


class _TwoRanks:
    """An in-place sum over two threads standing for two processes (an all-reduce): each adds its tensor,
    both wait, both read the total."""

    def __init__(self):
        import threading

        self.barrier, self.parts = threading.Barrier(2), {}

    def sum(self, rank: int):
        def reduce(t: torch.Tensor) -> None:
            self.parts[rank] = t.clone()
            self.barrier.wait()
            t.copy_(self.parts[0] + self.parts[1])
            self.barrier.wait()  # both have read the parts before the next step writes them
        return reduce


def test_two_processes_share_the_orthogonalisations_and_step_as_one_bit_for_bit():
    import threading

    from vitkit.train.optim import matrix_shape, owners

    model = vitkit.create_model("vit_test", num_classes=3, stem="conv", patch_size=4, stem_width=8)
    cfg = RunConfig.from_dict({"optim": {"name": "muon", "muon_convs": True, "weight_decay": 0.05}}).optim
    copies = [copy_of(model) for _ in range(3)]  # one alone, and two ranks
    opts = [build_optimizer(m, cfg) for m in copies]
    ranks = _TwoRanks()
    for rank in (0, 1):
        opts[1 + rank].share_work(rank, 2, ranks.sum(rank))
    done = {0: 0, 1: 0}  # the orthogonalisations each rank computed

    def steps(i: int) -> None:
        for step in range(3):
            _grads(list(copies[i].parameters()), step)  # the same gradients everywhere, as after DDP's all-reduce
            opts[i].step()

    threads = [threading.Thread(target=steps, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    steps(0)
    for t in threads:
        t.join()
    for (k, a), b, c in zip(copies[0].state_dict().items(), copies[1].state_dict().values(),
                            copies[2].state_dict().values()):
        assert torch.equal(a, b) and torch.equal(a, c), k
    shapes = [matrix_shape(p) for g in opts[0].param_groups if g["muon"] for p in g["params"]]
    assert shapes == [tuple(p.flatten(1).shape) for g in opts[0].param_groups if g["muon"] for p in g["params"]]
    for who in owners(shapes, 2):
        done[who] += 1
    assert done[0] > 0 and done[1] > 0  # each rank computes a share
    cost = [0, 0]
    for s, who in zip(shapes, owners(shapes, 2)):
        cost[who] += min(s) ** 2 * max(s)
    assert max(cost) <= 0.5 * sum(cost) + max(min(s) ** 2 * max(s) for s in shapes)  # balanced to one matrix


def copy_of(model):
    import copy

    return copy.deepcopy(model)
