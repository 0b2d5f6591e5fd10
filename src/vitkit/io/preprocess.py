"""The preprocessing of foreign weights (``Preprocess``): read from where their publisher wrote it, else
assumed and reported, and ``--set preprocess.KEY=VALUE`` over either.

- a timm Hub repository: its config.json's ``pretrained_cfg`` (mean, std, crop_pct, crop_mode,
  interpolation), with timm's own defaults for what it leaves out (``from_pretrained_cfg``);
- a Hugging Face model: its preprocessor_config.json (``from_image_processor``): ViTImageProcessor
  squashes the image to its size, DeiT's and DINOv2's processors resize and centre crop;
- a bare timm file: the JSON file beside it that `vitkit convert --to timm` writes (a pretrained_cfg), else
  timm's own defaults for what a pretrained_cfg leaves out (``TIMM_DEFAULTS``: ImageNet's mean and std,
  crop_pct 0.875), the same as for a Hub repository that leaves them out, assumed and reported;
- a JAX .npz: nothing, so vitkit's defaults are assumed and reported (``assumed_preprocess``), as are the
  architecture's fields the weights do not show.

Every assumed value is listed under the key that changes it (``preprocess.crop_pct``), so that
`vitkit convert` and `vitkit finetune` print it with the other assumptions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ..core.errors import CheckpointError, ConfigError
from ..core.strict import parse_override
from ..model.config import Preprocess

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # timm's IMAGENET_DEFAULT_*
# what timm's resolve_data_config takes where a pretrained_cfg leaves a field out
TIMM_DEFAULTS = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD, "crop_pct": 0.875, "interpolation": "bicubic",
                 "crop_mode": "center"}
CROP_MODES = {"center": "shorter_then_crop", "squash": "squash"}  # timm's crop_mode -> Preprocess.resize
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
PIL_FILTERS = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # HF's resample (PIL's constants)
# HF image processors that read a size given as one number as the short side (the others, ViT's and DeiT's
# among them, as a square: transformers' get_size_dict with default_to_square)
SHORT_SIDE_PROCESSORS = ("BitImageProcessor", "CLIPImageProcessor", "CLIPFeatureExtractor", "ConvNextImageProcessor",
                         "ConvNextFeatureExtractor")
PREFIX = "preprocess."


def _key(field: str) -> str:
    return PREFIX + field


def assumed_preprocess(pre: Preprocess) -> dict[str, Any]:
    """Every field of ``pre`` as an assumption, under the key that changes it (``preprocess.mean``, ...)."""
    return {_key(k): v for k, v in pre.to_dict().items()}


def from_pretrained_cfg(pcfg: Mapping[str, Any], in_chans: int, source: str) -> tuple[Preprocess, dict]:
    """(Preprocess, assumed) from a timm ``pretrained_cfg``: its mean, std, crop_pct, interpolation and
    crop_mode; a field it leaves out takes timm's default, and a crop_mode or interpolation vitkit does not
    have the nearest one it has, each reported as assumed.

    timm evaluates at ``test_input_size`` with ``test_crop_pct`` where they are given: see ``test_crop``."""
    assumed: dict[str, Any] = {}
    values = {}
    for name, default in TIMM_DEFAULTS.items():
        values[name] = pcfg.get(name)
        if values[name] is None:
            values[name] = default
            shown = list(default) if isinstance(default, tuple) else CROP_MODES.get(default, default)
            assumed[_key("resize" if name == "crop_mode" else name)] = shown
    interpolation, mode = values["interpolation"], values["crop_mode"]
    if interpolation not in INTERPOLATIONS:
        assumed[_key("interpolation")] = f"bicubic (for timm's {interpolation!r})"
        interpolation = "bicubic"
    if mode not in CROP_MODES:
        assumed[_key("resize")] = f"shorter_then_crop (for timm's crop_mode {mode!r})"
    try:
        pre = Preprocess(mean=tuple(values["mean"]), std=tuple(values["std"]), crop_pct=float(values["crop_pct"]),
                         interpolation=interpolation, resize=CROP_MODES.get(mode, "shorter_then_crop"))
        return pre.for_channels(in_chans), assumed
    except (ConfigError, TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: pretrained_cfg: {e}") from None


def timm_test_crop(pcfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """{"img_size": (H, W), "crop_pct": c} of a pretrained_cfg's test_input_size / test_crop_pct, or None."""
    size = pcfg.get("test_input_size")
    if not (isinstance(size, (list, tuple)) and len(size) == 3):
        return None
    return {"img_size": (int(size[1]), int(size[2])), "crop_pct": float(pcfg.get("test_crop_pct") or
                                                                     pcfg.get("crop_pct") or TIMM_DEFAULTS["crop_pct"])}


def _size(value, square: bool = True) -> tuple[str, tuple[int, int] | int] | None:
    """('hw', (H, W)) or ('short', S) of an image processor's size / crop_size, or None; one number is a
    square, or (``square`` False) the short side."""
    if isinstance(value, int) and not isinstance(value, bool):
        return ("hw", (value, value)) if square else ("short", value)
    if isinstance(value, Mapping):
        if "height" in value and "width" in value:
            return "hw", (int(value["height"]), int(value["width"]))
        if "shortest_edge" in value:
            return "short", int(value["shortest_edge"])
    return None


