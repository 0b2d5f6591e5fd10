"""Hugging Face ViT directories: config.json + model.safetensors (or pytorch_model.bin).

ViTForImageClassification keeps the encoder under ``vit.`` and a ``classifier``; ViTModel has no
prefix and an optional ``pooler`` (Linear + tanh on the [cls] token: vitkit's pre-logits layer, the
JAX checkpoints' ``pre_logits``). Files on disk use these names (transformers 5 renames modules in
memory, e.g. ``layers.i.attention.q_proj``, and maps them back when saving); both spellings are read.

HF's ViT always has a class token, token pooling, learned position embeddings with a class slot,
pre-LN blocks without LayerScale or qk-norm, no register tokens, and a patch-projection stem; models
that differ are refused with the feature named. ``layer_norm_eps`` (HF's default 1e-12) is carried
into ViTConfig.norm_eps.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
import warnings
from pathlib import Path

import torch

from ..core.errors import CheckpointError, VitkitWarning
from ..core.strict import parse_json, read_json_object, real_in, whole_in
from ..model.config import MAX_WHOLE, NORM_EPS_MAX, Preprocess, ViTConfig
from .arch import arch_config, mlp_ratio_for
from .atomic import atomic_write_bytes, atomic_write_text
from .checkpoint import load_state_dict_file
from .keys import Rule, assemble, build, expected_state, learned_pos_table, refuse, same
from .preprocess import assumed_preprocess, from_image_processor

ACT_FROM_HF = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "relu": "relu"}
ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
RESAMPLE_TO_HF = {"nearest": 0, "bilinear": 2, "bicubic": 3}  # PIL constants
HF_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                   hidden_act="gelu", layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3,
                   qkv_bias=True, pooler_act="tanh")
# the config.json fields read, by what each must be (their ranges beyond these: ViTConfig's)
HF_COUNTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "num_channels")
HF_SIZES = ("image_size", "patch_size")  # one whole number, or [height, width]
HF_RATES = {"layer_norm_eps": (0.0, NORM_EPS_MAX, True, False), "hidden_dropout_prob": (0.0, 1.0, False, True),
            "attention_probs_dropout_prob": (0.0, 1.0, False, True)}  # (lo, hi, open at lo, open at hi)

# transformers 5 in-memory names -> the names on disk (and in transformers 4)
_MODERN = [
    (r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."),
    (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."),
    (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."),
    (r"\.mlp\.fc1\.", ".intermediate.dense."),
    (r"\.mlp\.fc2\.", ".output.dense."),
]


def _legacy_name(key: str) -> str:
    for pat, rep in _MODERN:
        key = re.sub(pat, rep, key)
    return key


def hf_table(cfg: ViTConfig, prefix: str) -> dict[str, Rule]:
    """vitkit key -> (HF keys, how to make the vitkit tensor from them)."""
    p = prefix
    cat = lambda *ts: torch.cat(ts, dim=0)  # noqa: E731 - q, k, v stacked into qkv
    t = {
        "cls_token": (f"{p}embeddings.cls_token",),
        "pos_embed": (f"{p}embeddings.position_embeddings",),
        "patch_embed.proj.weight": (f"{p}embeddings.patch_embeddings.projection.weight",),
        "patch_embed.proj.bias": (f"{p}embeddings.patch_embeddings.projection.bias",),
        "norm.weight": (f"{p}layernorm.weight",),
        "norm.bias": (f"{p}layernorm.bias",),
        "pre_logits.fc.weight": (f"{p}pooler.dense.weight",),
        "pre_logits.fc.bias": (f"{p}pooler.dense.bias",),
        "head.weight": ("classifier.weight",),
        "head.bias": ("classifier.bias",),
    }
    table = {k: (v, same) for k, v in t.items()}
    for i in range(cfg.depth):
        b, h = f"blocks.{i}.", f"{p}encoder.layer.{i}."
        for wb in ("weight", "bias"):
            table[f"{b}norm1.{wb}"] = ((f"{h}layernorm_before.{wb}",), same)
            table[f"{b}norm2.{wb}"] = ((f"{h}layernorm_after.{wb}",), same)
            qkv = tuple(f"{h}attention.attention.{n}.{wb}" for n in ("query", "key", "value"))
            table[f"{b}attn.qkv.{wb}"] = (qkv, cat)
            table[f"{b}attn.proj.{wb}"] = ((f"{h}attention.output.dense.{wb}",), same)
            table[f"{b}mlp.fc1.{wb}"] = ((f"{h}intermediate.dense.{wb}",), same)
            table[f"{b}mlp.fc2.{wb}"] = ((f"{h}output.dense.{wb}",), same)
    return table


# ----------------------------------------------------------------------------------------- read
def read_hf_dir(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor], str]:
    """(config.json as a dict, state dict, the weights file's name) of an HF model directory."""
    path = Path(path)
    if path.is_file() and path.name in ("config.json", "model.safetensors"):
        path = path.parent  # a file of the directory stands for it (detect_format tells it 'hf')
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory (an HF model is a directory with config.json and weights)")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: missing (an HF model directory holds config.json)")
    hf_cfg = read_json_object(cfg_file, CheckpointError)
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return hf_cfg, load_state_dict_file(path / name), str(path / name)
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (path / index).is_file():
            try:
                weight_map = parse_json((path / index).read_text(encoding="utf-8"))["weight_map"]
                shards = sorted(set(weight_map.values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise CheckpointError(f"{path / index}: not a valid shard index (no 'weight_map')") from None
            sd: dict[str, torch.Tensor] = {}
            for shard in shards:
                sd.update(load_state_dict_file(path / shard))
            return hf_cfg, sd, str(path / index)
    raise CheckpointError(f"{path}: no model.safetensors or pytorch_model.bin beside config.json")


def checked_fields(hf_cfg: dict, source: str) -> dict:
    """config.json's fields over HF's defaults, each read one checked for its type (and a rate or eps for its
    range); a bad one is a CheckpointError naming ``source`` and the field."""
    c = {**HF_DEFAULTS, **hf_cfg}
    c.setdefault("hidden_dropout_prob", 0.0)
    c.setdefault("attention_probs_dropout_prob", 0.0)
    for name in HF_COUNTS:
        whole_in(c[name], f"{source}: {name}", 1, MAX_WHOLE, CheckpointError)
    for name in HF_SIZES:
        sides = c[name] if isinstance(c[name], (list, tuple)) and len(c[name]) == 2 else [c[name]]
        for v in sides:
            whole_in(v, f"{source}: {name}", 1, MAX_WHOLE, CheckpointError)
    for name, (lo, hi, open_lo, open_hi) in HF_RATES.items():
        c[name] = real_in(c[name], f"{source}: {name}", lo, hi, open_lo=open_lo, open_hi=open_hi, error=CheckpointError)
    for name, kind in (("hidden_act", str), ("pooler_act", str), ("model_type", str), ("qkv_bias", bool)):
        if name in c and not isinstance(c[name], kind):
            what = "true or false" if kind is bool else "a string"
            raise CheckpointError(f"{source}: {name}: expected {what}, got {reprlib.repr(c[name])}")
    return c


def infer(hf_cfg: dict, sd: dict, source: str, cfg_file: str | None = None) -> tuple[dict, dict]:
    """(ViTConfig fields, notes) from HF's config.json (``cfg_file``, named in errors about its fields;
    ``source`` is the weights') and the weights' keys."""
    c = checked_fields(hf_cfg, cfg_file or source)
    model_type = c.get("model_type", "vit")
    if model_type != "vit":
        raise CheckpointError(f"{source}: model_type {model_type!r} is not a plain ViT ('vit')")
    act = ACT_FROM_HF.get(c["hidden_act"])
    if act is None:
        raise CheckpointError(f"{source}: hidden_act {c['hidden_act']!r} has no vitkit equivalent "
                              f"(known: {', '.join(ACT_FROM_HF)})")
    ps = c["patch_size"]
    if isinstance(ps, (list, tuple)):
        if len(ps) != 2 or ps[0] != ps[1]:
            raise CheckpointError(f"{source}: patch_size {ps} is not square")
        ps = ps[0]
    img = c["image_size"]
    D = c["hidden_size"]
    prefix = "vit." if any(k.startswith("vit.") for k in sd) else ""
    has_pooler = f"{prefix}pooler.dense.weight" in sd
    has_head = "classifier.weight" in sd
    if has_pooler and has_head:
        raise CheckpointError(f"{source}: holds both a pooler and a classifier; HF's classifier reads the [cls] "
                              "token, not the pooler, and vitkit's head follows the pre-logits layer")
    if has_pooler and c.get("pooler_act", "tanh") != "tanh":
        raise CheckpointError(f"{source}: pooler_act {c['pooler_act']!r} is not tanh (vitkit's pre-logits layer)")
    seen = dict(
        embed_dim=D,
        depth=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"],
        mlp_ratio=mlp_ratio_for(c["intermediate_size"], D),
        act=act,
        norm_eps=c["layer_norm_eps"],
        img_size=list(img) if isinstance(img, (list, tuple)) else img,
        patch_size=ps,
        in_chans=c["num_channels"],
        qkv_bias=bool(c["qkv_bias"]),
        class_token=True,
        global_pool="token",
        fc_norm=False,
        pos_embed="learn",
        no_embed_class=False,
        num_classes=sd["classifier.weight"].shape[0] if has_head else 0,
        representation_size=sd[f"{prefix}pooler.dense.weight"].shape[0] if has_pooler else None,
        drop_rate=c["hidden_dropout_prob"],
        attn_drop_rate=c["attention_probs_dropout_prob"],
    )
    return seen, {"prefix": prefix}


def _labels(hf_cfg: dict, num_classes: int, source: str = "config.json") -> list[str] | None:
    """Class names from id2label, unless HF's placeholders LABEL_i; an id2label of another length than the
    head's classes is left out, with a warning."""
    id2label = hf_cfg.get("id2label")
    if not isinstance(id2label, dict) or not num_classes:
        return None
    if len(id2label) != num_classes:
        warnings.warn(f"{source}: id2label names {len(id2label)} classes but the head has {num_classes}; the "
                      "labels are left out (predictions show class numbers)", VitkitWarning, stacklevel=2)
        return None
    try:
        names = [str(id2label[k]) for k in sorted(id2label, key=int)]
    except ValueError:
        return None
    if names == [f"LABEL_{i}" for i in range(num_classes)]:
        return None
    return names


def _preprocess(folder: Path, cfg: ViTConfig) -> tuple[Preprocess, dict, str]:
    """(Preprocess, assumed, where it came from) of an HF model folder: its preprocessor_config.json, else
    ViTImageProcessor's defaults (mean and std 0.5, bilinear, the image squashed to the size), assumed."""
    file = folder / "preprocessor_config.json"
    if not file.is_file():
        pre = Preprocess(interpolation="bilinear", resize="squash").for_channels(cfg.in_chans)
        return pre, assumed_preprocess(pre), "ViTImageProcessor's defaults"
    pre, assumed = from_image_processor(read_json_object(file, CheckpointError), cfg.img_size, cfg.in_chans,
                                        str(file))
    return pre, assumed, str(file)


def read_hf(path, cfg: ViTConfig | None = None, model=None, *, model_name=None, overrides=None):
    """(VisionTransformer, info) from an HF ViT directory."""
    hf_cfg, sd, source = read_hf_dir(path)
    sd = {_legacy_name(k): v for k, v in sd.items()}
    seen, notes = infer(hf_cfg, sd, source, str(Path(source).parent / "config.json"))
    if model is not None:
        cfg = model.cfg
    elif cfg is None:
        cfg, _ = arch_config(seen, {}, str(Path(path) / "config.json"), model_name=model_name,
                                overrides=overrides)
    expected = expected_state(cfg)
    state = assemble(expected, hf_table(cfg, notes["prefix"]), sd, source)
    model = build(cfg, state, source, model)
    model.labels = _labels(hf_cfg, cfg.num_classes, str(Path(source).parent / "config.json"))
    model.preprocess, assumed, pre_from = _preprocess(Path(source).parent, cfg)
    return model, {"source": source, "assumed": {}, "preprocess_assumed": assumed, "preprocess_from": pre_from}


# ---------------------------------------------------------------------------------------- write
def hf_config(model) -> dict:
    """config.json for transformers' ViTConfig describing ``model`` (refusing what HF cannot hold)."""
    cfg = model.cfg
    refuse(model, "HF ViT", {
        "no class token (class_token=False)": not cfg.class_token,
        "register tokens (reg_tokens)": cfg.reg_tokens > 0,
        "attention pooling (global_pool='map')": cfg.global_pool == "map",
        f"pooling {cfg.global_pool!r} (HF's classifier reads the [cls] token)":
            cfg.global_pool not in ("token", "map"),
        "a LayerNorm after pooling (fc_norm)": cfg.use_fc_norm,
        "post-LN blocks (norm='post')": cfg.norm == "post",
        "the convolutional stem (stem='conv'; transformers has no conv-stem ViT: `vitkit export` writes ONNX "
        "or TorchScript, or `--to timm`)": cfg.stem == "conv",
        "LayerScale (layer_scale)": cfg.layer_scale is not None,
        "qk-norm (qk_norm)": cfg.qk_norm,
        "a pre-logits layer together with a head (ViTForImageClassification has no pooler; "
        "ViTModel has no head)": cfg.representation_size is not None and cfg.num_classes > 0,
    })
    h, w = cfg.img_size
    labels = model.labels or [f"LABEL_{i}" for i in range(cfg.num_classes)]
    out = {
        "architectures": ["ViTForImageClassification" if cfg.num_classes else "ViTModel"],
        "model_type": "vit",
        "hidden_size": cfg.embed_dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_hidden,
        "hidden_act": ACT_TO_HF[cfg.act],
        "hidden_dropout_prob": cfg.drop_rate,
        "attention_probs_dropout_prob": cfg.attn_drop_rate,
        "initializer_range": 0.02,
        "layer_norm_eps": cfg.norm_eps,
        "image_size": h if h == w else [h, w],
        "patch_size": cfg.patch_size,
        "num_channels": cfg.in_chans,
        "qkv_bias": cfg.qkv_bias,
        "encoder_stride": cfg.patch_size,
        "pooler_output_size": cfg.representation_size or cfg.embed_dim,
        "pooler_act": "tanh",
        "dtype": "float32",
    }
    if cfg.num_classes:
        out["id2label"] = {str(i): name for i, name in enumerate(labels)}
        out["label2id"] = {name: i for i, name in enumerate(labels)}
    return out


def to_hf_state(model) -> dict[str, torch.Tensor]:
    """The weights under HF's on-disk names (ViTForImageClassification with a head, else ViTModel)."""
    cfg = model.cfg
    hf_config(model)  # refuses what HF cannot hold
    prefix = "vit." if cfg.num_classes else ""
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    sd["pos_embed"] = learned_pos_table(model)
    out: dict[str, torch.Tensor] = {}
    for key, (hf_keys, _) in hf_table(cfg, prefix).items():
        if key not in sd:
            continue
        if len(hf_keys) == 3:  # qkv -> query, key, value
            for name, part in zip(hf_keys, sd[key].chunk(3, dim=0)):
                out[name] = part.contiguous()
        else:
            out[hf_keys[0]] = sd[key].contiguous()
    return out


def image_processor(pre: Preprocess, img_size: tuple[int, int], in_chans: int, where) -> dict:
    """The preprocessor_config.json of a model that preprocesses as ``pre`` at ``img_size``: a squash
    (``pre.resize``) is ViTImageProcessor's resize to the size (DeiTImageProcessor's, then a centre crop, at
    crop_pct < 1); the short side resized and the centre cropped is BitImageProcessor's (shortest_edge,
    crop_size), with vitkit's sizes: the short side to floor(size / crop_pct) and the long side truncated.
    HF's processors resize the short side to one length, so a non-square input (whose resize covers both
    sides) is given the longer of the two, which covers the crop without padding and frames square images
    as vitkit does, with a warning naming ``where``."""
    h, w = img_size
    side = [max(s, math.floor(s / pre.crop_pct + 1e-9)) for s in img_size]  # data.splits.eval_resize's
    out = {"do_resize": True, "resample": RESAMPLE_TO_HF[pre.interpolation], "do_rescale": True,
           "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": list(pre.mean), "image_std": list(pre.std),
           "do_convert_rgb": in_chans == 3}
    crop = {"do_center_crop": True, "crop_size": {"height": h, "width": w}}
    if pre.resize == "squash":
        if side == [h, w]:
            return {"image_processor_type": "ViTImageProcessor", **out, "size": {"height": h, "width": w}}
        return {"image_processor_type": "DeiTImageProcessor", **out, "size": {"height": side[0], "width": side[1]},
                **crop}
    if side[0] != side[1]:
        warnings.warn(f"{where}: preprocessor_config.json resizes the short side to {max(side)} and crops {h}x{w}; "
                      f"vitkit resizes an image to cover {side[0]}x{side[1]}, which HF's processors cannot: only "
                      "square images get vitkit's input", VitkitWarning, stacklevel=3)
    return {"image_processor_type": "BitImageProcessor", **out, "size": {"shortest_edge": max(side)}, **crop}


def write_hf(model, path: str | os.PathLike, return_files: bool = False):
    """Write config.json, model.safetensors and preprocessor_config.json into directory ``path``."""
    from safetensors.torch import save as st_save

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path}: exists and is not a directory (an HF model is a directory)")
    config = hf_config(model)
    state = to_hf_state(model)
    processor = image_processor(model.preprocess, model.cfg.img_size, model.cfg.in_chans, path)
    files = [path / "model.safetensors", path / "config.json", path / "preprocessor_config.json"]
    atomic_write_bytes(files[0], st_save(state, metadata={"format": "pt"}))
    atomic_write_text(files[1], json.dumps(config, indent=2) + "\n")
    atomic_write_text(files[2], json.dumps(processor, indent=2) + "\n")
    return files if return_files else path
