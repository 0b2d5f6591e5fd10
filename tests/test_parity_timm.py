"""Same random weights, same logits in vitkit and timm's VisionTransformer, both directions (float32, 1e-5).

timm is not in the main environment: these tests skip there. `bash benchmarks/parity.sh` runs them.
"""

import re
from pathlib import Path

import pytest
import torch
from helpers import assert_same_logits, random_images, randomize, run_docs_lines

from vitkit import VisionTransformer, ViTConfig
from vitkit.core.errors import CheckpointError
from vitkit.io.convert import from_timm, to_timm
from vitkit.io.timm import save_timm, timm_model_kwargs

timm_vit = pytest.importorskip("timm.models.vision_transformer")

TOL = 1e-5
DOCS = Path(__file__).resolve().parents[1] / "docs" / "convert.md"

CONFIGS = {
    "token": dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10),
    "avg_no_cls": dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=7,
                       class_token=False, global_pool="avg", fc_norm=False),
    "avg_fc_norm": dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5,
                        global_pool="avg"),
    "nonsquare_layer_scale": dict(img_size=(24, 40), patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                  num_classes=3, layer_scale=1e-5, qkv_bias=False),
    "eps_grey_mlp2": dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=4,
                          num_classes=4, norm_eps=1e-12, mlp_ratio=2.0),
    "registers": dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10, reg_tokens=4),
    "registers_avg_no_cls": dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                                 reg_tokens=1, class_token=False, global_pool="avg", layer_scale=1e-5),
    "qk_norm": dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10, qk_norm=True),
    "map": dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10, class_token=False,
                global_pool="map"),
    "map_cls_registers_qk_norm": dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=6,
                                      reg_tokens=2, qk_norm=True, global_pool="map"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_vitkit_to_timm(name):
    cfg = ViTConfig(**CONFIGS[name])
    model = randomize(VisionTransformer(cfg))
    ref = timm_vit.VisionTransformer(**timm_model_kwargs(cfg)).eval()
    ref.load_state_dict(to_timm(model), strict=True)
    assert_same_logits(model, ref, random_images(cfg), tol=TOL)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_printed_timm_call_builds_the_same_network(name):
    """`vitkit convert --to timm` prints timm_source(cfg): evaluated with timm, it loads the weights strictly."""
    import functools

    from vitkit.io.timm import timm_source

    cfg = ViTConfig(**CONFIGS[name])
    model = randomize(VisionTransformer(cfg))
    scope = {"VisionTransformer": timm_vit.VisionTransformer, "partial": functools.partial, "nn": torch.nn}
    ref = eval(timm_source(cfg), scope).eval()
    ref.load_state_dict(to_timm(model), strict=True)
    assert_same_logits(model, ref, random_images(cfg), tol=TOL)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_timm_to_vitkit(name, tmp_path):
    cfg = ViTConfig(**CONFIGS[name])
    ref = randomize(timm_vit.VisionTransformer(**timm_model_kwargs(cfg)), seed=2)
    torch.save(ref.state_dict(), tmp_path / "w.pth")
    sets = {"num_heads": cfg.num_heads, "norm_eps": cfg.norm_eps}
    if cfg.img_size[0] != cfg.img_size[1]:
        sets["img_size"] = list(cfg.img_size)
    model = from_timm(tmp_path / "w.pth", overrides=sets)
    for field in ("embed_dim", "depth", "patch_size", "in_chans", "class_token", "global_pool", "use_fc_norm",
                  "qkv_bias", "num_classes", "img_size", "mlp_hidden", "reg_tokens", "qk_norm"):
        assert getattr(model.cfg, field) == getattr(cfg, field), field
    assert (model.cfg.layer_scale is None) == (cfg.layer_scale is None)
    assert_same_logits(model, ref, random_images(cfg), tol=TOL)


