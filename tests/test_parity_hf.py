"""Same random weights, same logits in vitkit and transformers' ViT, in both directions (float32, 1e-5)."""

import pytest
import torch
from helpers import assert_same_logits, random_images, randomize, run_docs_lines

from vitkit import VisionTransformer, ViTConfig
from vitkit.core.errors import CheckpointError
from vitkit.io.convert import from_hf, to_hf

transformers = pytest.importorskip("transformers")

TOL = 1e-5

# (name, vitkit config fields); every model is tiny: width 32..64, depth 2
CONFIGS = {
    "base_like": dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10),
    "patch4_nonsquare": dict(img_size=(24, 40), patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=7),
    "no_qkv_bias_eps": dict(img_size=32, patch_size=16, embed_dim=64, depth=2, num_heads=4, num_classes=3,
                            qkv_bias=False, norm_eps=1e-12, mlp_ratio=2.0),
    "grey_gelu_tanh": dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=4,
                           num_classes=5, act="gelu_tanh"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_vitkit_to_hf(name, tmp_path):
    cfg = ViTConfig(**CONFIGS[name])
    model = randomize(VisionTransformer(cfg))
    to_hf(model, tmp_path)
    ref = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
    assert_same_logits(model, lambda x: ref(pixel_values=x).logits, random_images(cfg), tol=TOL)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_to_vitkit(name, tmp_path):
    c = ViTConfig(**CONFIGS[name])
    h, w = c.img_size
    hf_cfg = transformers.ViTConfig(
        hidden_size=c.embed_dim, num_hidden_layers=c.depth, num_attention_heads=c.num_heads,
        intermediate_size=c.mlp_hidden, image_size=h if h == w else [h, w], patch_size=c.patch_size,
        num_channels=c.in_chans, qkv_bias=c.qkv_bias, num_labels=c.num_classes,
        hidden_act={"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}[c.act],
        **({"layer_norm_eps": c.norm_eps} if name != "base_like" else {}),  # base_like keeps HF's 1e-12
    )
    ref = randomize(transformers.ViTForImageClassification(hf_cfg), seed=3)
    ref.save_pretrained(tmp_path)
    model = from_hf(tmp_path)
    assert model.cfg.num_heads == c.num_heads and model.cfg.img_size == c.img_size
    assert model.cfg.norm_eps == (1e-12 if name == "base_like" else c.norm_eps)
    assert_same_logits(model, lambda x: ref(pixel_values=x).logits, random_images(c), tol=TOL)


def test_vitmodel_pooler_is_pre_logits(tmp_path):
    """ViTModel's pooler (Linear + tanh on [cls]) is vitkit's pre-logits layer, in both directions."""
    hf_cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8, pooler_output_size=24)
    ref = randomize(transformers.ViTModel(hf_cfg), seed=5)
    ref.save_pretrained(tmp_path / "hf")
    model = from_hf(tmp_path / "hf")
    assert model.cfg.representation_size == 24 and model.cfg.num_classes == 0
    x = random_images(model.cfg)
    with torch.no_grad():
        out = ref(pixel_values=x)
    assert_same_logits(model, out.pooler_output, x, tol=TOL)
    assert_same_logits(model.forward_features, out.last_hidden_state, x, tol=TOL)
    to_hf(model, tmp_path / "back")
    back = transformers.ViTModel.from_pretrained(tmp_path / "back").eval()
    assert_same_logits(lambda x: back(pixel_values=x).pooler_output, out.pooler_output, x, tol=TOL)


@pytest.mark.parametrize("pos", ["sincos2d", "no_embed_class"])
def test_position_tables_hf_cannot_hold_are_written_as_learned(pos, tmp_path):
    extra = {"pos_embed": "sincos2d"} if pos == "sincos2d" else {"no_embed_class": True}
    cfg = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4, **extra)
    model = randomize(VisionTransformer(cfg))
    to_hf(model, tmp_path)
    ref = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
    assert_same_logits(model, lambda x: ref(pixel_values=x).logits, random_images(cfg), tol=TOL)


def test_labels_and_preprocess_round_trip(tmp_path):
    cfg = ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    model = VisionTransformer(cfg)
    model.labels = ["cat", "dog", "eel"]
    model.preprocess = type(model.preprocess)(mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.4), interpolation="bilinear")
    to_hf(model, tmp_path)
    ref = transformers.ViTForImageClassification.from_pretrained(tmp_path)
    assert ref.config.id2label == {0: "cat", 1: "dog", 2: "eel"}
    back = from_hf(tmp_path)
    assert back.labels == ["cat", "dog", "eel"]
    assert back.preprocess.mean == (0.4, 0.5, 0.6) and back.preprocess.interpolation == "bilinear"


@pytest.mark.parametrize("field, value, what", [
    ("global_pool", "avg", "pooling 'avg'"),
    ("layer_scale", 1e-5, "LayerScale"),
    ("norm", "post", "post-LN"),
    ("stem", "conv", "convolutional stem"),
])
def test_what_hf_cannot_hold_is_refused(field, value, what, tmp_path):
    extra = {field: value}
    if field == "global_pool":
        extra["class_token"] = False
    cfg = ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3, **extra)
    with pytest.raises(CheckpointError, match=f"HF ViT cannot hold this model: .*{what}"):
        to_hf(VisionTransformer(cfg), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_trained_checkpoint_loads_in_transformers_by_the_lines_docs_show(tmp_path, monkeypatch):
    """`vitkit convert RUN/best vit_hf --to hf`, then the lines of docs/convert.md."""
    monkeypatch.chdir(tmp_path)
    model, scope = run_docs_lines(tmp_path, "vit_hf", "hf", [
        "from transformers import ViTForImageClassification",
        'model = ViTForImageClassification.from_pretrained("vit_hf")',
    ])
    ref = scope["model"].eval()
    assert_same_logits(model, lambda x: ref(pixel_values=x).logits, random_images(model.cfg, n=2), tol=1e-4)
