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
import reprlib
from typing import Any, Mapping, Sequence

from ..core.errors import CheckpointError, ConfigError
from ..core.strict import is_finite_real, parse_override, real_in, reals_in, whole_in
from ..model.config import CROP_PCT_RANGE, INTERPOLATIONS, MEAN_RANGE, STD_RANGE, Preprocess

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # timm's IMAGENET_DEFAULT_*
# what timm's resolve_data_config takes where a pretrained_cfg leaves a field out
TIMM_DEFAULTS = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD, "crop_pct": 0.875, "interpolation": "bicubic",
                 "crop_mode": "center"}
CROP_MODES = {"center": "shorter_then_crop", "squash": "squash"}  # timm's crop_mode -> Preprocess.resize
PIL_FILTERS = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # HF's resample (PIL's constants)
# HF image processors that read a size given as one number as the short side (the others, ViT's and DeiT's
# among them, as a square: transformers' get_size_dict with default_to_square)
SHORT_SIDE_PROCESSORS = ("BitImageProcessor", "CLIPImageProcessor", "CLIPFeatureExtractor", "ConvNextImageProcessor",
                         "ConvNextFeatureExtractor")
PREFIX = "preprocess."
MAX_SIDE = 16384  # the largest image side a source may name (size, crop_size, shortest_edge, test_input_size)


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
    where = f"{source}: pretrained_cfg."
    interpolation, mode = _text(values["interpolation"], where + "interpolation"), _text(values["crop_mode"],
                                                                                           where + "crop_mode")
    if interpolation not in INTERPOLATIONS:
        assumed[_key("interpolation")] = f"bicubic (for timm's {interpolation!r})"
        interpolation = "bicubic"
    if mode not in CROP_MODES:
        assumed[_key("resize")] = f"shorter_then_crop (for timm's crop_mode {mode!r})"
    mean, std = _constants(values["mean"], values["std"], where + "mean", where + "std", in_chans)
    crop_pct = real_in(values["crop_pct"], where + "crop_pct", *CROP_PCT_RANGE, error=CheckpointError)
    pre = Preprocess(mean=mean, std=std, crop_pct=crop_pct, interpolation=interpolation,
                     resize=CROP_MODES.get(mode, "shorter_then_crop"))
    return pre.for_channels(in_chans), assumed


def _text(value, where: str) -> str:
    """``value`` where it is a string; else a CheckpointError naming ``where``."""
    if not isinstance(value, str):
        raise CheckpointError(f"{where}: expected a string, got {reprlib.repr(value)}")
    return value


