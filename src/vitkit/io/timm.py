"""timm VisionTransformer state dicts: an identity key map, since vitkit's module names follow timm.

Read from a state dict or a .pth / .pt / .bin (torch.load with weights_only=True) / .safetensors
file. What the weights show: width, depth, patch size, channels, MLP width, qkv bias, class token,
register tokens (``reg_token``'s length), position table (image size, and whether it has slots for
the class and register tokens), LayerScale, qk-norm (``attn.q_norm`` / ``k_norm``), fc_norm (average
pooling), attention pooling (``attn_pool.*``), classes, and with qk-norm the heads (the norms are as
wide as one head: heads = width / head width). What they do not: heads without qk-norm (taken from the
named sizes' width table, else width / 64), LayerNorm eps (1e-6) and the activation (exact GELU).

timm builds some models (many of the ``*_reg*`` ones among them) from parts vitkit does not have:
SwiGLU MLPs, parallel blocks, Eva's blocks with rotary position embeddings, NaFlex embeddings,
differential attention. Their state dicts are refused, with the feature and the key that shows it
named, rather than reported as a list of keys that do not fit.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Mapping

import torch

from ..core.errors import CheckpointError
from ..core.strict import read_json_object
from ..model.config import ViTConfig
from ..model.variants import REGISTRY
from .arch import arch_config, heads_from_width, mlp_ratio_for
from .atomic import atomic_path, atomic_write_text
from .checkpoint import load_state_dict_file
from .keys import assemble, build, expected_state, learned_pos_table, refuse, same
from .preprocess import from_pretrained_cfg, timm_test_crop

TIMM_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")  # the files a timm state dict is read from and written to

# Features of timm models that vitkit's VisionTransformer lacks: (name, the timm model class that has it
# or "", pattern of a key that shows it).
FOREIGN_KEYS = (
    ("NaFlex embeddings", "timm's NaFlexVit", r"^embeds\."),
    ("parallel blocks", "", r"^blocks\.\d+\.(attns|ffns|in_proj|in_norm)\."),
    ("SwiGLU MLPs", "", r"^blocks\.\d+\.mlp\.(fc1_g|fc1_x)\."),
    ("rotary position embeddings", "timm's Eva", r"^rope\.|^blocks\.\d+\.(gamma_1$|attn\.[qv]_bias$)"),
    ("differential attention", "", r"^blocks\.\d+\.(attn\.)?lambda_q1$"),
    ("a CNN stem, whose strides the weights do not show (read vitkit's own conv-stem checkpoints instead)",
     "timm's HybridEmbed", r"^patch_embed\.backbone\."),
)


def foreign_features(sd: Mapping[str, torch.Tensor]) -> list[str]:
    """Each feature of ``sd`` that vitkit's VisionTransformer lacks, named with the key that shows it."""
    found = []
    for name, owner, pattern in FOREIGN_KEYS:
        key = next((k for k in sd if re.search(pattern, k)), None)
        if key is not None:
            found.append(f"{name} ({owner + ': ' if owner else ''}{key})")
    fc1, fc2 = sd.get("blocks.0.mlp.fc1.weight"), sd.get("blocks.0.mlp.fc2.weight")
    if fc1 is not None and fc2 is not None and fc1.ndim == fc2.ndim == 2 and fc1.shape[0] == 2 * fc2.shape[1]:
        # a packed SwiGLU: fc1 makes the gate and the value, fc2 reads their product (half as wide)
        found.append(f"SwiGLU MLPs (blocks.0.mlp.fc1.weight {tuple(fc1.shape)} makes twice the "
                     f"{fc2.shape[1]} inputs of blocks.0.mlp.fc2.weight)")
    return found


