"""`vitkit list [PATTERN]`: the named models with their parameter counts."""

from __future__ import annotations


def register(p):
    p.add_argument("pattern", nargs="?", default="*", help="shell-style pattern or substring, e.g. 'vit_base*'")
    p.add_argument("--json", action="store_true", help="print a JSON list as the last line")


def run(args) -> int:
    import torch

    from ...model.variants import build_model, list_models
    from ...model.vit import count_params
    from . import json_line

    names = list_models(args.pattern)
    rows = []
    for name in names:
        with torch.device("meta"):  # no memory, no init cost: shapes only
            m = build_model(name)
        c = m.cfg
        rows.append(dict(name=name, params=count_params(m), img_size=list(c.img_size), patch_size=c.patch_size,
                         embed_dim=c.embed_dim, depth=c.depth, num_heads=c.num_heads))
    if args.json:
        print(json_line(rows))
        return 0
    if not rows:
        print(f"no model matches {args.pattern!r}")
        return 1
    w = max(len(r["name"]) for r in rows)
    print(f"{'name':<{w}}  {'params':>9}  {'img':>7}  patch  width  depth  heads")
    for r in rows:
        img = "x".join(map(str, r["img_size"])) if r["img_size"][0] != r["img_size"][1] else str(r["img_size"][0])
        print(f"{r['name']:<{w}}  {r['params'] / 1e6:>8.2f}M  {img:>7}  {r['patch_size']:>5}  {r['embed_dim']:>5}"
              f"  {r['depth']:>5}  {r['num_heads']:>5}")
    return 0
