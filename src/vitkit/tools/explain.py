"""Where does the model look? Attention rollout, class-token attention and a class-specific
relevance map, overlaid on the image.

    from .explain import explain
    res = explain("ckpt/", "cat.jpg", out="cat_attn.png")   # method='all'
    res["rollout"], res["cls"], res["grad"]   # float32 numpy maps of shape (H/P, W/P)
    res = explain("ckpt/", "cat.jpg", method="grad", target="dog")   # the relevance for another class

- rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"): fuse the heads of each
  block (mean, max or min), optionally zero the weakest ``discard_ratio`` of the weights, add the
  identity for the residual connection, renormalise the rows, and multiply the blocks' matrices from
  the first to the last. The map is the row of the class token over the patch tokens.
- cls: the last block's attention from the class token to the patches, heads fused the same way.
- grad: gradient-weighted attention rollout for one class (Chefer et al. 2021, "Transformer
  Interpretability Beyond Attention Visualization", in the gradient x attention form of their
  "Generic Attention-model Explainability", ICCV 2021): with A a block's attention and dA the gradient
  of the class's logit with respect to it, R starts as the identity and each block, first to last,
  adds A_bar R, where A_bar = mean over heads of max(dA * A, 0). The class is the predicted one unless
  ``target`` names another (a class name or an index). The map is read out the way the model pools:
  the class token's row of R ('token'), the mean of the patch tokens' rows ('avg'), or the attention
  pool's probe ('map': its own gradient-weighted attention, times R).

Register tokens (``model.num_reg_tokens``, after the class token) are never read as the class token
and are left out of every map (``TokenLayout``). Models without a class token have no class-token row:
rollout and cls then use the mean over the patch tokens' rows; ``res["note"]`` says so.

The attention probabilities come from ``model.forward_with_attention``, which takes the manual
attention path for this call only: the model keeps its fused attention for everything else. The grad
method differentiates the logit with respect to those probabilities (they are in the autograd graph);
nothing is added to the model's own forward.
Non-square images run at their own aspect ratio when the model has ``dynamic_img_size=True`` (or at an
``img_size`` given here; a fixed-size model is then resampled with ``resample_to`` on a copy).
"""

from __future__ import annotations

import copy
import io
import numbers
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..core.errors import ConfigError, ShapeError
from ..core.strict import to_hw
from ..data.images import DEFAULT_MAX_PIXELS
from .loading import label_names, load_model

METHODS = ("rollout", "cls", "grad", "both", "all")  # both: rollout and cls; all: the three
MAPS = ("rollout", "cls", "grad")  # the maps a result holds (None where not asked for)
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


