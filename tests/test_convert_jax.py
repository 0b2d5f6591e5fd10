"""JAX .npz checkpoints (vit_jax and big_vision naming, scan checkpoints), without JAX.

Each test writes an .npz from known random arrays, loads it with vitkit, and checks (a) the loaded
tensors against the arrays written and (b) the logits against a pure-numpy ViT forward computed from
the arrays directly, in float64, with the JAX layouts ((D, H, hd) kernels, HWIO conv): max abs
difference <= 1e-5 in float32, so that every transpose is checked.
"""

import math

import numpy as np
import pytest
import torch
from helpers import assert_same_logits

from vitkit.core.errors import CheckpointError
from vitkit.io.convert import convert, from_jax

TOL = 1e-5
BLOCK = {  # sub-module names inside an encoder block, as each codebase names them
    "vit_jax": ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"),
    "big_vision": ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"),
}


def make_npz(naming="vit_jax", D=32, H=2, depth=2, P=8, C=3, img=(32, 32), mlp=64, classes=5, cls=True,
             qkv_bias=True, rep=None, pos="learn", map_head=False, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def n(*shape):
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    def one(*shape):
        return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)

    N = (img[0] // P) * (img[1] // P)
    hd = D // H
    a = {"embedding/kernel": n(P, P, C, D), "embedding/bias": n(D)}
    if cls:
        a["cls"] = n(1, 1, D)
    if pos == "learn":
        if naming == "vit_jax":
            a["Transformer/posembed_input/pos_embedding"] = n(1, N + int(cls), D)
        else:
            a["pos_embedding"] = n(1, N, D)
    ln1, att, ln2, mlpb = BLOCK[naming]
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}/"
        a[f"{b}{ln1}/scale"], a[f"{b}{ln1}/bias"] = one(D), n(D)
        for x in ("query", "key", "value"):
            a[f"{b}{att}/{x}/kernel"] = n(D, H, hd)
            if qkv_bias:
                a[f"{b}{att}/{x}/bias"] = n(H, hd)
        a[f"{b}{att}/out/kernel"], a[f"{b}{att}/out/bias"] = n(H, hd, D), n(D)
        a[f"{b}{ln2}/scale"], a[f"{b}{ln2}/bias"] = one(D), n(D)
        a[f"{b}{mlpb}/Dense_0/kernel"], a[f"{b}{mlpb}/Dense_0/bias"] = n(D, mlp), n(mlp)
        a[f"{b}{mlpb}/Dense_1/kernel"], a[f"{b}{mlpb}/Dense_1/bias"] = n(mlp, D), n(D)
    a["Transformer/encoder_norm/scale"], a["Transformer/encoder_norm/bias"] = one(D), n(D)
    if map_head:  # big_vision's MAPHead: a probe's attention over the tokens, then LayerNorm + MLP residual
        h = "MAPHead_0/"
        a[f"{h}probe"] = n(1, 1, D)
        for x in ("query", "key", "value"):
            a[f"{h}MultiHeadDotProductAttention_0/{x}/kernel"] = n(D, H, hd)
            a[f"{h}MultiHeadDotProductAttention_0/{x}/bias"] = n(H, hd)
        a[f"{h}MultiHeadDotProductAttention_0/out/kernel"] = n(H, hd, D)
        a[f"{h}MultiHeadDotProductAttention_0/out/bias"] = n(D)
        a[f"{h}LayerNorm_0/scale"], a[f"{h}LayerNorm_0/bias"] = one(D), n(D)
        a[f"{h}MlpBlock_0/Dense_0/kernel"], a[f"{h}MlpBlock_0/Dense_0/bias"] = n(D, mlp), n(mlp)
        a[f"{h}MlpBlock_0/Dense_1/kernel"], a[f"{h}MlpBlock_0/Dense_1/bias"] = n(mlp, D), n(D)
    width = D
    if rep:
        a["pre_logits/kernel"], a["pre_logits/bias"] = n(D, rep), n(rep)
        width = rep
    if classes:
        a["head/kernel"], a["head/bias"] = n(width, classes), n(classes)
    return a


def scanned(a: dict, depth: int) -> dict:
    """The same arrays as a scan checkpoint: blocks stacked under Transformer/encoderblock/."""
    out = {k: v for k, v in a.items() if not k.startswith("Transformer/encoderblock_")}
    for k in [k for k in a if k.startswith("Transformer/encoderblock_0/")]:
        rest = k[len("Transformer/encoderblock_0/"):]
        out[f"Transformer/encoderblock/{rest}"] = np.stack([a[f"Transformer/encoderblock_{i}/{rest}"] for i in range(depth)])
    return out


