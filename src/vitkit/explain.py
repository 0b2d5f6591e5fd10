"""Where does the model look? Attention rollout and class-token attention, overlaid on the image.

    from vitkit.explain import explain
    res = explain("ckpt/", "cat.jpg", out="cat_attn.png")   # method='both'
    res["rollout"], res["cls"]       # float32 numpy maps of shape (H/P, W/P)

- rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"): fuse the heads of each
  block (mean, max or min), optionally zero the weakest ``discard_ratio`` of the weights, add the
  identity for the residual connection, renormalise the rows, and multiply the blocks' matrices from
  the first to the last. The map is the row of the class token over the patch tokens.
- cls: the last block's attention from the class token to the patches, heads fused the same way.

Models without a class token (average pooling) have no such row: both maps then use the mean over
all query tokens (which patches the tokens attend to on average); ``res["note"]`` says so.

The attention probabilities come from ``model.forward_with_attention``, which takes the manual
attention path for this call only: the model keeps its fused attention for everything else.
Non-square images run at their own aspect ratio when the model has ``dynamic_img_size=True`` (or at an
``img_size`` given here; a fixed-size model is then resampled with ``resample_to`` on a copy).
"""

from __future__ import annotations

import copy
import io
import os

import numpy as np
import torch
import torch.nn.functional as F

from .data.images import DEFAULT_MAX_PIXELS
from .errors import ConfigError, ShapeError
from .runtime import label_names, load_model
from .strict import to_hw

METHODS = ("rollout", "cls", "both")
FUSIONS = ("mean", "max", "min")


# ------------------------------------------------------------------------------------------- maps
def fuse_heads(attn: torch.Tensor, how: str = "mean") -> torch.Tensor:
    """(B, heads, T, T) -> (B, T, T) by the mean, max or min over heads."""
    if how == "mean":
        return attn.mean(1)
    if how == "max":
        return attn.amax(1)
    if how == "min":
        return attn.amin(1)
    raise ConfigError(f"--head-fusion: {how!r} is not one of {', '.join(FUSIONS)}")


def _discard(a: torch.Tensor, ratio: float) -> torch.Tensor:
    """Zero the weakest ``ratio`` of each (T, T) matrix's weights; the diagonal is always kept."""
    if ratio <= 0:
        return a
    B, T, _ = a.shape
    flat = a.reshape(B, T * T).clone()
    n = int(T * T * ratio)
    if n == 0:
        return a
    diag = torch.arange(T, device=a.device) * (T + 1)
    keyed = flat.clone()
    keyed[:, diag] = float("inf")  # never among the weakest
    idx = keyed.topk(n, dim=-1, largest=False).indices
    flat.scatter_(1, idx, 0.0)
    return flat.reshape(B, T, T)


def attention_rollout(maps: list[torch.Tensor], head_fusion: str = "mean", discard_ratio: float = 0.0) -> torch.Tensor:
    """Rollout of a list of per-block attention (B, heads, T, T): the (B, T, T) product
    (A_L + I)/n ... (A_1 + I)/n, each row renormalised to sum to 1."""
    if not maps:
        raise ShapeError("attention_rollout: no attention maps (a model with depth 0?)")
    B, _, T, _ = maps[0].shape
    eye = torch.eye(T, dtype=torch.float64, device=maps[0].device)
    rollout = eye.expand(B, T, T).clone()
    for attn in maps:
        a = _discard(fuse_heads(attn.double(), head_fusion), discard_ratio)
        a = a + eye  # the residual connection carries the token itself
        a = a / a.sum(-1, keepdim=True)
        rollout = a @ rollout  # later blocks mix the mixtures of earlier ones
    return rollout.float()


def _patch_row(mat: torch.Tensor, prefix: int) -> torch.Tensor:
    """(B, T, T) -> (B, N): the class token's row over the patches, or the mean of all rows without one."""
    if prefix:
        return mat[:, 0, prefix:]
    return mat.mean(1)


def _to_grid(v: torch.Tensor, grid: tuple[int, int]) -> np.ndarray:
    return v.reshape(grid).float().cpu().numpy()


