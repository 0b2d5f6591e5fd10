"""The Vision Transformer (Dosovitskiy et al. 2020), every variant from one ``ViTConfig``.

    image (B, C, H, W)
      -> patch_embed          (B, N, D)      N = H/P * W/P patches, each projected to D
      -> prefix + pos_embed   (B, T, D)      T = prefix + N: [cls] (if any), then R registers (if any),
                                             then the patches; and position information
      -> blocks x depth       (B, T, D)      pre-LN self-attention + MLP, residual
      -> norm                 (B, T, D)      forward_features ends here
      -> pool                 (B, D)         [cls] token, mean of the patch tokens (then fc_norm), or
                                             attention pooling over the patch tokens ('map')
      -> head                 (B, classes)   forward_head ends here; softmax gives probabilities

Register tokens (Darcet et al. 2023) are learned tokens that every block attends to and that are
never pooled: they give the network somewhere other than background patches to keep global
information. ``num_prefix_tokens`` counts the class token and the registers; ``num_reg_tokens`` the
registers alone.

``_encode`` runs the first three steps and returns an ``Encoded`` tuple (tokens, the outputs of the
blocks asked for, attention maps if asked for, the patch grid); forward_features,
forward_intermediates, get_intermediate_layers, attention_maps and forward_with_attention read what
they need from it.

Gradient checkpointing (``set_grad_checkpointing``, timm's name) trades compute for memory in training:
each block keeps only its input for the backward pass and runs its forward again there, so the
activations inside the blocks are never stored all at once. It applies only where gradients are
recorded in training mode, never in eval, under ``torch.no_grad`` or when the model is traced or
exported; the recomputation replays the random state, so dropout and drop-path draw the same masks and
the gradients are those of the plain forward.

Initialisation (``init_weights``) draws the position table, then applies ``init_jax`` (the paper,
big_vision) or ``init_timm`` to every submodule in ``named_modules()`` order, so that a seed fixes
every weight.

Module names follow timm (patch_embed.proj, cls_token, reg_token, pos_embed, blocks.i.norm1,
blocks.i.attn.qkv, blocks.i.attn.q_norm/k_norm, blocks.i.attn.proj, blocks.i.norm2, blocks.i.mlp.fc1/fc2,
norm, attn_pool, fc_norm, head), so timm state dicts load with an identity key map.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..core.errors import ConfigError, ShapeError
from .config import Preprocess, ViTConfig
from .layers import (
    AttentionPool,
    Block,
    ConvStem,
    LayerScale,
    PatchEmbed,
    lecun_normal_,
    resample_pos_embed,
    sincos_1d,
    sincos_2d,
)


class Encoded(NamedTuple):
    """What ``VisionTransformer._encode`` returns."""

    tokens: torch.Tensor  # (B, prefix + N, D) after the last block, before the final norm
    kept: list[torch.Tensor]  # outputs of the blocks asked for, in block order
    attention: list[torch.Tensor]  # (B, heads, T, T) of every block if asked for, else empty
    grid: tuple[int, int]  # (gh, gw), the patch grid of this input


class VisionTransformer(nn.Module):
    def __init__(self, cfg: ViTConfig | None = None, **overrides):
        super().__init__()
        cfg = (cfg or ViTConfig()).replace(**overrides) if overrides else (cfg or ViTConfig())
        self.cfg = cfg
        D = cfg.embed_dim
        self.num_prefix_tokens = cfg.num_prefix_tokens  # the class token (if any) and the registers
        self.num_reg_tokens = cfg.reg_tokens
        self.num_features = D
        # Saved with the model: how to prepare images, and the class names (None = indices).
        self.preprocess = Preprocess().for_channels(cfg.in_chans)
        self.labels: list[str] | None = None

        if cfg.stem == "conv":
            self.patch_embed = ConvStem(cfg.patch_size, cfg.in_chans, D, cfg.stem_width, cfg.stem_convs,
                                        cfg.stem_whiten, cfg.stem_bn_momentum, cfg.stem_dirac, cfg.stem_early_convs,
                                        cfg.stem_whiten_affine)
        else:
            self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, D, cfg.patch_embed)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, D)) if cfg.reg_tokens else None
        if cfg.pos_embed == "learn":
            n_pos = self._pos_prefix + cfg.num_patches
            self.pos_embed = nn.Parameter(torch.zeros(1, n_pos, D))
        else:
            self.pos_embed = None  # fixed tables are computed on the fly (cheap, never stale)
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.blocks = _make_blocks(cfg)
        # Post-LN blocks end in a LayerNorm already; with fc_norm the norm moves after pooling.
        final_norm = cfg.norm == "pre" and not cfg.use_fc_norm
        self.norm = nn.LayerNorm(D, eps=cfg.norm_eps) if final_norm else nn.Identity()
        if cfg.global_pool == "map":  # a learned probe attends over the patch tokens
            self.attn_pool = AttentionPool(D, cfg.num_heads, cfg.mlp_hidden, cfg.act, cfg.norm_eps,
                                           fused=cfg.attn_impl == "fused")
        else:
            self.attn_pool = None
        self.fc_norm = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.use_fc_norm else nn.Identity()
        if cfg.representation_size:
            self.pre_logits = nn.Sequential()
            self.pre_logits.add_module("fc", nn.Linear(D, cfg.representation_size))
            self.pre_logits.add_module("act", nn.Tanh())
            self.num_features = cfg.representation_size
        else:
            self.pre_logits = nn.Identity()
        self.head_drop = nn.Dropout(cfg.head_drop_rate)
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.grad_checkpointing = False  # recompute each block's forward in backward (set_grad_checkpointing)
        self.init_weights()

    # -------------------------------------------------------------------------------------- init
    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise as the paper ('jax') or timm ('timm'); seed torch's RNG first for determinism.

        The model's own tensors first (position table, class token, registers), then ``init_jax`` or
        ``init_timm`` on every submodule in ``named_modules()`` order: that order fixes the random draws.
        A model on the meta device (its shapes only) holds no values to initialise: nothing is drawn.
        """
        if any(p.is_meta for p in self.parameters()):
            return
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02, a=-0.04, b=0.04)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)  # as timm
        init_module = _INITS[self.cfg.init]
        for name, module in self.named_modules():
            init_module(module, name)

    def reset_head(self, num_classes: int, labels: Sequence[str] | None = None) -> None:
        """Replace the head with a fresh one for ``num_classes`` (zero-initialised, as for fine-tuning)."""
        self.cfg = self.cfg.replace(num_classes=num_classes)
        ref = next(self.parameters())
        self.head = nn.Linear(self.num_features, num_classes).to(ref.device) if num_classes else nn.Identity()
        if num_classes:
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        self.labels = list(labels) if labels is not None else None

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of storing them (see the module
        docstring): less memory in training for about one more forward pass per step."""
        self.grad_checkpointing = enable

    @torch.no_grad()
    def resample_to(self, img_size: int | tuple[int, int], mode: str = "bicubic", antialias: bool = False) -> None:
        """Convert the model once to a new input size: learned position embeddings are resampled in 2D."""
        new = self.cfg.replace(img_size=img_size)
        self._resample_pos_embed(new.grid_size, mode, antialias)
        self.cfg = new

    @torch.no_grad()
    def resample_patch_size(self, patch_size: int, mode: str = "bicubic", antialias: bool = True) -> None:
        """Convert the model once to another patch size (FlexiViT, Beyer et al. 2023).

        The patch kernel is resized by the pseudo-inverse of resizing a patch (``layers.resample_patch_embed``),
        so that a patch resized to the new size with ``mode`` embeds as the original patch did (exactly
        when the patches grow, least squares when they shrink); learned position embeddings are
        resampled to the new grid with the same interpolation. ``img_size`` stays: it must be a multiple
        of the new size. The defaults are timm's (bicubic, antialias). The conv stem refuses: it has no
        patch kernel.
        """
        new = self.cfg.replace(patch_size=patch_size)  # checks the size against img_size
        self.patch_embed.resample_patch_size(patch_size, mode, antialias)
        self._resample_pos_embed(new.grid_size, mode, antialias)
        self.cfg = new

    def _resample_pos_embed(self, grid: tuple[int, int], mode: str, antialias: bool) -> None:
        """Resample learned position embeddings (if any) from the current config's grid to ``grid``."""
        if self.pos_embed is not None:
            pe = resample_pos_embed(self.pos_embed.data, grid, self.cfg.grid_size, self._pos_prefix, mode, antialias)
            self.pos_embed = nn.Parameter(pe)

    # ----------------------------------------------------------------------------------- checks
    def check_input(self, x: torch.Tensor) -> tuple[int, int]:
        """Raise ShapeError unless ``x`` is a float (B, C, H, W) batch the model can take; return the grid.

        Runs on every forward, so it only compares; the messages are built when a check fails.
        """
        cfg = self.cfg
        if not isinstance(x, torch.Tensor):
            raise ShapeError(f"input: expected {self._expected_input()}, got {type(x).__name__}")
        if x.ndim != 4:
            raise ShapeError(f"input: expected {self._expected_input()}, got {_describe(x)} (rank {x.ndim})")
        if not x.is_floating_point():
            raise ShapeError(f"input: expected {self._expected_input()}, got {_describe(x)}; "
                             "convert images with .float() / 255")
        B, C, H, W = x.shape
        if C != cfg.in_chans:
            raise ShapeError(f"input: expected {self._expected_input()}, got {_describe(x)} "
                             f"({C} channels, model takes {cfg.in_chans})")
        P = cfg.patch_size
        if cfg.dynamic_img_size:
            if H % P or W % P or H < P or W < P:
                raise ShapeError(f"input: height and width must be multiples of patch size {P}, got {_describe(x)}")
        elif (H, W) != cfg.img_size:
            raise ShapeError(
                f"input: expected {self._expected_input()}, got {_describe(x)}; build with dynamic_img_size=True "
                f"or call resample_to(({H}, {W})) to run at another size"
            )
        return H // P, W // P

    def _expected_input(self) -> str:
        """What ``check_input`` accepts, in words (for its error messages)."""
        cfg = self.cfg
        return f"a float tensor (B, {cfg.in_chans}, {cfg.img_size[0]}, {cfg.img_size[1]})"

    # ---------------------------------------------------------------------------------- forward
    @property
    def _pos_prefix(self) -> int:
        """How many prefix tokens the position table covers: all of them (timm's learned table, sincos1d)
        or none (no_embed_class as big_vision, sincos2d, or no table: the prefix gets no position)."""
        cfg = self.cfg
        covers_prefix = cfg.pos_embed == "sincos1d" or (cfg.pos_embed == "learn" and not cfg.no_embed_class)
        return self.num_prefix_tokens if covers_prefix else 0

    def embed_positions(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Add position information and prepend the prefix tokens: (B, N, D) -> (B, prefix + N, D).

        A table that covers the prefix is added after the prefix is prepended; one that covers the
        patches only is added before (big_vision's order).
        """
        if self._pos_prefix:
            x = self._add_positions(self._prepend_prefix(x), grid)
        else:
            x = self._prepend_prefix(self._add_positions(x, grid))
        return self.pos_drop(x)

    def _prepend_prefix(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) -> (B, prefix + N, D): the class token and the registers, those the model has, in
        front of the patches."""
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        return torch.cat([*prefix, x], dim=1) if prefix else x

    def _add_positions(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Add the position table to ``x``, the tokens it covers (see ``_pos_prefix``); 'none' adds nothing."""
        cfg, D = self.cfg, x.shape[-1]
        if cfg.pos_embed == "none":
            return x
        if cfg.pos_embed == "learn":
            table = self.pos_embed
            if (cfg.dynamic_img_size and _tracing()) or grid != cfg.grid_size:
                # (an exporter records the resampling so that the graph takes any size)
                table = resample_pos_embed(table, grid, cfg.grid_size, self._pos_prefix)
        else:  # fixed tables: computed in float32 on the fly (cheap, never stale), cast to the tokens' dtype
            table = sincos_2d(grid, D) if cfg.pos_embed == "sincos2d" else sincos_1d(x.shape[1], D)
            table = table.to(x.dtype).to(x.device)
        return x + table

    def _encode(self, x: torch.Tensor, keep: set[int] = frozenset(), with_attention: bool = False,
                last: int | None = None) -> Encoded:
        """Run the stem and the blocks (up to block ``last``, else all), keeping the outputs of blocks in
        ``keep`` and, if asked, attention maps."""
        grid = self.check_input(x)
        x = self.embed_positions(self.patch_embed(x), grid)
        kept, maps = [], []
        blocks = self.blocks if last is None else self.blocks[: last + 1]
        for i, blk in enumerate(blocks):
            if with_attention:
                x, attn = blk.forward_with_attention(x)
                maps.append(attn)
            else:
                x = self._run_block(blk, x)
            if i in keep:
                kept.append(x)
        return Encoded(x, kept, maps, grid)

    def _run_block(self, blk: Block, x: torch.Tensor) -> torch.Tensor:
        """``blk(x)``, checkpointed when gradient checkpointing is on and gradients are being recorded in
        training (not in eval, under no_grad, or when traced or exported)."""
        if self.grad_checkpointing and self.training and torch.is_grad_enabled() and not _exporting():
            return checkpoint(blk, x, use_reentrant=False)  # replays the RNG state: the same dropout masks
        return blk(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> normalised tokens (B, prefix + N, D)."""
        return self.norm(self._encode(x).tokens)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) tokens -> (B, D) by the configured pooling ('none' keeps every token).

        'avg' and 'map' read the patch tokens only: the class token and the registers are dropped (timm).
        """
        pool = self.cfg.global_pool
        if pool == "token":
            return x[:, 0]
        if pool == "avg":
            return x[:, self.num_prefix_tokens :].mean(dim=1)
        if pool == "map":
            return self.attn_pool(x[:, self.num_prefix_tokens :])
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens from forward_features -> logits (B, classes), or the pooled features if ``pre_logits``."""
        return self._head(self.pool(x), pre_logits)

    def _head(self, pooled: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pooled features (B, D) -> logits, or the features before the head if ``pre_logits``."""
        x = self.head_drop(self.pre_logits(self.fc_norm(pooled)))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) float images -> (B, num_classes) logits."""
        return self.forward_head(self.forward_features(x))

    # ------------------------------------------------------------------------------ inspection
    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
    ):
        """The outputs of chosen blocks, for dense prediction: timm 1.0's signature and return layout.

        ``indices``: None = every block, an int n = the last n blocks, a sequence = those blocks
        (negative ones count from the end); the outputs come in block order, each once. Each output
        is passed through the final norm if ``norm``, and its prefix tokens ([cls], registers) are cut
        off: ``output_fmt`` 'NCHW' gives the patch tokens as a (B, D, gh, gw) map, 'NLC' as (B, N, D);
        with ``return_prefix_tokens`` (and a model that has prefix tokens) each is a pair
        (patches, prefix (B, prefix, D)). ``stop_early`` runs no block past the last one asked for.

        Returns the list if ``intermediates_only``, else (the final normalised tokens (B, T, D) of the
        last block run, the list); with ``output_dict``, a dict with 'image_intermediates',
        'image_intermediates_prefix' (if asked for) and 'image_features' (unless intermediates_only).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ConfigError(f"forward_intermediates: output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take = self._take_indices(indices, "forward_intermediates: indices")
        enc = self._encode(x, keep=set(take), last=max(take) if stop_early else None)
        outs = [self.norm(t) if norm else t for t in enc.kept]
        P = self.num_prefix_tokens
        prefix = [t[:, :P] for t in outs] if P else None
        outs = [t[:, P:] for t in outs]
        if output_fmt == "NCHW":
            outs = [self._to_map(t, enc.grid) for t in outs]
        if output_dict:
            res = {"image_intermediates": outs}
            if prefix is not None and return_prefix_tokens:
                res["image_intermediates_prefix"] = prefix
            if not intermediates_only:
                res["image_features"] = self.norm(enc.tokens)
            return res
        if return_prefix_tokens and prefix is not None:
            outs = list(zip(outs, prefix))
        return outs if intermediates_only else (self.norm(enc.tokens), outs)

    def get_intermediate_layers(
        self,
        x: torch.Tensor,
        n: int | Sequence[int] = 1,
        reshape: bool = False,
        return_prefix_tokens: bool = False,
        norm: bool = False,
    ) -> list:
        """Outputs of the last ``n`` blocks (or of the blocks with indices ``n``), in block order; the
        arguments in timm's (and DINO's) order.

        Each is every token (B, prefix + N, D); with ``reshape`` the patch tokens as a (B, D, gh, gw)
        map, and with ``return_prefix_tokens`` a pair (patch tokens, as a map with ``reshape``, and the
        prefix tokens (B, prefix, D)), as ``forward_intermediates``.
        """
        take = self._take_indices(n, "get_intermediate_layers: n")
        if reshape or return_prefix_tokens:
            return self.forward_intermediates(x, take, return_prefix_tokens, norm, stop_early=True,
                                              output_fmt="NCHW" if reshape else "NLC", intermediates_only=True)
        enc = self._encode(x, keep=set(take), last=max(take))
        return [self.norm(t) if norm else t for t in enc.kept]

    def _take_indices(self, indices: int | Sequence[int] | None, what: str) -> list[int]:
        """Block indices from None (all), n (the last n) or a sequence (negative from the end), as timm;
        ``what`` names the argument in errors."""
        depth = len(self.blocks)
        if indices is None:
            return list(range(depth))
        if isinstance(indices, int):
            if not 1 <= indices <= depth:
                raise ConfigError(f"{what}: the number of last blocks must be in 1..{depth}, got {indices}")
            return list(range(depth - indices, depth))
        take = [i + depth if i < 0 else i for i in indices]
        if not take or not all(0 <= j < depth for j in take):
            raise ConfigError(f"{what}: block indices must be in {-depth}..{depth - 1}, got {list(indices)}")
        return take

    @staticmethod
    def _to_map(patches: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """(B, N, D) patch tokens in raster order -> a (B, D, gh, gw) feature map."""
        gh, gw = grid
        return patches.reshape(patches.shape[0], gh, gw, -1).permute(0, 3, 1, 2).contiguous()

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Attention probabilities of every block, a list of (B, heads, T, T), T = prefix + N.

        Uses the manual attention path, so it works when the model runs fused attention by default.
        """
        return self._encode(x, with_attention=True).attention

    def forward_with_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and the attention maps of every block, in one pass."""
        logits, maps, _ = self.forward_with_all_attention(x)
        return logits, maps

    def forward_with_all_attention(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:
        """Logits, the attention maps of every block and, for global_pool 'map', the pool's probe attention
        over the patch tokens (B, heads, 1, N) (else None), in one pass by the manual attention path."""
        enc = self._encode(x, with_attention=True)
        tokens = self.norm(enc.tokens)
        if self.cfg.global_pool != "map":
            return self.forward_head(tokens), enc.attention, None
        pooled, probe = self.attn_pool.forward_with_attention(tokens[:, self.num_prefix_tokens :])
        return self._head(pooled), enc.attention, probe

    def no_weight_decay(self) -> set[str]:
        """Parameters that recipes exclude from weight decay (besides biases and norms)."""
        return {"pos_embed", "cls_token", "reg_token"}

    def extra_repr(self) -> str:
        c = self.cfg
        return f"img_size={c.img_size}, patch_size={c.patch_size}, embed_dim={c.embed_dim}, depth={c.depth}"


def _describe(x: torch.Tensor) -> str:
    """A tensor's shape and dtype, as the input errors name them."""
    return f"shape {tuple(x.shape)} dtype {str(x.dtype).replace('torch.', '')}"


def _tracing() -> bool:
    return torch.jit.is_tracing() or torch.compiler.is_compiling()


def _exporting() -> bool:
    """Traced (torch.jit, ONNX) or exported (torch.export); torch.compile, which checkpoints, is not."""
    return torch.jit.is_tracing() or torch.compiler.is_exporting()


def _make_blocks(cfg: ViTConfig) -> nn.ModuleList:
    """The encoder's ``depth`` blocks, stochastic depth rising linearly from 0 to ``drop_path_rate``."""
    dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
    return nn.ModuleList(
        Block(
            cfg.embed_dim,
            cfg.num_heads,
            cfg.mlp_hidden,
            qkv_bias=cfg.qkv_bias,
            act=cfg.act,
            drop=cfg.drop_rate,
            attn_drop=cfg.attn_drop_rate,
            drop_path=dpr[i],
            norm=cfg.norm,
            eps=cfg.norm_eps,
            fused_attn=cfg.attn_impl == "fused",
            layer_scale=cfg.layer_scale,
            qk_norm=cfg.qk_norm,
        )
        for i in range(cfg.depth)
    )


# ------------------------------------------------------------------------------------------ init
# Per-module initialisers: ``VisionTransformer.init_weights`` calls one with every (name, module) of
# ``named_modules()``; ``name`` is the module's name in the model, e.g. 'blocks.0.mlp.fc1'.


def init_jax(module: nn.Module, name: str) -> None:
    """The paper's init (big_vision): xavier-uniform Linear weights, a LeCun-normal pre-logits layer, a
    zero head; zero biases, but normal(std 1e-6) in the MLPs."""
    if isinstance(module, nn.Linear):
        if name == "head":
            nn.init.zeros_(module.weight)
        elif name == "pre_logits.fc":
            lecun_normal_(module.weight)
        else:
            nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            if ".mlp." in name:
                nn.init.normal_(module.bias, std=1e-6)
            else:
                nn.init.zeros_(module.bias)
    else:
        _init_shared(module)


def init_timm(module: nn.Module, name: str) -> None:
    """timm's init: truncated-normal (std .02) weights for every Linear, the head included; zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    else:
        _init_shared(module)


def _init_shared(module: nn.Module) -> None:
    """What both inits do alike: LayerNorm starts as the identity; the stems (patch projection, conv
    stem), LayerScale and the attention-pooling probe run their own init."""
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, (PatchEmbed, ConvStem, LayerScale, AttentionPool)):
        module.init_weights()


_INITS = {"jax": init_jax, "timm": init_timm}


def count_params(model: nn.Module, trainable: bool = False) -> int:
    """The number of parameters of ``model`` (only those that require gradients with ``trainable``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)


__all__ = ["VisionTransformer", "Encoded", "init_jax", "init_timm", "count_params"]
