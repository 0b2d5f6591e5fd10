"""The original JAX checkpoints (.npz, read with np.load(allow_pickle=False); JAX is not needed).

Two namings are read:
- vit_jax (google-research/vision_transformer): ``Transformer/encoderblock_{i}/`` with LayerNorm_0,
  MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3; ``Transformer/posembed_input/pos_embedding``
  with a class slot (the class token is prepended before position embeddings are added);
- big_vision: LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0; a top-level
  ``pos_embedding`` over the patches only (added before the class token is prepended: vitkit's
  no_embed_class=True), or none at all for fixed 2D sin-cos tables; "scan" checkpoints stack every
  block under ``Transformer/encoderblock/`` with a leading depth axis. Its attention-pooling head
  (``MAPHead_0/``: probe, MultiHeadDotProductAttention_0, LayerNorm_0, MlpBlock_0) becomes
  global_pool='map'.
Keys may sit under ``params/`` or ``opt/target/`` (entries outside it, optimizer state, are ignored).

Layouts (flax -> torch): Dense kernels are (in, out), transposed to (out, in); the patch conv kernel
is HWIO (P, P, C, D) -> OIHW (D, C, P, P); q/k/v kernels (D, H, hd) flatten to (D, D) and transpose,
stacked as qkv; the output kernel (H, hd, D) flattens to (D, D) and transposes; LayerNorm ``scale``
is ``weight``. Flax's ``nn.gelu`` is the tanh approximation unless told otherwise, so the converted
model uses act='gelu_tanh' (``--set act=gelu`` for the exact form); LayerNorm eps is flax's 1e-6.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

import torch

from ..core.errors import CheckpointError
from ..model.config import ViTConfig
from .arch import arch_config, heads_from_width, mlp_ratio_for
from .checkpoint import load_state_dict_file
from .keys import Rule, assemble, build, expected_state, same
from .preprocess import assumed_preprocess

# sub-module names inside an encoder block
NAMINGS = {
    "vit_jax": dict(ln1="LayerNorm_0", attn="MultiHeadDotProductAttention_1", ln2="LayerNorm_2", mlp="MlpBlock_3"),
    "big_vision": dict(ln1="LayerNorm_0", attn="MultiHeadDotProductAttention_0", ln2="LayerNorm_1", mlp="MlpBlock_0"),
}
PREFIXES = ("", "params/", "opt/target/")
SCAN = "Transformer/encoderblock/"


def _t(x: torch.Tensor) -> torch.Tensor:
    """A flax Dense kernel (in, out) as a torch Linear weight (out, in)."""
    if x.ndim != 2:
        raise ValueError("not a matrix")
    return x.T


def _heads_in(*kernels: torch.Tensor) -> torch.Tensor:
    """(D, H, hd) q / k / v kernels -> one stacked torch weight: (D, D) for one, (3D, D) for q, k, v."""
    return torch.cat([x.reshape(x.shape[0], -1).T for x in kernels], dim=0)


def _heads_bias(*biases: torch.Tensor) -> torch.Tensor:
    """(H, hd) q / k / v biases -> one stacked torch bias: (D,) for one, (3D,) for q, k, v."""
    return torch.cat([x.reshape(-1) for x in biases], dim=0)


def _out(x: torch.Tensor) -> torch.Tensor:
    """The (H, hd, D) output kernel -> the (D, D) projection weight."""
    if x.ndim != 3:
        raise ValueError("not (H, hd, D)")
    return x.reshape(-1, x.shape[-1]).T


def _conv(x: torch.Tensor) -> torch.Tensor:
    """HWIO (P, P, C, D) -> OIHW (D, C, P, P)."""
    return x.permute(3, 2, 0, 1)


def unpack(arrays: Mapping[str, torch.Tensor], source: str) -> tuple[dict[str, torch.Tensor], str, bool]:
    """Strip the parameter prefix and unstack scan blocks: (params, naming, scanned)."""
    prefix = next((p for p in PREFIXES if f"{p}embedding/kernel" in arrays), None)
    if prefix is None:
        raise CheckpointError(f"{source}: not a ViT .npz checkpoint (no embedding/kernel, also under params/ "
                              f"or opt/target/)")
    params = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    scanned = any(k.startswith(SCAN) for k in params)
    if scanned:
        stacked = {k: params.pop(k) for k in [k for k in params if k.startswith(SCAN)]}
        depths = {v.shape[0] if v.ndim else 0 for v in stacked.values()}
        if len(depths) != 1 or 0 in depths:
            raise CheckpointError(f"{source}: scan blocks under {SCAN} disagree on the depth axis ({sorted(depths)})")
        for k, v in stacked.items():
            rest = k[len(SCAN):]
            for i in range(v.shape[0]):
                params[f"Transformer/encoderblock_{i}/{rest}"] = v[i]
    naming = "big_vision" if any("MultiHeadDotProductAttention_0/" in k for k in params) else "vit_jax"
    if "pos_embedding" in params:
        naming = "big_vision"
    return params, naming, scanned


def pos_key(naming: str) -> str:
    """The learned position table's key: big_vision's over the patches, or vit_jax's with a class slot."""
    return "pos_embedding" if naming == "big_vision" else "Transformer/posembed_input/pos_embedding"