def gradient_rollout(maps: list[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
    """Gradient-weighted rollout (Chefer et al. 2021): per-block attention (B, heads, T, T) and the class
    score's gradient with respect to it -> the (B, T, T) relevance R = I, R <- R + A_bar R from the first
    block to the last, A_bar = mean over heads of max(grad * attention, 0)."""
    if not maps:
        raise ShapeError("gradient_rollout: no attention maps (a model with depth 0?)")
    B, _, T, _ = maps[0].shape
    relevance = torch.eye(T, dtype=torch.float64, device=maps[0].device).expand(B, T, T).clone()
    for attn, grad in zip(maps, grads):
        relevance = relevance + gradient_weighted(attn, grad) @ relevance
    return relevance.float()


def gradient_weighted(attn: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """(B, heads, Q, T) attention and its gradient -> (B, Q, T): the heads' mean of max(grad * attn, 0),
    in float64."""
    return (grad.double() * attn.double()).clamp(min=0).mean(1)


@dataclass(frozen=True)
class TokenLayout:
    """The order of a model's tokens: the class token (``class_tokens`` 0 or 1), then ``registers``
    register tokens, then ``patches`` patch tokens. The maps are read from the rows of the class token or
    of the patches, and shown over the patch columns only: register tokens are never read or shown."""

    class_tokens: int
    registers: int
    patches: int

    @staticmethod
    def of(model, num_tokens: int) -> "TokenLayout":
        """The layout of ``model``'s sequences of ``num_tokens`` tokens (registers: ``model.num_reg_tokens``)."""
        n_cls = 1 if model.cfg.class_token else 0
        n_reg = int(getattr(model, "num_reg_tokens", 0) or 0)
        if num_tokens <= n_cls + n_reg:
            raise ShapeError(f"explain: {num_tokens} tokens leave no patch after {n_cls} class and {n_reg} register tokens")
        return TokenLayout(n_cls, n_reg, num_tokens - n_cls - n_reg)

    @property
    def prefix(self) -> int:
        return self.class_tokens + self.registers

    def class_row(self, mat: torch.Tensor) -> torch.Tensor:
        """(B, T, T) -> (B, N): the class token's row over the patches."""
        if not self.class_tokens:
            raise ShapeError("explain: the model has no class token to read")
        return mat[:, 0, self.prefix :]

    def patch_rows(self, mat: torch.Tensor) -> torch.Tensor:
        """(B, T, T) -> (B, N): the mean of the patch tokens' rows, over the patches."""
        return mat[:, self.prefix :, self.prefix :].mean(1)

    def agnostic_row(self, mat: torch.Tensor) -> torch.Tensor:
        """The class-agnostic maps' row: the class token's, else the mean of the patch tokens' rows."""
        return self.class_row(mat) if self.class_tokens else self.patch_rows(mat)


def _to_grid(v: torch.Tensor, grid: tuple[int, int]) -> np.ndarray:
    return v.reshape(grid).float().cpu().numpy()


# ---------------------------------------------------------------------------------------- classes
GRAD_POOLS = ("token", "avg", "map")  # the poolings that give one class score per image


def resolve_class(model, target: int | str | None) -> int | None:
    """The index of the class ``target`` names (checked as '--class'): one of the model's class names,
    else an index (an int or a string of digits); None stays None (the predicted class)."""
    if target is None:
        return None
    names = label_names(model)
    n = len(names)
    if isinstance(target, str):
        if target in names:
            return names.index(target)
        if not target.strip().isdigit():
            shown = ", ".join(names[:10]) + (", ..." if n > 10 else "")
            raise ConfigError(f"--class: {target!r} is neither a class name nor an index (classes: {shown})")
        target = int(target)
    if isinstance(target, bool) or not isinstance(target, numbers.Integral):
        raise ConfigError(f"--class: expected a class name or index, got {type(target).__name__}")
    if not 0 <= target < n:
        raise ConfigError(f"--class: index {target} is out of range: the model has {n} classes (0..{n - 1})")
    return int(target)


def class_relevance(model, x: torch.Tensor, target: int | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The grad map of a prepared batch ``x`` (B, C, H, W) for class ``target``: an index, one index per
    image ((B,) tensor), or None for each image's predicted class.

    Returns (relevance over the patches (B, N) float32, logits (B, classes)). The class score is the
    logit; the map is ``gradient_rollout`` read out the way the model pools (see the module docstring).
    """
    row, logits, _ = _relevance_and_maps(model, x, target)
    return row, logits


def _relevance_and_maps(model, x: torch.Tensor, target) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``class_relevance``, and the blocks' attention maps (detached) of the same forward pass."""
    pool = model.cfg.global_pool
    why_not = no_class_score(model)
    if why_not:
        raise ConfigError(f"--method grad: {why_not}")
    with torch.enable_grad():
        # the input requires grad so that the graph exists even for a model whose weights are frozen
        logits, maps, probe = model.forward_with_all_attention(x.detach().requires_grad_(True))
        index = logits.argmax(-1) if target is None else torch.as_tensor(target, device=logits.device)
        # each image's score depends on that image alone: one backward of the sum gives each its own gradients
        score = logits.gather(1, index.expand(logits.shape[0])[:, None]).sum()
        grads = torch.autograd.grad(score, maps + ([] if probe is None else [probe]))
    maps = [a.detach() for a in maps]
    relevance = gradient_rollout(maps, grads[: len(maps)])
    layout = TokenLayout.of(model, maps[0].shape[-1])
    P = layout.prefix
    if pool == "token":
        row = layout.class_row(relevance)
    elif pool == "avg":
        row = layout.patch_rows(relevance)
    else:  # the probe's own gradient-weighted attention over the patch tokens, carried through R
        weights = gradient_weighted(probe.detach(), grads[-1])[:, 0].float()
        row = (weights[:, None] @ relevance[:, P:, P:])[:, 0]
    return row, logits.detach(), maps


def no_class_score(model) -> str:
    """Why ``model`` has no class score to explain ('' when it has one): no head, or no pooling."""
    if not model.cfg.num_classes:
        return "the model has no classification head (num_classes=0)"
    if model.cfg.global_pool not in GRAD_POOLS:
        return f"global_pool={model.cfg.global_pool!r} gives no class score per image"
    return ""


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
    method: str = "all",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    img_size: int | tuple[int, int] | None = None,
    alpha: float = 0.5,
    display_size: int = 256,
    device: str | torch.device = "cpu",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    target: int | str | None = None,
) -> dict:
    """Attention maps of one image (a file path or a uint8 (C, H, W) tensor), optionally written as a PNG.

    ``method``: one of METHODS ('all': rollout, cls, and grad where the model has a class score).
    ``target``: the class the grad map explains, a name or an index (default: the predicted class).
    Returns {"rollout", "cls", "grad": (gh, gw) float32 arrays or None, "grid": (gh, gw), "input_size":
    (H, W), "pred" and "target": {"index", "label", "prob"} (target: the class of the grad map, or None),
    "class_token": bool, "note": str, "out"}.
    """
    from ..data import to_model_input

    _check_options(method, head_fusion, discard_ratio, alpha)
    model = load_model(model_or_path, device)
    cfg = model.cfg
    wanted, notes = _maps_for(method, model, target)
    index = resolve_class(model, target)
    img, source = _read_image(image, cfg.in_chans, max_pixels)
    size, run_model = _run_size(model, tuple(img.shape[-2:]), img_size)
    x = to_model_input(img, size, model.preprocess)[None].to(next(model.parameters()).device)
    if "grad" in wanted:  # one pass with gradients gives the grad map, the attention maps and the logits
        relevance, logits, maps = _relevance_and_maps(run_model, x, index)
    else:
        with torch.no_grad():
            logits, maps = run_model.forward_with_attention(x)  # manual attention for this call only
    grid = (size[0] // cfg.patch_size, size[1] // cfg.patch_size)
    layout = TokenLayout.of(run_model, maps[0].shape[-1])
    if not layout.class_tokens and {"rollout", "cls"} & set(wanted):
        notes.insert(0, "the model has no class token: rollout and cls are the mean over the patch tokens' rows")
    res: dict = dict(source=source, method=method, head_fusion=head_fusion, discard_ratio=discard_ratio,
                     input_size=list(size), grid=list(grid), class_token=bool(cfg.class_token), note="; ".join(notes),
                     pred=_class_info(model, logits), target=None, out=None, **dict.fromkeys(MAPS))
    if "rollout" in wanted:
        res["rollout"] = _to_grid(layout.agnostic_row(attention_rollout(maps, head_fusion, discard_ratio))[0], grid)
    if "cls" in wanted:
        res["cls"] = _to_grid(layout.agnostic_row(fuse_heads(maps[-1].float(), head_fusion))[0], grid)
    if "grad" in wanted:
        res["grad"] = _to_grid(relevance[0], grid)
        res["target"] = _class_info(model, logits, index)
    if out is not None:
        res["out"] = str(_write_png(out, _seen(img, size, model.preprocess), res, alpha, display_size))
    return res


def _maps_for(method: str, model, target) -> tuple[tuple[str, ...], list[str]]:
    """The maps ``method`` asks for on this model, and notes on any left out: 'all' leaves out grad where
    the model has no class score; 'grad' or a ``target`` there is an error, as is a target without grad."""
    wanted = {"both": ("rollout", "cls"), "all": MAPS}.get(method, (method,))
    why_not = no_class_score(model)
    if why_not and target is not None:
        raise ConfigError(f"--class: {why_not}")
    if why_not and "grad" in wanted:
        if method == "grad":
            raise ConfigError(f"--method grad: {why_not}")
        return tuple(m for m in wanted if m != "grad"), [f"no grad map: {why_not}"]
    if target is not None and "grad" not in wanted:
        raise ConfigError(f"--class: only the grad map is class-specific; --method {method} draws none")
    return wanted, []


def _check_options(method: str, head_fusion: str, discard_ratio: float, alpha: float = 0.5) -> None:
    if method not in METHODS:
        raise ConfigError(f"--method: {method!r} is not one of {', '.join(METHODS)}")
    if head_fusion not in FUSIONS:
        raise ConfigError(f"--head-fusion: {head_fusion!r} is not one of {', '.join(FUSIONS)}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ConfigError(f"--discard-ratio: must be in [0, 1), got {discard_ratio}")
    if not 0.0 <= alpha <= 1.0:  # NaN too
        raise ConfigError(f"--alpha: the heatmap's opacity must be in [0, 1], got {alpha}")


def _read_image(image, channels: int, max_pixels) -> tuple[torch.Tensor, str]:
    """The image as uint8 (C, H, W) and where it came from: a tensor as given (checked), or a decoded file."""
    from ..data import decode_image

    if isinstance(image, torch.Tensor):
        if image.ndim != 3 or image.dtype != torch.uint8 or image.shape[0] != channels:
            raise ShapeError(f"image: expected a uint8 tensor ({channels}, H, W), "
                             f"got {image.dtype} {tuple(image.shape)}")
        return image, "tensor"
    return decode_image(image, channels, max_pixels), str(image)


def _class_info(model, logits: torch.Tensor, index: int | None = None) -> dict | None:
    """Class ``index`` (default: the top class) of a batch of one: {"index", "label", "prob"}; None for a
    model without a head."""
    if not model.cfg.num_classes:
        return None
    probs = logits.float().softmax(-1)[0]
    i = int(probs.argmax()) if index is None else index
    return dict(index=i, label=label_names(model)[i], prob=float(probs[i]))


def _seen(img: torch.Tensor, size: tuple[int, int], pre) -> np.ndarray:
    """The image as the model saw it (resized as ``pre`` says + centre crop, before normalisation), as uint8
    RGB (H, W, 3)."""
    from ..data.images import resize_center_crop

    seen = resize_center_crop(img[None].float(), size, pre.crop_pct, pre.interpolation, pre.resize)[0]
    seen = seen.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    if seen.shape[-1] == 1:
        seen = np.repeat(seen, 3, axis=-1)
    return seen


def _write_png(out, seen: np.ndarray, res: dict, alpha: float, display_size: int):
    from PIL import Image, ImageDraw

    from ..io.atomic import atomic_write_bytes

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
    if res["grad"] is not None:
        t = res["target"]
        panels.append((f"grad rollout, class {t['label']} ({t['prob']:.2f})", overlay(base, res["grad"], alpha)))
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


__all__ = ["explain", "attention_rollout", "gradient_rollout", "gradient_weighted", "class_relevance", "resolve_class",
           "no_class_score", "TokenLayout", "fuse_heads", "colormap", "overlay", "METHODS", "MAPS", "FUSIONS",
           "GRAD_POOLS"]