# ----------------------------------------------------------------------------- numpy reference
def _ln(x, p, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu(x, approximate):
    if approximate:  # flax's nn.gelu default
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _sincos2d(gh, gw, D):
    y, x = np.mgrid[:gh, :gw]
    omega = 1.0 / 10000 ** (np.arange(D // 4) / (D // 4 - 1))
    y = y.reshape(-1)[:, None] * omega[None]
    x = x.reshape(-1)[:, None] * omega[None]
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)[None]


def np_forward(a: dict, images: np.ndarray, naming: str, approximate_gelu: bool = True) -> np.ndarray:
    """ViT forward from JAX-layout arrays: images (B, H, W, C) -> logits, in float64."""
    a = {k: v.astype(np.float64) for k, v in a.items()}
    sub = lambda prefix: {k[len(prefix):]: v for k, v in a.items() if k.startswith(prefix)}  # noqa: E731
    K = a["embedding/kernel"]
    P, _, C, D = K.shape
    B, Hi, Wi, _ = images.shape
    gh, gw = Hi // P, Wi // P
    patches = images.reshape(B, gh, P, gw, P, C).transpose(0, 1, 3, 2, 4, 5).reshape(B, gh * gw, P * P * C)
    x = patches @ K.reshape(P * P * C, D) + a["embedding/bias"]  # (B, N, D)
    cls = np.broadcast_to(a["cls"], (B, 1, D)) if "cls" in a else None
    if naming == "vit_jax":
        if cls is not None:
            x = np.concatenate([cls, x], axis=1)
        x = x + a["Transformer/posembed_input/pos_embedding"]
    else:  # big_vision: position embeddings on the patches, then the class token
        x = x + (a["pos_embedding"] if "pos_embedding" in a else _sincos2d(gh, gw, D))
        if cls is not None:
            x = np.concatenate([cls, x], axis=1)
    ln1, att, ln2, mlpb = BLOCK[naming]
    i = 0
    while f"Transformer/encoderblock_{i}/{ln1}/scale" in a:
        blk = sub(f"Transformer/encoderblock_{i}/")
        y = _ln(x, sub_of(blk, ln1))
        x = x + _mha(y, y, sub_of(blk, att))
        x = x + _mlp(_ln(x, sub_of(blk, ln2)), sub_of(blk, mlpb), approximate_gelu)
        i += 1
    x = _ln(x, sub("Transformer/encoder_norm/"))
    if "MAPHead_0/probe" in a:  # the probe attends over every token; LayerNorm + MLP on a residual branch
        h = sub("MAPHead_0/")
        y = _mha(np.broadcast_to(h["probe"], (B, 1, D)), x, sub_of(h, "MultiHeadDotProductAttention_0"))
        x = (y + _mlp(_ln(y, sub_of(h, "LayerNorm_0")), sub_of(h, "MlpBlock_0"), approximate_gelu))[:, 0]
    else:
        x = x[:, 0] if cls is not None else x.mean(axis=1)
    if "pre_logits/kernel" in a:
        x = np.tanh(x @ a["pre_logits/kernel"] + a["pre_logits/bias"])
    return x @ a["head/kernel"] + a["head/bias"]


def _mha(xq: np.ndarray, xkv: np.ndarray, at: dict) -> np.ndarray:
    """flax's MultiHeadDotProductAttention: queries from ``xq``, keys and values from ``xkv``, (D, H, hd)
    kernels, the (H, hd, D) output kernel."""
    q = np.einsum("btd,dhk->bthk", xq, at["query/kernel"]) + at.get("query/bias", 0.0)
    k, v = (np.einsum("btd,dhk->bthk", xkv, at[f"{n}/kernel"]) + at.get(f"{n}/bias", 0.0) for n in ("key", "value"))
    logits = np.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1])
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    o = np.einsum("bhqs,bshk->bqhk", w, v)
    return np.einsum("bqhk,hkd->bqd", o, at["out/kernel"]) + at["out/bias"]


def _mlp(y: np.ndarray, m: dict, approximate_gelu: bool) -> np.ndarray:
    h = _gelu(y @ m["Dense_0/kernel"] + m["Dense_0/bias"], approximate_gelu)
    return h @ m["Dense_1/kernel"] + m["Dense_1/bias"]