def jax_table(cfg: ViTConfig, naming: str) -> dict[str, Rule]:
    """vitkit key -> (npz keys, how to make the vitkit tensor from them)."""
    n = NAMINGS[naming]
    pos = pos_key(naming)
    table = {
        "cls_token": (("cls",), same),
        "pos_embed": ((pos,), same),
        "patch_embed.proj.weight": (("embedding/kernel",), _conv),
        "patch_embed.proj.bias": (("embedding/bias",), same),
        "norm.weight": (("Transformer/encoder_norm/scale",), same),
        "norm.bias": (("Transformer/encoder_norm/bias",), same),
        "pre_logits.fc.weight": (("pre_logits/kernel",), _t),
        "pre_logits.fc.bias": (("pre_logits/bias",), same),
        "head.weight": (("head/kernel",), _t),
        "head.bias": (("head/bias",), same),
    }
    for i in range(cfg.depth):
        b, j = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        a = f"{j}{n['attn']}/"
        table.update({
            f"{b}norm1.weight": ((f"{j}{n['ln1']}/scale",), same),
            f"{b}norm1.bias": ((f"{j}{n['ln1']}/bias",), same),
            f"{b}attn.qkv.weight": (tuple(f"{a}{x}/kernel" for x in ("query", "key", "value")), _heads_in),
            f"{b}attn.qkv.bias": (tuple(f"{a}{x}/bias" for x in ("query", "key", "value")), _heads_bias),
            f"{b}attn.proj.weight": ((f"{a}out/kernel",), _out),
            f"{b}attn.proj.bias": ((f"{a}out/bias",), same),
            f"{b}norm2.weight": ((f"{j}{n['ln2']}/scale",), same),
            f"{b}norm2.bias": ((f"{j}{n['ln2']}/bias",), same),
            f"{b}mlp.fc1.weight": ((f"{j}{n['mlp']}/Dense_0/kernel",), _t),
            f"{b}mlp.fc1.bias": ((f"{j}{n['mlp']}/Dense_0/bias",), same),
            f"{b}mlp.fc2.weight": ((f"{j}{n['mlp']}/Dense_1/kernel",), _t),
            f"{b}mlp.fc2.bias": ((f"{j}{n['mlp']}/Dense_1/bias",), same),
        })
    table.update(map_head_table())
    return table


MAP_HEAD = "MAPHead_0/"


def map_head_table() -> dict[str, Rule]:
    """big_vision's MAPHead -> vitkit's attention pool: the probe's query, the tokens' keys and values
    (stacked as kv), the output projection, then the LayerNorm and MLP of its residual branch."""
    h, a = MAP_HEAD, f"{MAP_HEAD}MultiHeadDotProductAttention_0/"
    return {
        "attn_pool.latent": ((f"{h}probe",), same),
        "attn_pool.q.weight": ((f"{a}query/kernel",), _heads_in),
        "attn_pool.q.bias": ((f"{a}query/bias",), _heads_bias),
        "attn_pool.kv.weight": ((f"{a}key/kernel", f"{a}value/kernel"), _heads_in),
        "attn_pool.kv.bias": ((f"{a}key/bias", f"{a}value/bias"), _heads_bias),
        "attn_pool.proj.weight": ((f"{a}out/kernel",), _out),
        "attn_pool.proj.bias": ((f"{a}out/bias",), same),
        "attn_pool.norm.weight": ((f"{h}LayerNorm_0/scale",), same),
        "attn_pool.norm.bias": ((f"{h}LayerNorm_0/bias",), same),
        "attn_pool.mlp.fc1.weight": ((f"{h}MlpBlock_0/Dense_0/kernel",), _t),
        "attn_pool.mlp.fc1.bias": ((f"{h}MlpBlock_0/Dense_0/bias",), same),
        "attn_pool.mlp.fc2.weight": ((f"{h}MlpBlock_0/Dense_1/kernel",), _t),
        "attn_pool.mlp.fc2.bias": ((f"{h}MlpBlock_0/Dense_1/bias",), same),
    }


