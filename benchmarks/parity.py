"""Logit parity of converted weights: vitkit vs timm and vitkit vs transformers, both directions.

For each configuration, random weights are made in one library, converted with vitkit.io.convert
through the files users would write (a timm .pth, an HF directory), loaded in the other library, and
the logits on the same random images compared: the table shows the max abs difference (float32, CPU)
next to the largest logit. A library that is not installed is skipped. Run with

    bash benchmarks/parity.sh          # creates .venv-ref with timm + transformers, runs tests and this
    python benchmarks/parity.py        # this table only, in an environment that has timm / transformers

Writes benchmarks/results/parity.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from vitkit import ViTConfig, VisionTransformer
from vitkit.io.convert import from_hf, from_timm, to_hf, to_timm

TOL = 1e-5

# name -> (vitkit config fields, std of the random weights)
CONFIGS: dict[str, tuple[dict, float]] = {
    "w48_p8_token": (dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10), 0.2),
    # vitkit's explicit softmax(QK^T)V path against the references' fused attention: not bitwise equal
    "w48_p8_token_manual_attn": (dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10,
                                      attn_impl="manual"), 0.2),
    "w32_p4_24x40": (dict(img_size=(24, 40), patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=7), 0.2),
    "w64_p16_noqkvbias_eps1e-12": (dict(img_size=64, patch_size=16, embed_dim=64, depth=2, num_heads=4, num_classes=3,
                                        qkv_bias=False, norm_eps=1e-12, mlp_ratio=2.0), 0.2),
    "w32_grey_p7_gelu_tanh": (dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=4,
                                   num_classes=5, act="gelu_tanh"), 0.2),
    "w32_avg_no_cls": (dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=6,
                            class_token=False, global_pool="avg", fc_norm=False), 0.2),
    "w64_avg_fc_norm_ls": (dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=4,
                                global_pool="avg", layer_scale=1e-5), 0.2),
    "vit_base_patch16_224": (dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12,
                                  num_classes=1000), 0.02),
    # register tokens, qk-norm and attention pooling (timm only: HF's ViT has none of them)
    "w48_p8_reg4": (dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10,
                         reg_tokens=4), 0.2),
    "w32_reg1_avg_no_cls_ls": (dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                                    reg_tokens=1, class_token=False, global_pool="avg", layer_scale=1e-5), 0.2),
    "w48_p8_qk_norm": (dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10,
                            qk_norm=True), 0.2),
    "w48_p8_map_no_cls": (dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10,
                               class_token=False, global_pool="map"), 0.2),
    "w64_p8_map_cls_reg2_qk_norm": (dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                         num_classes=6, reg_tokens=2, qk_norm=True, global_pool="map"), 0.2),
    "w64_p8_map_cls_reg2_qk_norm_manual_attn": (dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                                     num_classes=6, reg_tokens=2, qk_norm=True, global_pool="map",
                                                     attn_impl="manual"), 0.2),
    "dinov2_s14_reg4_518_depth2": (dict(img_size=518, patch_size=14, embed_dim=384, depth=2, num_heads=6,
                                        num_classes=0, reg_tokens=4, no_embed_class=True, layer_scale=1e-5), 0.02),
}


def randomize(model: torch.nn.Module, seed: int, std: float) -> torch.nn.Module:
    """Every parameter random; LayerNorm and LayerScale scales around 1."""
    g = torch.Generator().manual_seed(seed)
    scale_names = ("norm.weight", "norm1.weight", "norm2.weight", "gamma", "layernorm_before.weight",
                   "layernorm_after.weight", "layernorm.weight")
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * r if name.endswith(scale_names) else std * r)
    return model.eval()


def hf_supports(cfg: ViTConfig) -> bool:
    return (cfg.class_token and cfg.global_pool == "token" and not cfg.use_fc_norm and cfg.layer_scale is None
            and not cfg.reg_tokens and not cfg.qk_norm)


def timm_supports(cfg: ViTConfig) -> bool:
    return cfg.act == "gelu" and cfg.norm == "pre" and cfg.stem == "patch" and cfg.representation_size is None


def run_timm(cfg: ViTConfig, std: float, x: torch.Tensor, tmp: Path) -> dict[str, float]:
    import timm.models.vision_transformer as tv

    from vitkit.io.timm import timm_model_kwargs

    out = {}
    model = randomize(VisionTransformer(cfg), 0, std)
    ref = tv.VisionTransformer(**timm_model_kwargs(cfg)).eval()
    ref.load_state_dict(to_timm(model), strict=True)
    with torch.no_grad():
        out["vitkit->timm"] = (model(x) - ref(x)).abs().max().item()
    # timm's own layout of the position table: patches only where the config says so (DINOv2 with registers)
    ref = randomize(tv.VisionTransformer(**{**timm_model_kwargs(cfg), "no_embed_class": cfg.no_embed_class}), 1, std)
    torch.save(ref.state_dict(), tmp / "timm.pth")
    sets = {"num_heads": cfg.num_heads, "norm_eps": cfg.norm_eps, "img_size": list(cfg.img_size),
            "attn_impl": cfg.attn_impl}
    back = from_timm(tmp / "timm.pth", overrides=sets)
    with torch.no_grad():
        out["timm->vitkit"] = (back(x) - ref(x)).abs().max().item()
        out["max |logit|"] = ref(x).abs().max().item()
    return out


def run_hf(cfg: ViTConfig, std: float, x: torch.Tensor, tmp: Path) -> dict[str, float]:
    import transformers

    out = {}
    model = randomize(VisionTransformer(cfg), 0, std)
    to_hf(model, tmp / "hf_out")
    ref = transformers.ViTForImageClassification.from_pretrained(tmp / "hf_out").eval()
    with torch.no_grad():
        out["vitkit->hf"] = (model(x) - ref(pixel_values=x).logits).abs().max().item()
    h, w = cfg.img_size
    hf_cfg = transformers.ViTConfig(
        hidden_size=cfg.embed_dim, num_hidden_layers=cfg.depth, num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.mlp_hidden, image_size=h if h == w else [h, w], patch_size=cfg.patch_size,
        num_channels=cfg.in_chans, qkv_bias=cfg.qkv_bias, num_labels=cfg.num_classes, layer_norm_eps=cfg.norm_eps,
        hidden_act={"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}[cfg.act])
    ref = randomize(transformers.ViTForImageClassification(hf_cfg), 1, std)
    ref.save_pretrained(tmp / "hf_in")
    back = from_hf(tmp / "hf_in", overrides={"attn_impl": cfg.attn_impl})
    with torch.no_grad():
        logits = ref(pixel_values=x).logits
        out["hf->vitkit"] = (back(x) - logits).abs().max().item()
        out["max |logit|"] = logits.abs().max().item()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results/parity.json")
    p.add_argument("--only", default=None, help="run only configs whose name contains this")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    libs = {name: importlib.util.find_spec(name) is not None for name in ("timm", "transformers")}
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    for name, ok in libs.items():
        if ok:
            versions[name] = __import__(name).__version__
    if libs["transformers"]:
        import transformers

        transformers.utils.logging.disable_progress_bar()
    rows = []
    t0 = time.perf_counter()
    for name, (fields, std) in CONFIGS.items():
        if args.only and args.only not in name:
            continue
        cfg = ViTConfig(**fields)
        x = torch.randn(2, cfg.in_chans, *cfg.img_size, generator=torch.Generator().manual_seed(7))
        with tempfile.TemporaryDirectory() as tmp:
            for lib, fn in (("timm", run_timm), ("transformers", run_hf)):
                supported = {"timm": timm_supports, "transformers": hf_supports}[lib](cfg)
                if not libs[lib] or not supported:
                    continue
                res = fn(cfg, std, x, Path(tmp))
                scale = res.pop("max |logit|")
                for direction, diff in res.items():
                    rows.append(dict(config=name, library=lib, direction=direction, max_abs_diff=diff,
                                     max_abs_logit=scale, ok=diff <= TOL))
    elapsed = time.perf_counter() - t0
    w = max(len(r["config"]) for r in rows) if rows else 10
    print(f"{'config':<{w}}  {'direction':<14}  {'max abs diff':>12}  {'max |logit|':>11}  <= {TOL:g}")
    for r in rows:
        print(f"{r['config']:<{w}}  {r['direction']:<14}  {r['max_abs_diff']:>12.3e}  {r['max_abs_logit']:>11.3f}  "
              f"{'yes' if r['ok'] else 'NO'}")
    skipped = [lib for lib, ok in libs.items() if not ok]
    if skipped:
        print(f"skipped (not installed): {', '.join(skipped)}")
    worst = max((r["max_abs_diff"] for r in rows), default=float("nan"))
    print(f"{len(rows)} comparisons, worst {worst:.3e}, {elapsed:.1f} s; " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tolerance": TOL, "versions": versions, "skipped": skipped, "rows": rows,
                               "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])])}, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