def sub_of(d: dict, name: str) -> dict:
    return {k[len(name) + 1:]: v for k, v in d.items() if k.startswith(name + "/")}


def check(model, a, naming, img=(32, 32), C=3, approximate_gelu=True):
    imgs = np.random.default_rng(7).standard_normal((2, *img, C)).astype(np.float32)
    ref = torch.from_numpy(np_forward(a, imgs, naming, approximate_gelu))  # float64
    return assert_same_logits(lambda x: model(x).double(), ref, torch.from_numpy(imgs).permute(0, 3, 1, 2), tol=TOL)


def save(tmp_path, a, name="w.npz"):
    np.savez(tmp_path / name, **a)
    return tmp_path / name


# ---------------------------------------------------------------------------------------- tests
def test_vit_jax_weights_land_transposed(tmp_path):
    a = make_npz("vit_jax", D=32, H=2)
    model = from_jax(save(tmp_path, a))
    b = "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/"
    q, k, v = (torch.from_numpy(a[f"{b}{n}/kernel"]).reshape(32, 32).T for n in ("query", "key", "value"))
    assert torch.equal(model.blocks[1].attn.qkv.weight, torch.cat([q, k, v]))
    assert torch.equal(model.blocks[1].attn.proj.weight, torch.from_numpy(a[f"{b}out/kernel"]).reshape(32, 32).T)
    assert torch.equal(model.patch_embed.proj.weight, torch.from_numpy(a["embedding/kernel"]).permute(3, 2, 0, 1))
    fc2 = a["Transformer/encoderblock_0/MlpBlock_3/Dense_1/kernel"]
    assert torch.equal(model.blocks[0].mlp.fc2.weight, torch.from_numpy(fc2).T)
    assert torch.equal(model.head.weight, torch.from_numpy(a["head/kernel"]).T)
    c = model.cfg
    assert (c.embed_dim, c.depth, c.num_heads, c.patch_size, c.img_size, c.num_classes) == (32, 2, 2, 8, (32, 32), 5)
    assert (c.act, c.norm_eps, c.global_pool, c.no_embed_class) == ("gelu_tanh", 1e-6, "token", False)
    check(model, a, "vit_jax")


@pytest.mark.parametrize("kw", [
    dict(naming="vit_jax", cls=False, P=4, classes=7),  # 'gap' classifier: no class token, mean of tokens
    dict(naming="vit_jax", rep=24, qkv_bias=False, D=48, H=3),  # in21k pre-logits, no q/k/v bias
    dict(naming="big_vision", D=32, H=4),  # patch-only position table, class token after it
    dict(naming="big_vision", cls=False, pos="sincos2d", D=32, H=2),  # fixed table, 'gap' pooling
])
def test_forward_matches_numpy_reference(kw, tmp_path):
    a = make_npz(**kw)
    sets = {"img_size": 32} if kw.get("pos") == "sincos2d" else None
    model = from_jax(save(tmp_path, a), overrides=sets)
    assert model.cfg.representation_size == kw.get("rep")
    assert model.cfg.qkv_bias == kw.get("qkv_bias", True)
    if kw["naming"] == "big_vision":
        assert model.cfg.no_embed_class == kw.get("cls", True)
        assert model.cfg.pos_embed == ("sincos2d" if kw.get("pos") == "sincos2d" else "learn")
    check(model, a, kw["naming"])


@pytest.mark.parametrize("pos", ["learn", "sincos2d"])
def test_map_head(pos, tmp_path):
    """big_vision's attention-pooling head (classifier='map', no class token): the probe attends over the
    patch tokens, then a LayerNorm + MLP residual branch."""
    a = make_npz("big_vision", D=32, H=4, cls=False, pos=pos, map_head=True)
    model = from_jax(save(tmp_path, a), overrides={"img_size": 32} if pos == "sincos2d" else None)
    assert (model.cfg.global_pool, model.cfg.class_token, model.cfg.num_heads) == ("map", False, 4)
    h = "MAPHead_0/MultiHeadDotProductAttention_0/"
    assert torch.equal(model.attn_pool.latent, torch.from_numpy(a["MAPHead_0/probe"]))
    k, v = (torch.from_numpy(a[f"{h}{n}/kernel"]).reshape(32, 32).T for n in ("key", "value"))
    assert torch.equal(model.attn_pool.kv.weight, torch.cat([k, v]))
    assert torch.equal(model.attn_pool.proj.weight, torch.from_numpy(a[f"{h}out/kernel"]).reshape(32, 32).T)
    check(model, a, "big_vision")


