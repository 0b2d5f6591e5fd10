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


def crop_offsets_agree(size: tuple[int, int], pre) -> bool:
    """Whether HF's centre crop, which floors the offset, starts where vitkit's (timm's and torchvision's:
    rounded half to even) does for an image of ``size`` at a 32 x 32 input; they differ by a pixel where the
    resized side exceeds the crop by 4k + 3."""
    from vitkit.data.splits import eval_resize

    th, tw = eval_resize((32, 32), pre.crop_pct)
    h, w = size
    rh, rw = (th, tw) if pre.resize == "squash" else (th, max(tw, int(w * th / h))) if h <= w else (int(h * tw / w), tw)
    return all((r - 32) // 2 == int(round((r - 32) / 2.0)) for r in (rh, rw))


@pytest.mark.parametrize("pre", [dict(crop_pct=0.875, interpolation="bicubic"),
                                 dict(crop_pct=1.0, interpolation="bilinear"),
                                 dict(crop_pct=0.875, interpolation="bilinear", resize="squash")])
def test_hf_image_pipeline_sees_what_vitkit_predict_sees_on_non_square_images(tmp_path, pre):
    """`vitkit convert --to hf` writes the processor that resizes and crops as the checkpoint does (the short
    side and the centre crop, or the squash): transformers' image-classification pipeline on photos that are
    not square gets vitkit's input, up to PIL's rounding to whole pixel values (where the two centre crops start
    on the same pixel, ``crop_offsets_agree``), and the same top-1."""
    from helpers import noise_image
    from PIL import Image
    from transformers import AutoImageProcessor, pipeline

    from vitkit import Preprocess
    from vitkit.tools.predict import predict

    model = randomize(VisionTransformer(ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                                  num_classes=5)), seed=3)
    model.preprocess = Preprocess(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), **pre)
    to_hf(model.eval(), tmp_path / "hf")
    processor = AutoImageProcessor.from_pretrained(tmp_path / "hf")
    paths, sizes = [], [(40, 90), (75, 47), (33, 64), (100, 61), (52, 100)]
    for i, (h, w) in enumerate(sizes):
        img = noise_image(h, w, seed=i).resize((w // 4, h // 4)).resize((w, h))  # smooth: resampling matters less
        paths.append(tmp_path / f"{i}.png")
        img.save(paths[-1])
    from vitkit.data import decode_image, to_model_input

    for p, size in zip(paths, sizes):
        ours = to_model_input(decode_image(p, 3), (32, 32), model.preprocess)
        theirs = processor(images=Image.open(p).convert("RGB"), return_tensors="pt")["pixel_values"][0]
        assert theirs.shape == ours.shape
        if crop_offsets_agree(size, model.preprocess):
            assert (theirs - ours).abs().mean() < 0.02, p  # PIL's whole pixel values against vitkit's floats
    hf_top1 = [max(r, key=lambda d: d["score"])["label"] for r in
               pipeline("image-classification", model=str(tmp_path / "hf"), image_processor=processor)([str(p) for p in paths])]
    ours = [str(r["top"][0]["index"]) for r in predict(model, [str(p) for p in paths], top_k=1)["predictions"]]
    assert [label.replace("LABEL_", "") for label in hf_top1] == ours