def test_timm_qk_norm_weights_convert_with_their_heads(tmp_path, capsys):
    """timm's qk_norm ViT, width 64 and 4 heads: `vitkit convert W.safetensors out --from timm` reads the heads
    from the norms' width (16) with nothing set, and gives timm's logits."""
    from safetensors.torch import save_file

    import vitkit
    from vitkit.cli.main import main

    ref = randomize(timm_vit.VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                               num_classes=5, qk_norm=True), seed=3).eval()
    save_file(ref.state_dict(), str(tmp_path / "W.safetensors"))
    assert main(["convert", str(tmp_path / "W.safetensors"), str(tmp_path / "out"), "--from", "timm"]) == 0
    assert "heads 4," in capsys.readouterr().out
    model = vitkit.load(tmp_path / "out")
    assert model.cfg.num_heads == 4 and model.cfg.qk_norm
    assert_same_logits(model, ref, random_images(model.cfg), tol=TOL)


@pytest.mark.parametrize("pos", ["sincos2d", "sincos1d", "none", "no_embed_class", "no_embed_class_registers",
                                 "sincos2d_registers"])
def test_fixed_and_patch_only_position_tables_become_learned(pos):
    extra = {"reg_tokens": 3} if pos.endswith("_registers") else {}
    pos = pos.removesuffix("_registers")
    extra.update({"no_embed_class": True} if pos == "no_embed_class" else {"pos_embed": pos})
    cfg = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3, **extra)
    model = randomize(VisionTransformer(cfg))
    ref = timm_vit.VisionTransformer(**timm_model_kwargs(cfg)).eval()
    ref.load_state_dict(to_timm(model), strict=True)
    assert_same_logits(model, ref, random_images(cfg), tol=TOL)


def test_resampled_position_table_matches_timm_with_antialias(tmp_path):
    """--img-size with antialias reproduces timm's own resampling (timm resamples with antialias)."""
    from timm.layers import resample_abs_pos_embed

    cfg = ViTConfig(**CONFIGS["token"])
    model = randomize(VisionTransformer(cfg))
    model.resample_to(48, antialias=True)
    ref_pe = resample_abs_pos_embed(to_timm(randomize(VisionTransformer(cfg)))["pos_embed"], (6, 6),
                                    num_prefix_tokens=1)
    assert (model.pos_embed - ref_pe).abs().max().item() <= 1e-6


@pytest.mark.parametrize("new_patch", [16, 4])
def test_patch_size_resampling_matches_timm(new_patch):
    """resample_patch_size reproduces timm's loading of a checkpoint into a model of another patch size
    (checkpoint_filter_fn: resample_patch_embed and resample_abs_pos_embed at their defaults)."""
    from timm.layers import resample_patch_embed

    cfg = ViTConfig(**CONFIGS["token"])  # patch 8 at 32x32
    model = randomize(VisionTransformer(cfg))
    weights = to_timm(model)
    model.resample_patch_size(new_patch)
    ref_kernel = resample_patch_embed(weights["patch_embed.proj.weight"], [new_patch, new_patch])
    torch.testing.assert_close(model.patch_embed.proj.weight, ref_kernel, rtol=1e-5,
                               atol=1e-5 * ref_kernel.abs().max().item())
    ref = timm_vit.VisionTransformer(**timm_model_kwargs(model.cfg)).eval()
    ref.load_state_dict(timm_vit.checkpoint_filter_fn(weights, ref), strict=True)
    assert_same_logits(model, ref, random_images(model.cfg), tol=TOL)


def test_save_timm_files_load_in_timm(tmp_path):
    cfg = ViTConfig(**CONFIGS["avg_fc_norm"])
    model = randomize(VisionTransformer(cfg))
    x = random_images(cfg)
    for name in ("w.safetensors", "w.pth"):
        save_timm(model, tmp_path / name)
        ref = timm_vit.VisionTransformer(**timm_model_kwargs(cfg)).eval()
        from vitkit.io.checkpoint import load_state_dict_file

        ref.load_state_dict(load_state_dict_file(tmp_path / name), strict=True)
        assert_same_logits(model, ref, x, tol=TOL)