def _constants(mean, std, mean_at: str, std_at: str, in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of a source, each a number or a list of numbers in MEAN_RANGE / STD_RANGE, as many of
    each, one or ``in_chans`` of them (any number for a grey model: their mean is taken); else a
    CheckpointError naming the field."""
    mean = reals_in(mean, mean_at, *MEAN_RANGE, error=CheckpointError)
    std = reals_in(std, std_at, *STD_RANGE, error=CheckpointError)
    if len(mean) != len(std):
        raise CheckpointError(f"{mean_at}: {len(mean)} value{'s' * (len(mean) != 1)}, but "
                              f"{std_at.rpartition(': ')[2]} has {len(std)}")
    if in_chans != 1 and len(mean) not in (1, in_chans):
        raise CheckpointError(f"{mean_at}: {len(mean)} values for a model of {in_chans} channels (expected 1 or "
                              f"{in_chans})")
    return mean, std


def timm_test_crop(pcfg: Mapping[str, Any], source: str = "pretrained_cfg") -> dict[str, Any] | None:
    """{"img_size": (H, W), "crop_pct": c} of a pretrained_cfg's test_input_size (C, H, W) and test_crop_pct
    (else its crop_pct), or None without a test_input_size; a size of another form, a side out of [1,
    MAX_SIDE] or a crop_pct out of CROP_PCT_RANGE is a CheckpointError naming the field."""
    size = pcfg.get("test_input_size")
    if size is None:
        return None
    where = f"{source}: pretrained_cfg.test_input_size"
    if not (isinstance(size, (list, tuple)) and len(size) == 3):
        raise CheckpointError(f"{where}: expected [channels, height, width], got {reprlib.repr(size)}")
    hw = tuple(whole_in(v, f"{where}[{i}]", 1, MAX_SIDE, CheckpointError) for i, v in enumerate(size))[1:]
    name = next((n for n in ("test_crop_pct", "crop_pct") if pcfg.get(n) is not None), None)
    crop_pct = TIMM_DEFAULTS["crop_pct"] if name is None else real_in(
        pcfg[name], f"{source}: pretrained_cfg.{name}", *CROP_PCT_RANGE, error=CheckpointError)
    return {"img_size": hw, "crop_pct": crop_pct}


def _size(value, where: str, square: bool = True) -> tuple[str, tuple[int, int] | int] | None:
    """('hw', (H, W)) or ('short', S) of an image processor's size / crop_size, or None where there is none or
    it has a form vitkit does not read ({longest_edge}); one number is a square, or (``square`` False) the
    short side. A side that is no whole number in [1, MAX_SIDE] is a CheckpointError naming it."""
    def side(v, key: str = "") -> int:
        return whole_in(v, where + key, 1, MAX_SIDE, CheckpointError)

    if value is None:
        return None
    if isinstance(value, Mapping):
        if "height" in value and "width" in value:
            return "hw", (side(value["height"], ".height"), side(value["width"], ".width"))
        if "shortest_edge" in value:
            return "short", side(value["shortest_edge"], ".shortest_edge")
        return None
    return ("hw", (side(value),) * 2) if square else ("short", side(value))


def _flag(p: Mapping[str, Any], name: str, default: bool, source: str) -> bool:
    """An image processor's ``do_*`` switch (absent or null: ``default``); anything but true or false is a
    CheckpointError naming it."""
    value = p.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(f"{source}: {name}: expected true or false, got {reprlib.repr(value)}")
    return value


def _resample(p: Mapping[str, Any], source: str, assumed: dict) -> str:
    """The interpolation of an image processor's ``resample`` (a PIL filter number); one vitkit does not have
    is bicubic, reported as assumed; a value that is no whole number is a CheckpointError naming it."""
    value = p.get("resample", 2)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{source}: resample: expected a PIL filter number (0 nearest, 2 bilinear, 3 "
                              f"bicubic), got {reprlib.repr(value)}")
    if value not in PIL_FILTERS:
        assumed[_key("interpolation")] = f"bicubic (for PIL filter {value!r})"
    return PIL_FILTERS.get(value, "bicubic")


def _resize(size, out: tuple[int, int], source: str, assumed: dict) -> tuple[str, float]:
    """(Preprocess.resize, crop_pct) of a processor's resize to ``size`` and crop to ``out``; a crop_pct below
    CROP_PCT_RANGE (a resize of more than 10x the crop) is a CheckpointError naming size."""
    if size is None:
        assumed[_key("resize")] = "squash (no size to resize to)"
        return "squash", 1.0
    if size[0] == "hw":
        resize, crop_pct = "squash", min(1.0, min(o / s for o, s in zip(out, size[1])))
    else:
        resize, crop_pct = "shorter_then_crop", min(1.0, min(out) / size[1])
    lo, hi = CROP_PCT_RANGE
    if crop_pct < lo:
        raise CheckpointError(f"{source}: size {size[1]} for a crop of {out[0]}x{out[1]} makes crop_pct "
                              f"{crop_pct:.3g}, outside [{lo:g}, {hi:g}] (a resize of at most {1 / lo:g}x the crop)")
    return resize, crop_pct


def _check_rescale(p: Mapping[str, Any], source: str) -> None:
    """vitkit scales pixels to [0, 1]: a processor that rescales otherwise (do_rescale false, a
    rescale_factor other than 1/255, or one that is no number) is a CheckpointError naming the field."""
    factor, on = p.get("rescale_factor", 1 / 255), _flag(p, "do_rescale", True, source)
    if on and is_finite_real(factor) and abs(factor - 1 / 255) <= 1e-9:
        return
    field = "do_rescale" if not on else "rescale_factor"
    raise CheckpointError(f"{source}: {field}: rescales pixels by {reprlib.repr(factor)} (do_rescale {on}); vitkit "
                          "scales them to [0, 1], so it takes do_rescale true with rescale_factor 1/255 only")


def from_image_processor(p: Mapping[str, Any], img_size: tuple[int, int], in_chans: int,
                         source: str) -> tuple[Preprocess, dict]:
    """(Preprocess, assumed) from an HF preprocessor_config.json for a model of ``img_size``.

    ``size`` {height, width} is a squash to that size (ViTImageProcessor; DeiT's squashes to 256 and crops
    224), {shortest_edge} a resize of the short side (DINOv2's BitImageProcessor, CLIP's); one number is
    either, as the processor reads it. A centre crop (``do_center_crop``, ``crop_size``) after it makes
    crop_pct = crop / size. Normalisation off (``do_normalize`` false) is mean 0, std 1. Every field is
    checked for its type and range; a bad one is a CheckpointError naming the file and the field."""
    assumed: dict[str, Any] = {}
    interpolation = _resample(p, source, assumed)
    kind = p.get("image_processor_type") or p.get("feature_extractor_type") or ""
    square = kind not in SHORT_SIDE_PROCESSORS
    size = _size(p.get("size"), f"{source}: size", square) if _flag(p, "do_resize", True, source) else None
    crop = _size(p.get("crop_size"), f"{source}: crop_size") if _flag(p, "do_center_crop", False, source) else None
    out = crop[1] if crop is not None and crop[0] == "hw" else img_size
    resize, crop_pct = _resize(size, out, source, assumed)
    _check_rescale(p, source)
    mean, std = p.get("image_mean", (0.5, 0.5, 0.5)), p.get("image_std", (0.5, 0.5, 0.5))
    if not _flag(p, "do_normalize", True, source):
        mean, std = (0.0,) * in_chans, (1.0,) * in_chans
    mean, std = _constants(mean, std, f"{source}: image_mean", f"{source}: image_std", in_chans)
    pre = Preprocess(mean=mean, std=std, crop_pct=crop_pct, interpolation=interpolation, resize=resize)
    return pre.for_channels(in_chans), assumed


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