def infer(sd: Mapping[str, torch.Tensor], source: str) -> tuple[dict, dict, int | None]:
    """(fields the weights show, fields assumed, position-table length) of a timm ViT state dict."""
    foreign = foreign_features(sd)
    if foreign:
        raise CheckpointError(f"{source}: holds {'; '.join(foreign)}, which vitkit's VisionTransformer "
                              "does not have")
    w = sd.get("patch_embed.proj.weight")
    if w is None or w.ndim != 4:
        got = "no patch_embed.proj.weight" if w is None else f"patch_embed.proj.weight {tuple(w.shape)}"
        raise CheckpointError(f"{source}: not a timm ViT state dict ({got}; expected a (D, C, P, P) tensor)")
    D, C, P, P2 = w.shape
    if P != P2:
        raise CheckpointError(f"{source}: patch_embed.proj.weight {tuple(w.shape)} has non-square {P}x{P2} patches")
    blocks = [int(m.group(1)) for m in map(re.compile(r"blocks\.(\d+)\.").match, sd) if m]
    if not blocks:
        raise CheckpointError(f"{source}: no encoder blocks (no blocks.0.* tensors)")
    depth = max(blocks) + 1  # a block with tensors missing is reported as missing, not dropped
    fc1 = sd.get("blocks.0.mlp.fc1.weight")
    seen: dict = dict(embed_dim=D, depth=depth, patch_size=P, in_chans=C)
    if fc1 is not None:
        seen["mlp_ratio"] = mlp_ratio_for(fc1.shape[0], D)
    seen["qkv_bias"] = "blocks.0.attn.qkv.bias" in sd
    # timm's qk_norm makes both norms in every block; a stray one is reported as unexpected
    seen["qk_norm"] = "blocks.0.attn.q_norm.weight" in sd and "blocks.0.attn.k_norm.weight" in sd
    heads = _heads_from_qk_norm(sd.get("blocks.0.attn.q_norm.weight"), D)
    if heads is not None:
        seen["num_heads"] = heads
    seen["class_token"] = "cls_token" in sd
    reg = sd.get("reg_token")
    seen["reg_tokens"] = reg.shape[1] if reg is not None and reg.ndim == 3 else 0
    seen["layer_scale"] = 1e-5 if "blocks.0.ls1.gamma" in sd else None  # the value only seeds a re-init
    seen["num_classes"] = sd["head.weight"].shape[0] if "head.weight" in sd else 0
    seen["fc_norm"] = "fc_norm.weight" in sd
    seen["pos_embed"] = "learn" if "pos_embed" in sd else "none"
    seen["representation_size"] = sd["pre_logits.fc.weight"].shape[0] if "pre_logits.fc.weight" in sd else None
    guessed: dict = dict(num_heads=heads_from_width(D), norm_eps=1e-6, act="gelu")
    if "attn_pool.latent" in sd:
        seen["global_pool"] = "map"  # the attention-pooling head is in the weights
    elif not seen["class_token"]:
        seen["global_pool"] = "avg"  # no class token: the mean of the patch tokens
    else:
        guessed["global_pool"] = "avg" if seen["fc_norm"] else "token"  # timm's default pairing
    pos_len = sd["pos_embed"].shape[1] if "pos_embed" in sd and sd["pos_embed"].ndim == 3 else None
    return seen, guessed, pos_len


def is_timm_config(obj: Mapping) -> bool:
    """Whether a config.json (as a dict) is a timm Hub repository's: an ``architecture`` (and usually a
    ``pretrained_cfg``), no HF ``model_type`` and not vitkit's own."""
    return isinstance(obj.get("architecture"), str) and "model_type" not in obj and obj.get("format") != "vitkit"


def _heads_from_qk_norm(weight: torch.Tensor | None, dim: int) -> int | None:
    """The heads a q-norm weight shows: it is as wide as one head. None without one, or where its
    width does not divide the model's (the shape check then names the tensor)."""
    if weight is None or weight.ndim != 1 or not 0 < weight.shape[0] <= dim or dim % weight.shape[0]:
        return None
    return dim // weight.shape[0]