@pytest.mark.parametrize("class_token", [True, False])
def test_timm_patch_only_table_with_registers(class_token, tmp_path):
    """timm's no_embed_class layout (DINOv2 with registers, the *_reg*_gap_* models): the table covers the
    patches only; the class and register tokens are added after it."""
    kw = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=4, reg_tokens=4,
              no_embed_class=True, init_values=1e-5, class_token=class_token,
              global_pool="token" if class_token else "avg")
    ref = randomize(timm_vit.VisionTransformer(**kw), seed=5)
    torch.save(ref.state_dict(), tmp_path / "w.pth")
    model = from_timm(tmp_path / "w.pth", overrides={"num_heads": 3})
    assert (model.cfg.no_embed_class, model.cfg.reg_tokens, model.cfg.class_token) == (True, 4, class_token)
    assert_same_logits(model, ref, random_images(model.cfg), tol=TOL)


def test_dinov2_with_registers_loads():
    """timm's own vit_small_patch14_reg4_dinov2 (two blocks, random weights): 518 px, patch 14, 4 registers,
    a patch-only position table, LayerScale, no head. Its architecture is read from the weights alone."""
    import timm

    ref = randomize(timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=2, num_classes=0),
                    seed=4)
    model = from_timm(ref.state_dict())
    c = model.cfg
    assert (c.img_size, c.patch_size, c.embed_dim, c.num_heads, c.reg_tokens, c.no_embed_class) == (
        (518, 518), 14, 384, 6, 4, True)
    assert c.layer_scale is not None and c.num_classes == 0 and c.global_pool == "token"
    x = torch.randn(1, 3, 518, 518, generator=torch.Generator().manual_seed(0))
    assert_same_logits(model, ref, x, tol=TOL)
    with torch.no_grad():  # the patch features DINOv2 users read
        ours = model.forward_intermediates(x, 1, norm=True, intermediates_only=True)
        theirs = ref.forward_intermediates(x, 1, norm=True, intermediates_only=True)
    assert_same_logits(ours[0], theirs[0], tol=TOL)


@pytest.mark.parametrize("name, what", [
    ("vit_giant_patch14_reg4_dinov2", "SwiGLU MLPs"),
    ("vit_pwee_patch16_reg1_gap_256", "parallel blocks"),
    ("vit_base_patch16_18x2_224", "parallel blocks"),
    ("vit_base_patch16_rope_reg1_gap_256", r"rotary position embeddings \(timm's Eva: "),
    ("naflexvit_so150m2_patch16_reg1_gap", r"NaFlex embeddings \(timm's NaFlexVit: "),
    ("vit_dwee_patch16_reg1_gap_256", "differential attention"),
])
def test_other_timm_reg_families_are_refused_naming_the_feature(name, what):
    import timm

    with torch.device("meta"):  # the keys and shapes are what is read: no memory for the weights
        sd = timm.create_model(name, pretrained=False, depth=1).state_dict()
    with pytest.raises(CheckpointError, match=f"^timm state dict: holds {what}"):
        from_timm(sd)


# ------------------------------------------------------------------------------ forward_intermediates
INTERMEDIATES = [
    dict(),
    dict(indices=2, norm=True),
    dict(indices=[0, -1], output_fmt="NLC"),
    dict(indices=[2, 0], return_prefix_tokens=True),
    dict(indices=1, return_prefix_tokens=True, output_fmt="NLC", norm=True, intermediates_only=True),
    dict(indices=[1], stop_early=True),
    dict(indices=[0, 1], stop_early=True, norm=True, output_fmt="NLC", return_prefix_tokens=True),
    dict(indices=2, output_dict=True, return_prefix_tokens=True),
]