def infer(params: Mapping[str, torch.Tensor], naming: str, source: str) -> tuple[dict, dict, int | None]:
    """(fields the arrays show, fields assumed, position-table length)."""
    n = NAMINGS[naming]
    k = params["embedding/kernel"]
    if k.ndim != 4 or k.shape[0] != k.shape[1]:
        raise CheckpointError(f"{source}: embedding/kernel {tuple(k.shape)} is not a (P, P, C, D) patch kernel")
    P, _, C, D = k.shape
    blocks = [int(m.group(1)) for m in map(re.compile(r"Transformer/encoderblock_(\d+)/").match, params) if m]
    if not blocks:
        raise CheckpointError(f"{source}: no encoder blocks (no Transformer/encoderblock_0/ arrays)")
    depth = max(blocks) + 1  # a block with arrays missing is reported as missing, not dropped
    seen: dict = dict(embed_dim=D, depth=depth, patch_size=P, in_chans=C)
    q = params.get(f"Transformer/encoderblock_0/{n['attn']}/query/kernel")
    if q is not None and q.ndim == 3:
        seen["num_heads"] = q.shape[1]
    fc1 = params.get(f"Transformer/encoderblock_0/{n['mlp']}/Dense_0/kernel")
    if fc1 is not None and fc1.ndim == 2:
        seen["mlp_ratio"] = mlp_ratio_for(fc1.shape[1], D)
    seen["qkv_bias"] = f"Transformer/encoderblock_0/{n['attn']}/query/bias" in params
    seen["class_token"] = "cls" in params
    seen["global_pool"] = "token" if seen["class_token"] else "avg"
    if f"{MAP_HEAD}MultiHeadDotProductAttention_0/query/kernel" in params:  # (a lone probe is unexpected)
        seen["global_pool"] = "map"
    seen["fc_norm"] = False  # the encoder norm comes before pooling in both codebases
    seen["num_classes"] = params["head/kernel"].shape[-1] if "head/kernel" in params else 0
    seen["representation_size"] = params["pre_logits/kernel"].shape[-1] if "pre_logits/kernel" in params else None
    pos = pos_key(naming)
    pos_len = None
    if pos in params:
        seen["pos_embed"] = "learn"
        pos_len = params[pos].shape[1] if params[pos].ndim == 3 else None
        seen["no_embed_class"] = naming == "big_vision" and seen["class_token"]
    elif naming == "big_vision":
        seen["pos_embed"] = "sincos2d"  # big_vision's fixed table (posemb='sincos2d') has no parameter
        seen["no_embed_class"] = False
    guessed = dict(norm_eps=1e-6, act="gelu_tanh", num_heads=heads_from_width(D))  # heads: only if q is absent
    return seen, guessed, pos_len


def read_jax(path, cfg: ViTConfig | None = None, model=None, *, model_name=None, overrides=None):
    """(VisionTransformer, info) from a .npz checkpoint."""
    source = str(path)
    if not isinstance(path, (str, os.PathLike)) or not str(path).lower().endswith(".npz"):
        raise CheckpointError(f"{source}: JAX checkpoints are read from .npz files")
    params, naming, scanned = unpack(load_state_dict_file(path), source)
    assumed: dict = {}
    if model is not None:
        cfg = model.cfg
    elif cfg is None:
        seen, guessed, pos_len = infer(params, naming, source)
        cfg, assumed = arch_config(seen, guessed, source, pos_len=pos_len, model_name=model_name,
                                      overrides=overrides)
    expected = expected_state(cfg)
    state = assemble(expected, jax_table(cfg, naming), params, source)
    info = {"source": source, "assumed": assumed, "naming": naming + (" (scan)" if scanned else "")}
    if model is None:  # a .npz file does not say how images are prepared: the defaults, reported
        model = build(cfg, state, source)
        return model, {**info, "preprocess_assumed": assumed_preprocess(model.preprocess)}
    return build(cfg, state, source, model), info