# ---------------------------------------------------------------------------------------- colours
# 'inferno'-like ramp used when matplotlib is absent: (position, r, g, b)
_RAMP = np.array([
    (0.00, 0, 0, 4), (0.15, 31, 12, 72), (0.30, 85, 15, 109), (0.45, 136, 34, 106), (0.60, 186, 54, 85),
    (0.75, 227, 89, 51), (0.87, 249, 140, 10), (1.00, 252, 255, 164),
], dtype=np.float64)


def colormap(values: np.ndarray) -> np.ndarray:
    """[0, 1] floats (H, W) -> uint8 RGB (H, W, 3): matplotlib's 'inferno' if installed, else a ramp close to it."""
    v = np.clip(values, 0.0, 1.0)
    try:
        import matplotlib

        cmap = matplotlib.colormaps["inferno"]
        return (cmap(v)[..., :3] * 255 + 0.5).astype(np.uint8)
    except (ImportError, KeyError, AttributeError):
        pass
    out = np.stack([np.interp(v, _RAMP[:, 0], _RAMP[:, c]) for c in (1, 2, 3)], axis=-1)
    return (out + 0.5).astype(np.uint8)


def _normalise(m: np.ndarray) -> np.ndarray:
    lo, hi = float(m.min()), float(m.max())
    return (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)