def test_non_square_grey_and_exact_gelu(tmp_path):
    a = make_npz("vit_jax", C=1, img=(16, 40), P=8, classes=3)
    path = save(tmp_path, a)
    with pytest.raises(CheckpointError, match=r"the position table's 11 positions are no square grid; pass the image"):
        from_jax(path)
    model = from_jax(path, overrides={"img_size": [16, 40], "act": "gelu"})
    check(model, a, "vit_jax", img=(16, 40), C=1, approximate_gelu=False)


@pytest.mark.parametrize("naming", ["vit_jax", "big_vision"])
def test_scan_checkpoint_equals_unrolled(naming, tmp_path):
    a = make_npz(naming, depth=3)
    unrolled = from_jax(save(tmp_path, a, "u.npz"))
    scan = from_jax(save(tmp_path, scanned(a, 3), "s.npz"))
    assert scan.cfg == unrolled.cfg
    for (k, v), (k2, v2) in zip(unrolled.state_dict().items(), scan.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    check(scan, a, naming)


def test_params_prefix_and_optimizer_state(tmp_path):
    a = make_npz("big_vision")
    wrapped = {f"opt/target/{k}": v for k, v in a.items()}
    wrapped["opt/state/step"] = np.array(3)
    model = from_jax(save(tmp_path, wrapped))
    check(model, a, "big_vision")


def test_errors_name_keys_and_shapes(tmp_path):
    a = make_npz("vit_jax")
    del a["Transformer/encoderblock_1/LayerNorm_2/bias"]
    a["MAPHead_0/probe"] = np.zeros((1, 1, 32), np.float32)
    a["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"] = np.zeros((64, 32), np.float32)  # transposed
    with pytest.raises(CheckpointError) as e:
        from_jax(save(tmp_path, a))
    msg = str(e.value)
    assert "\n" not in msg
    assert "missing: Transformer/encoderblock_1/LayerNorm_2/bias" in msg
    assert "unexpected: MAPHead_0/probe" in msg
    assert "mis-shaped: Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel (64, 32) -> blocks.0.mlp.fc1.weight" in msg


def test_refuses_pickles_and_other_files(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with open(tmp_path / "obj.npz", "wb") as f:  # an npz holding an object array (a pickle)
        import zipfile

        with zipfile.ZipFile(f, "w") as z:
            z.write(tmp_path / "obj.npy", "embedding/kernel.npy")
    with pytest.raises(CheckpointError, match=r"obj\.npz: not a readable \.npz file \(Object arrays cannot be loaded"):
        from_jax(tmp_path / "obj.npz")
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(CheckpointError, match=r"other\.npz: not a ViT \.npz checkpoint \(no embedding/kernel"):
        from_jax(tmp_path / "other.npz")


def test_convert_jax_to_vitkit_checkpoint_at_new_resolution(tmp_path):
    import vitkit
    from vitkit.model.layers import resample_pos_embed

    a = make_npz("vit_jax")
    report = convert(save(tmp_path, a), tmp_path / "ckpt", "jax", img_size=48)
    model = vitkit.load(tmp_path / "ckpt")
    assert model.cfg.img_size == (48, 48) and report["resampled"]["to"] == [48, 48]
    pe = torch.from_numpy(a["Transformer/posembed_input/pos_embedding"])
    assert torch.allclose(model.pos_embed, resample_pos_embed(pe, (6, 6), (4, 4), 1), atol=0)
    assert report["assumed"] == {"norm_eps": 1e-6, "act": "gelu_tanh"}


def test_cli_jax_straight_to_hf(tmp_path, capsys):
    import json

    from vitkit.cli.main import main
    from vitkit.io.convert import from_hf

    a = make_npz("big_vision", D=32, H=4)
    assert main(["convert", str(save(tmp_path, a)), str(tmp_path / "hf"), "--from", "jax", "--to", "hf"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["hidden_act"] == "gelu_pytorch_tanh"
    assert "not in the weights, assumed: norm_eps=1e-06, act=gelu_tanh" in capsys.readouterr().out
    check(from_hf(tmp_path / "hf"), a, "big_vision")  # the patch-only table went in with a zero class slot