def _flatten(out) -> list[torch.Tensor]:
    """Every tensor of a forward_intermediates result, in order (tuples, lists and dicts opened)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _flatten(out[k])]
    return [t for item in out for t in _flatten(item)]


@pytest.mark.parametrize("name", ["token", "registers", "avg_no_cls", "avg_fc_norm"])
@pytest.mark.parametrize("call", range(len(INTERMEDIATES)))
def test_forward_intermediates_matches_timm(name, call):
    fields = dict(CONFIGS[name], depth=3)
    cfg = ViTConfig(**fields)
    model = randomize(VisionTransformer(cfg))
    ref = timm_vit.VisionTransformer(**timm_model_kwargs(cfg)).eval()
    ref.load_state_dict(to_timm(model), strict=True)
    x = random_images(cfg)
    kw = INTERMEDIATES[call]
    with torch.no_grad():
        ours, theirs = model.forward_intermediates(x, **kw), ref.forward_intermediates(x, **kw)
    assert type(ours) is type(theirs) and len(ours) == len(theirs)
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys()
    a, b = _flatten(ours), _flatten(theirs)
    assert [t.shape for t in a] == [t.shape for t in b]
    for t, u in zip(a, b):
        assert_same_logits(t, u, tol=TOL)


@pytest.mark.parametrize("args", [(2, True), (2, True, True, True), ([0, 2], False, True), (1, True, False, True)])
def test_get_intermediate_layers_positional_arguments_as_timm(args):
    cfg = ViTConfig(**dict(CONFIGS["registers"], depth=3))
    model = randomize(VisionTransformer(cfg))
    ref = timm_vit.VisionTransformer(**timm_model_kwargs(cfg)).eval()
    ref.load_state_dict(to_timm(model), strict=True)
    x = random_images(cfg)
    with torch.no_grad():
        a, b = _flatten(model.get_intermediate_layers(x, *args)), _flatten(ref.get_intermediate_layers(x, *args))
    assert [t.shape for t in a] == [t.shape for t in b]
    for t, u in zip(a, b):
        assert_same_logits(t, u, tol=TOL)


@pytest.mark.parametrize("size", ["small", "base", "large"])
def test_named_dinov2_models_have_timms_tensors(size):
    import timm

    import vitkit

    name = f"vit_{size}_patch14_reg4_dinov2"
    with torch.device("meta"):
        ours = vitkit.create_model(name).state_dict()
        theirs = timm.create_model(name, pretrained=False, num_classes=0).state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


def test_a_trained_checkpoint_loads_in_timm_by_the_lines_docs_show(tmp_path, monkeypatch):
    """`vitkit convert RUN/best vit_timm.safetensors --to timm`, then the three lines of docs/convert.md."""
    monkeypatch.chdir(tmp_path)
    model, scope = run_docs_lines(tmp_path, "vit_timm.safetensors", "timm", [
        "import timm, safetensors.torch",
        'model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10)',
        'model.load_state_dict(safetensors.torch.load_file("vit_timm.safetensors"))',
    ])
    assert_same_logits(model, scope["model"].eval(), random_images(model.cfg, n=2), tol=1e-4)


def _docs_block(containing: str) -> str:
    """The ```python block of docs/convert.md that contains ``containing``."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    return next(b for b in blocks if containing in b)


@pytest.mark.parametrize("name", ["demo", "whiten_token", "whiten_early"])
def test_conv_stem_models_load_in_timm_by_the_docs_function(name, tmp_path, monkeypatch, capsys):
    """`vitkit convert CKPT hybrid_timm.safetensors --to timm` prints the timm call; docs' conv_stem and that
    call build the model in timm, which loads the file strictly and gives vitkit's logits (1e-4)."""
    import vitkit
    from vitkit.cli.main import main
    from vitkit.tools.demo import DEMO_MODEL

    if name == "demo":  # the shipped model: the docs' example, trained (BatchNorm statistics included)
        model, ckpt = vitkit.load(DEMO_MODEL), DEMO_MODEL
    else:
        model = randomize(VisionTransformer(ViTConfig(
            img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=5, stem="conv", stem_width=8,
            stem_whiten=True, stem_convs=2, stem_early_convs=int(name == "whiten_early"), pos_embed="sincos2d",
            qk_norm=True)), seed=5)
        ckpt = vitkit.save(model, tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    assert main(["convert", str(ckpt), "hybrid_timm.safetensors", "--to", "timm"]) == 0
    printed = capsys.readouterr().out.splitlines()[-1]
    call = printed.removeprefix("timm builds it as: ").removesuffix(" (conv_stem: docs/convert.md)")
    code = _docs_block("def conv_stem")
    if name == "demo":
        assert f"model = {call}\n" in code  # the docs show what the command prints for the shipped model
    else:
        code = re.sub(r"model = VisionTransformer\(.*\)\n", f"model = {call}\n", code)
    scope: dict = {}
    exec(code, scope)
    ref = scope["model"]
    assert not ref.training
    assert_same_logits(model, ref, random_images(model.cfg, n=3), tol=1e-4)