def overlay(image: np.ndarray, amap: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """Blend a heatmap of ``amap`` (gh, gw) over ``image`` uint8 (H, W, 3); the map is upsampled bilinearly."""
    H, W = image.shape[:2]
    up = F.interpolate(torch.from_numpy(_normalise(amap))[None, None].float(), size=(H, W), mode="bilinear",
                       align_corners=False)[0, 0].numpy()
    heat = colormap(up).astype(np.float32)
    return (image.astype(np.float32) * (1 - alpha) + heat * alpha + 0.5).clip(0, 255).astype(np.uint8)


# ------------------------------------------------------------------------------------------ sizes
def _run_size(model, img_hw: tuple[int, int], img_size) -> tuple[tuple[int, int], object]:
    """The (H, W) to run at and the model to run: the model's own size, the image's aspect ratio for a
    dynamic model, or ``img_size`` (a fixed-size model is resampled on a copy)."""
    cfg = model.cfg
    P = cfg.patch_size
    if img_size is not None:
        size = to_hw(img_size, "--img-size")
        if size[0] % P or size[1] % P or min(size) < P:
            raise ConfigError(f"--img-size: {size[0]}x{size[1]} is not a multiple of the patch size {P}")
        if size != tuple(cfg.img_size) and not cfg.dynamic_img_size:
            model = copy.deepcopy(model)
            model.resample_to(size)
        return size, model
    if not cfg.dynamic_img_size:
        return tuple(cfg.img_size), model
    # keep the image's aspect ratio, with the short side of the model's own size, in whole patches
    h, w = img_hw
    short = min(cfg.img_size)
    if h <= w:
        size = (short, max(P, round(short * min(w / h, 4.0) / P) * P))
    else:
        size = (max(P, round(short * min(h / w, 4.0) / P) * P), short)
    return size, model


# -------------------------------------------------------------------------------------------- API
def explain(
    model_or_path,
    image,
    out: str | os.PathLike | None = None,
    method: str = "both",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    img_size: int | tuple[int, int] | None = None,
    alpha: float = 0.5,
    display_size: int = 256,
    device: str | torch.device = "cpu",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> dict:
    """Attention maps of one image (a file path or a uint8 (C, H, W) tensor), optionally written as a PNG.

    Returns {"rollout": (gh, gw) float32 array or None, "cls": ... or None, "grid": (gh, gw),
    "input_size": (H, W), "pred": {"index", "label", "prob"}, "class_token": bool, "note": str, "out"}.
    """
    from .data import to_model_input

    _check_options(method, head_fusion, discard_ratio)
    model = load_model(model_or_path, device)
    cfg = model.cfg
    img, source = _read_image(image, cfg.in_chans, max_pixels)
    size, run_model = _run_size(model, tuple(img.shape[-2:]), img_size)
    x = to_model_input(img, size, model.preprocess)[None].to(next(model.parameters()).device)
    with torch.no_grad():
        logits, maps = run_model.forward_with_attention(x)  # manual attention for this call only
    grid = (size[0] // cfg.patch_size, size[1] // cfg.patch_size)
    note = ("" if cfg.class_token else
            "the model has no class token (average pooling): the maps are the mean over all query tokens")
    res: dict = dict(source=source, method=method, head_fusion=head_fusion, discard_ratio=discard_ratio,
                     input_size=list(size), grid=list(grid), class_token=bool(cfg.class_token), note=note,
                     rollout=None, cls=None, pred=_prediction(model, logits), out=None)
    prefix = run_model.num_prefix_tokens
    if method in ("rollout", "both"):
        res["rollout"] = _to_grid(_patch_row(attention_rollout(maps, head_fusion, discard_ratio), prefix)[0], grid)
    if method in ("cls", "both"):
        last = fuse_heads(maps[-1].float(), head_fusion)
        res["cls"] = _to_grid(_patch_row(last, prefix)[0], grid)
    if out is not None:
        res["out"] = str(_write_png(out, _seen(img, size, model.preprocess), res, alpha, display_size))
    return res


def _check_options(method: str, head_fusion: str, discard_ratio: float) -> None:
    if method not in METHODS:
        raise ConfigError(f"--method: {method!r} is not one of {', '.join(METHODS)}")
    if head_fusion not in FUSIONS:
        raise ConfigError(f"--head-fusion: {head_fusion!r} is not one of {', '.join(FUSIONS)}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ConfigError(f"--discard-ratio: must be in [0, 1), got {discard_ratio}")


def _read_image(image, channels: int, max_pixels) -> tuple[torch.Tensor, str]:
    """The image as uint8 (C, H, W) and where it came from: a tensor as given (checked), or a decoded file."""
    from .data import decode_image

    if isinstance(image, torch.Tensor):
        if image.ndim != 3 or image.dtype != torch.uint8 or image.shape[0] != channels:
            raise ShapeError(f"image: expected a uint8 tensor ({channels}, H, W), "
                             f"got {image.dtype} {tuple(image.shape)}")
        return image, "tensor"
    return decode_image(image, channels, max_pixels), str(image)


def _prediction(model, logits: torch.Tensor) -> dict | None:
    """The top class of a batch of one: {"index", "label", "prob"}; None for a model without a head."""
    if not model.cfg.num_classes:
        return None
    probs = logits.float().softmax(-1)[0]
    i = int(probs.argmax())
    return dict(index=i, label=label_names(model)[i], prob=float(probs[i]))


def _seen(img: torch.Tensor, size: tuple[int, int], pre) -> np.ndarray:
    """The region the model saw (resize + centre crop, before normalisation), as uint8 RGB (H, W, 3)."""
    from .data.images import resize_center_crop

    seen = resize_center_crop(img[None].float(), size, pre.crop_pct, pre.interpolation)[0]
    seen = seen.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    if seen.shape[-1] == 1:
        seen = np.repeat(seen, 3, axis=-1)
    return seen


def _write_png(out, seen: np.ndarray, res: dict, alpha: float, display_size: int):
    from PIL import Image, ImageDraw

    from .io.atomic import atomic_write_bytes

    h, w = seen.shape[:2]
    scale = max(1.0, display_size / min(h, w))
    H, W = round(h * scale), round(w * scale)
    base = np.asarray(Image.fromarray(seen).resize((W, H), Image.BICUBIC if scale < 4 else Image.NEAREST))
    panels = [("input", base)]
    pred = res["pred"]
    if pred is not None:
        panels[0] = (f"pred {pred['label']} ({pred['prob']:.2f})", base)
    tag = "" if res["class_token"] else " (mean over tokens)"
    if res["rollout"] is not None:
        panels.append((f"rollout{tag}", overlay(base, res["rollout"], alpha)))
    if res["cls"] is not None:
        panels.append(("[cls] attention, last block" if res["class_token"] else f"last block{tag}",
                       overlay(base, res["cls"], alpha)))
    pad, title = 6, 16
    canvas = Image.new("RGB", (len(panels) * (W + pad) + pad, H + title + 2 * pad), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for i, (name, arr) in enumerate(panels):
        x0 = pad + i * (W + pad)
        canvas.paste(Image.fromarray(arr), (x0, pad + title))
        draw.text((x0, pad), name, fill=(0, 0, 0))
    buf = io.BytesIO()
    canvas.save(buf, format="PNG")
    atomic_write_bytes(out, buf.getvalue())
    return out


__all__ = ["explain", "attention_rollout", "fuse_heads", "colormap", "overlay", "METHODS", "FUSIONS"]