def from_image_processor(p: Mapping[str, Any], img_size: tuple[int, int], in_chans: int,
                         source: str) -> tuple[Preprocess, dict]:
    """(Preprocess, assumed) from an HF preprocessor_config.json for a model of ``img_size``.

    ``size`` {height, width} is a squash to that size (ViTImageProcessor; DeiT's squashes to 256 and crops
    224), {shortest_edge} a resize of the short side (DINOv2's BitImageProcessor, CLIP's); one number is
    either, as the processor reads it. A centre crop (``do_center_crop``, ``crop_size``) after it makes
    crop_pct = crop / size. Normalisation off (``do_normalize`` false) is mean 0, std 1."""
    assumed: dict[str, Any] = {}
    interpolation = PIL_FILTERS.get(p.get("resample", 2))
    if interpolation is None:
        assumed[_key("interpolation")] = f"bicubic (for PIL filter {p.get('resample')!r})"
        interpolation = "bicubic"
    kind = p.get("image_processor_type") or p.get("feature_extractor_type") or ""
    size = _size(p.get("size"), kind not in SHORT_SIDE_PROCESSORS) if p.get("do_resize", True) else None
    crop = _size(p.get("crop_size")) if p.get("do_center_crop", False) else None
    out = crop[1] if crop is not None and crop[0] == "hw" else img_size
    if size is None:
        resize, crop_pct = "squash", 1.0
        assumed[_key("resize")] = "squash (no size to resize to)"
    elif size[0] == "hw":
        resize, crop_pct = "squash", min(1.0, min(o / s for o, s in zip(out, size[1])))
    else:
        resize, crop_pct = "shorter_then_crop", min(1.0, min(out) / size[1])
    mean, std = p.get("image_mean", (0.5, 0.5, 0.5)), p.get("image_std", (0.5, 0.5, 0.5))
    if not p.get("do_normalize", True):
        mean, std = (0.0,) * in_chans, (1.0,) * in_chans
    if p.get("do_rescale", True) is False or abs(float(p.get("rescale_factor", 1 / 255)) - 1 / 255) > 1e-9:
        raise CheckpointError(f"{source}: rescales pixels by {p.get('rescale_factor')} (do_rescale "
                              f"{p.get('do_rescale', True)}); vitkit scales them to [0, 1]")
    try:
        mean = mean if isinstance(mean, (list, tuple)) else (mean,)
        std = std if isinstance(std, (list, tuple)) else (std,)
        pre = Preprocess(mean=tuple(map(float, mean)), std=tuple(map(float, std)), crop_pct=crop_pct,
                         interpolation=interpolation, resize=resize)
        return pre.for_channels(in_chans), assumed
    except (ConfigError, TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from None


# --------------------------------------------------------------------------------------- overrides
def split_overrides(items: Sequence[str] | Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """(the architecture's overrides, the preprocessing's) of ``--set`` items or a dict: ``preprocess.KEY``
    items (or a "preprocess" table) are the preprocessing's, the rest are left as given."""
    if not items:
        return items, {}
    pre: dict[str, Any] = {}
    if isinstance(items, Mapping):
        rest = {}
        for k, v in items.items():
            if k == "preprocess" and isinstance(v, Mapping):
                pre.update(v)
            elif isinstance(k, str) and k.startswith(PREFIX):
                pre[k[len(PREFIX):]] = v
            else:
                rest[k] = v
        return rest, pre
    rest_items = []
    for text in items:
        keys, value = parse_override(text)
        if keys[0] == "preprocess":
            if len(keys) != 2:
                raise ConfigError(f"--set {text!r}: expected preprocess.FIELD=VALUE, e.g. preprocess.crop_pct=0.9")
            pre[keys[1]] = value
        else:
            rest_items.append(text)
    return rest_items, pre


def apply_preprocess(pre: Preprocess, changes: Mapping[str, Any], where: str = "--set preprocess") -> Preprocess:
    """``pre`` with ``changes`` (Preprocess fields) laid over it, checked; an unknown field or a bad value is
    a ConfigError naming it."""
    if not changes:
        return pre
    data = {**pre.to_dict(), **changes}
    try:
        return Preprocess.from_dict(data, where=where)
    except ConfigError as e:
        if "unknown field" in str(e):
            fields = ", ".join(f.name for f in dataclasses.fields(Preprocess))
            bad = sorted(set(changes) - {f.name for f in dataclasses.fields(Preprocess)})[0]
            raise ConfigError(f"{where}.{bad}: not a Preprocess field; fields: {fields}") from None
        raise


__all__ = ["TIMM_DEFAULTS", "assumed_preprocess", "from_pretrained_cfg", "timm_test_crop", "from_image_processor",
           "split_overrides", "apply_preprocess"]