def read_timm(src, cfg: ViTConfig | None = None, model=None, *, model_name=None, overrides=None):
    """(VisionTransformer, info) from a timm state dict or file, or a timm Hub repository's folder (see
    ``read_timm_folder``); see ``arch.arch_config``. A bare state dict does not say how images are
    prepared: a file's preprocessing is the ``pretrained_cfg`` of the JSON file beside it that `vitkit
    convert --to timm` writes (``timm_config_file``), else timm's defaults (``from_pretrained_cfg`` of
    nothing: ImageNet's mean and std, crop_pct 0.875, bicubic, the centre crop), reported as assumed
    (info["preprocess_assumed"])."""
    if isinstance(src, (str, os.PathLike)) and (Path(src).is_dir() or Path(src).name == "config.json"):
        return read_timm_folder(src, model_name=model_name, overrides=overrides)
    if isinstance(src, (str, os.PathLike)):
        source = str(src)
        sd = load_state_dict_file(src)
    elif isinstance(src, Mapping):
        source, sd = "timm state dict", dict(src)
    else:
        raise CheckpointError(f"timm weights: expected a state dict or a file path, got {type(src).__name__}")
    assumed: dict = {}
    if model is not None:
        cfg = model.cfg
    elif cfg is None:
        seen, guessed, pos_len = infer(sd, source)
        cfg, assumed = arch_config(seen, guessed, source, pos_len=pos_len, model_name=model_name,
                                      overrides=overrides)
    expected = expected_state(cfg)
    table = {k: ((k,), same) for k in expected}  # identity: vitkit's names are timm's
    state = assemble(expected, table, sd, source)
    info = {"source": source, "assumed": assumed}
    if model is None:  # a state dict does not say how images are prepared: the file beside it, else timm's
        model = build(cfg, state, source)
        return model, {**info, **_preprocess_beside(model, src)}
    return build(cfg, state, source, model), info


def _preprocess_beside(model, src) -> dict:
    """Set ``model``'s preprocessing (and labels) from the JSON file beside the weights file ``src`` that
    `vitkit convert --to timm` writes, else to timm's defaults; the info that says which and what is assumed."""
    beside = timm_config_file(src) if isinstance(src, (str, os.PathLike)) else None
    hub = _json_beside(beside)
    pcfg = hub.get("pretrained_cfg") if isinstance(hub.get("pretrained_cfg"), dict) else None
    model.preprocess, assumed = from_pretrained_cfg(pcfg or {}, model.cfg.in_chans, str(beside or src))
    labels = hub.get("label_names")
    if isinstance(labels, list) and len(labels) == model.cfg.num_classes and all(isinstance(x, str) for x in labels):
        model.labels = labels
    where = f"{beside} (pretrained_cfg)" if pcfg is not None else "timm's defaults"
    return {"preprocess_assumed": assumed, "preprocess_from": where}


def _json_beside(file: Path | None) -> dict:
    """The JSON object in ``file``; {} where there is none (or another file of that name: not ours to judge)."""
    if file is None or not file.is_file():
        return {}
    try:
        return read_json_object(file, CheckpointError)
    except CheckpointError:
        return {}


def timm_config_file(weights) -> Path:
    """The JSON file beside a timm weights file (vit.safetensors: vit.json) that holds its pretrained_cfg."""
    return Path(weights).with_suffix(".json")


def pretrained_cfg(model) -> dict:
    """``model``'s preprocessing as timm's pretrained_cfg states it (``data.resolve_data_config`` reads it)."""
    pre, cfg = model.preprocess, model.cfg
    return {"input_size": [cfg.in_chans, *cfg.img_size], "mean": list(pre.mean), "std": list(pre.std),
            "crop_pct": pre.crop_pct, "crop_mode": "squash" if pre.resize == "squash" else "center",
            "interpolation": pre.interpolation, "num_classes": cfg.num_classes}


def check_timm_config(weights) -> Path:
    """The JSON file beside ``weights``; a CheckpointError naming it where a file there is not such a one."""
    file = timm_config_file(weights)
    if file.exists():
        try:
            ours = "pretrained_cfg" in read_json_object(file, CheckpointError)
        except CheckpointError:
            ours = False
        if not ours:
            raise CheckpointError(f"{file}: exists and is not a timm config (no pretrained_cfg); the weights' "
                                  "preprocessing is written there: move it, or name the weights otherwise")
    return file


