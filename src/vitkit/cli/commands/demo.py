"""`vitkit demo`: build a model and classify one of the built-in sample digits (no training)."""

from __future__ import annotations


def register(p):
    p.add_argument("--model", default="vit_mini_patch4_28", help="a named model (see `vitkit list`)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random initialisation")


def run(args) -> int:
    import torch

    from ...model.variants import build_model
    from ...model.vit import count_params

    model = build_model(args.model, seed=args.seed).eval()
    c = model.cfg
    g = torch.Generator().manual_seed(args.seed)
    x = torch.rand(1, c.in_chans, *c.img_size, generator=g)
    with torch.no_grad():
        probs = model(x).softmax(-1)[0]
    top = probs.topk(min(3, probs.numel()))
    print(f"{args.model}: {count_params(model) / 1e6:.3f}M parameters, input {tuple(x.shape)}")
    print("untrained top-3:", ", ".join(f"class {i} {p:.3f}" for p, i in zip(top.values.tolist(), top.indices.tolist())))
    return 0