def write_timm_config(model, weights) -> Path:
    """Write the JSON file beside ``weights`` (``timm_config_file``) in the style of a timm Hub repository's
    config.json: the pretrained_cfg, the classes and their names. A file of that name that is not one is
    refused, before anything is written."""
    file = check_timm_config(weights)
    data = {"num_classes": model.cfg.num_classes, "global_pool": model.cfg.global_pool,
            "label_names": list(model.labels) if model.labels else None, "pretrained_cfg": pretrained_cfg(model)}
    atomic_write_text(file, json.dumps(data, indent=2) + "\n")
    return file


def read_timm_folder(path, *, model_name=None, overrides=None):
    """(VisionTransformer, info) from a timm Hub repository's folder: config.json (``architecture``,
    ``pretrained_cfg``, ``label_names``) beside model.safetensors (or pytorch_model.bin).

    ``architecture`` names the model where vitkit has that name (``--model`` wins), else the architecture
    is read from the weights as for a bare file; the preprocessing is the ``pretrained_cfg``'s."""
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: missing (a timm Hub folder holds config.json beside its weights)")
    hub_cfg = read_json_object(cfg_file, CheckpointError)
    weights = next((folder / n for n in ("model.safetensors", "pytorch_model.bin") if (folder / n).is_file()), None)
    if weights is None:
        raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin beside config.json")
    arch = hub_cfg.get("architecture")
    name = model_name or (arch if isinstance(arch, str) and arch in REGISTRY else None)
    model, info = read_timm(weights, model_name=name, overrides=overrides)
    pcfg = hub_cfg.get("pretrained_cfg")
    pcfg = pcfg if isinstance(pcfg, dict) else hub_cfg  # timm's older configs: one flat dict
    model.preprocess, pre_assumed = from_pretrained_cfg(pcfg, model.cfg.in_chans, str(cfg_file))
    labels = hub_cfg.get("label_names")
    if isinstance(labels, list) and len(labels) == model.cfg.num_classes and all(isinstance(x, str) for x in labels):
        model.labels = labels
    return model, {**info, "preprocess_assumed": pre_assumed, "architecture": arch,
                   "preprocess_from": f"{cfg_file} (pretrained_cfg)", "test": timm_test_crop(pcfg, str(cfg_file))}


def to_timm(model) -> dict[str, torch.Tensor]:
    """The weights as a state dict for timm's VisionTransformer built with ``timm_model_kwargs(cfg)``.

    Position embeddings are always written as one learned table with a slot for every prefix token
    (timm's default layout: no_embed_class=False); fixed sin-cos tables and patch-only tables become
    the learned table they equal (zeros in the slots of the class and register tokens).
    """
    cfg = model.cfg
    refuse(model, "timm's VisionTransformer", {
        "post-LN blocks (norm='post')": cfg.norm == "post",
        f"activation {cfg.act!r} (a timm state dict loads into exact-GELU models)": cfg.act != "gelu",
        "a pre-logits layer (representation_size)": cfg.representation_size is not None,
    })
    sd = {_timm_key(k): v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    sd = {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}  # BatchNorm's step count stays int
    sd["pos_embed"] = learned_pos_table(model).contiguous()
    # keep timm's key order: cls_token, reg_token, pos_embed first
    order = ["cls_token", "reg_token", "pos_embed"]
    return {**{k: sd[k] for k in order if k in sd}, **{k: v for k, v in sd.items() if k not in order}}


CONV_STEM = "patch_embed.stem."


def _timm_key(key: str) -> str:
    """vitkit's key as timm names it: the same, but a conv stem's layers are HybridEmbed's backbone."""
    return "patch_embed.backbone." + key[len(CONV_STEM):] if key.startswith(CONV_STEM) else key


def timm_conv_stem_args(cfg: ViTConfig) -> dict | None:
    """For a conv-stem model (stem='conv'): the arguments of docs/convert.md's ``conv_stem`` function,
    which builds the stem from torch modules as the backbone of timm's HybridEmbed: the input channels,
    the channels of each stride-2 conv, the extra stride-1 convs, whether the first conv is the whitening
    layer (2x2, stride 2), and the channels of the stride-1 convs after the first stride-2 conv (early).
    None for a patch-stem model."""
    if cfg.stem != "conv":
        return None
    n = cfg.patch_size.bit_length() - 1  # log2(P) stride-2 convs
    widths = [cfg.stem_width * 2**i for i in range(n)]
    if cfg.stem_whiten:
        widths[0] = 2 * cfg.in_chans * 4  # the whitening filters and their negatives
    return dict(in_chans=cfg.in_chans, widths=widths, extra=cfg.stem_convs, whiten=cfg.stem_whiten,
                early=[cfg.stem_width] * cfg.stem_early_convs)


def timm_model_kwargs(cfg: ViTConfig) -> dict:
    """Keyword arguments of ``timm.models.vision_transformer.VisionTransformer`` for the same network.

    The model built with them loads ``to_timm(model)`` strictly and computes the same logits. A conv-stem
    model also needs ``embed_layer=partial(HybridEmbed, backbone=conv_stem(**timm_conv_stem_args(cfg)))``
    (docs/convert.md); its patch size is then 1, a patch of the stem's output grid.
    """
    from torch import nn

    return dict(
        img_size=tuple(cfg.img_size),
        patch_size=1 if cfg.stem == "conv" else cfg.patch_size,
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        global_pool={"token": "token", "avg": "avg", "map": "map", "none": ""}[cfg.global_pool],
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        init_values=cfg.layer_scale,
        class_token=cfg.class_token,
        reg_tokens=cfg.reg_tokens,
        no_embed_class=False,
        fc_norm=cfg.use_fc_norm,
        dynamic_img_size=cfg.dynamic_img_size,
        norm_layer=functools.partial(nn.LayerNorm, eps=cfg.norm_eps),
    )


# timm's VisionTransformer defaults, to name only the arguments that differ from them
TIMM_DEFAULTS = dict(img_size=(224, 224), patch_size=16, in_chans=3, num_classes=1000, global_pool="token",
                     embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0, qkv_bias=True, qk_norm=False,
                     init_values=None, class_token=True, reg_tokens=0, no_embed_class=False, dynamic_img_size=False)


def timm_source(cfg: ViTConfig) -> str:
    """The Python call that builds the same network with timm's ``VisionTransformer`` (imported from
    ``timm.models.vision_transformer``), naming only what differs from its defaults; a conv-stem model's
    call uses docs/convert.md's ``conv_stem`` and timm's ``HybridEmbed``, with ``functools.partial``."""
    kw = timm_model_kwargs(cfg)
    fc_norm = kw.pop("fc_norm")
    parts = []
    for name, default in TIMM_DEFAULTS.items():
        value = kw[name]
        if value != default:
            if name == "img_size" and value[0] == value[1]:
                value = value[0]
            parts.append(f"{name}={value!r}")
    if fc_norm != (kw["global_pool"] == "avg"):  # timm pairs fc_norm with average pooling unless told
        parts.append(f"fc_norm={fc_norm}")
    if cfg.norm_eps != 1e-6:
        parts.append(f"norm_layer=partial(nn.LayerNorm, eps={cfg.norm_eps!r})")
    stem = timm_conv_stem_args(cfg)
    if stem is not None:
        extra = "".join(f", {k}={stem[k]!r}" for k in ("extra", "whiten", "early") if stem[k])
        backbone = f"conv_stem({stem['in_chans']}, {stem['widths']}{extra})"
        parts.append(f"embed_layer=partial(HybridEmbed, backbone={backbone})")
    return f"VisionTransformer({', '.join(parts)})"


def save_timm(model, path: str | os.PathLike) -> Path:
    """Write ``to_timm(model)`` to a .safetensors or .pth / .pt / .bin file, atomically."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TIMM_SUFFIXES:
        raise CheckpointError(f"{path}: a timm state dict is written as .safetensors or .pth (got {suffix or 'no suffix'!r})")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory; give a file name ending in .safetensors or .pth")
    sd = to_timm(model)
    with atomic_path(path) as tmp:
        if suffix == ".safetensors":
            from safetensors.torch import save_file

            save_file(sd, str(tmp), metadata={"format": "pt"})
        else:
            torch.save(sd, tmp)
    return path
