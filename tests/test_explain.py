"""explain: rollout and gradient-weighted rollout against hand computations, class-token maps, register
tokens left out, class maps on a quickly trained digits model (two classes differ; a deletion check),
--class, non-square inputs, PNG, errors."""

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import noise_image, tiny_model
from PIL import Image

import vitkit
from vitkit.cli.main import main
from vitkit.tools.explain import TokenLayout, attention_rollout, class_relevance, colormap, explain, gradient_rollout

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(tmp_path, name="ckpt", **over):
    return vitkit.save(tiny_model(init="timm", labels=[f"c{i}" for i in range(10)], **over), tmp_path / name)


@pytest.fixture()
def image(tmp_path):
    p = tmp_path / "img.png"
    noise_image(40, 60).save(p)
    return p


def test_rollout_equals_the_product_written_out():
    g = torch.Generator().manual_seed(0)
    maps = [torch.rand(1, 3, 5, 5, generator=g).softmax(-1) for _ in range(3)]
    expect = np.eye(5)
    for a in maps:
        m = a[0].double().mean(0).numpy() + np.eye(5)  # mean over heads, + identity
        m = m / m.sum(-1, keepdims=True)
        expect = m @ expect
    got = attention_rollout(maps, "mean")[0].numpy()
    np.testing.assert_allclose(got, expect, atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)  # rows stay distributions
    # max fusion and discarding the weakest half change the result but keep rows normalised
    other = attention_rollout(maps, "max", discard_ratio=0.5)[0].numpy()
    assert not np.allclose(other, got) and np.allclose(other.sum(-1), 1.0, atol=1e-6)


def test_maps_come_from_the_model_and_fused_attention_stays_default(tmp_path, image):
    ckpt = _model(tmp_path)
    res = explain(ckpt, image, method="both")
    assert res["grid"] == [4, 4] and res["rollout"].shape == (4, 4) and res["cls"].shape == (4, 4)
    model = vitkit.load(ckpt)
    from vitkit.data import decode_image, to_model_input

    x = to_model_input(decode_image(image, 3), (32, 32), model.preprocess)[None]
    maps = model.attention_maps(x)
    np.testing.assert_allclose(res["cls"].ravel(), maps[-1].mean(1)[0, 0, 1:].numpy(), atol=1e-6)
    np.testing.assert_allclose(res["rollout"].ravel(), attention_rollout(maps)[0, 0, 1:].numpy(), atol=1e-6)
    assert all(blk.attn.fused for blk in model.blocks)  # explaining did not switch the model's path
    with torch.no_grad():
        assert res["pred"]["index"] == int(model(x).argmax())


def test_non_square_image_on_a_dynamic_model_keeps_its_aspect(tmp_path, image):
    ckpt = _model(tmp_path, dynamic_img_size=True)
    out = tmp_path / "attn.png"
    res = explain(ckpt, image, out=out)  # 40x60 image: short side 32 -> 32x48 input
    assert res["input_size"] == [32, 48] and res["grid"] == [4, 6] and res["rollout"].shape == (4, 6)
    with Image.open(out) as im:
        assert im.format == "PNG" and im.width > im.height
    # a fixed-size model asked for another size runs on a resampled copy
    res = explain(_model(tmp_path, "fixed"), image, img_size=(24, 40))
    assert res["grid"] == [3, 5]


def test_model_without_class_token_uses_the_mean_over_tokens(tmp_path, image):
    ckpt = _model(tmp_path, class_token=False, global_pool="avg")
    res = explain(ckpt, image, method="cls")
    assert res["rollout"] is None and res["cls"].shape == (4, 4)
    assert "no class token" in res["note"]
    np.testing.assert_allclose(res["cls"].sum(), 1.0, atol=1e-5)  # mean of rows that sum to 1


def test_colormap_is_dark_to_bright():
    c = colormap(np.array([[0.0, 0.5, 1.0]]))
    assert c.dtype == np.uint8 and c.shape == (1, 3, 3)
    assert c[0, 0].sum() < c[0, 1].sum() < c[0, 2].sum()


def test_cli_and_errors(tmp_path, image, capsys):
    ckpt = _model(tmp_path)
    out = tmp_path / "e.png"
    assert main(["explain", str(ckpt), str(image), "--out", str(out), "--method", "rollout", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["cls"] is None and np.array(res["rollout"]).shape == (4, 4) and out.is_file()

    bad = tmp_path / "bad.png"
    bad.write_bytes(b"nope")
    assert main(["explain", str(ckpt), str(bad), "--out", str(out)]) == 1
    assert f"vitkit: error: {bad}: " in capsys.readouterr().err
    with pytest.raises(vitkit.ConfigError, match=r"--head-fusion: 'median' is not one of mean, max, min"):
        explain(ckpt, image, head_fusion="median")
    with pytest.raises(vitkit.ConfigError, match=r"--img-size: 30x30 is not a multiple of the patch size 8"):
        explain(ckpt, image, img_size=30)
    with pytest.raises(SystemExit) as e:
        main(["explain", str(ckpt), str(image), "--out", str(out), "--method", "gradcam"])
    assert e.value.code == 2


# ------------------------------------------------------------------------------------ class maps
def test_gradient_rollout_equals_the_rule_written_out():
    g = torch.Generator().manual_seed(0)
    maps = [torch.rand(1, 3, 5, 5, generator=g).softmax(-1) for _ in range(3)]
    grads = [torch.randn(1, 3, 5, 5, generator=g) for _ in range(3)]
    expect = np.eye(5)
    for a, d in zip(maps, grads):
        a_bar = np.clip(a[0].double().numpy() * d[0].double().numpy(), 0, None).mean(0)  # heads' mean of (dA A)+
        expect = expect + a_bar @ expect
    np.testing.assert_allclose(gradient_rollout(maps, grads)[0].numpy(), expect, rtol=1e-6)


def _layout(class_token: bool, registers: int, tokens: int) -> TokenLayout:
    model = SimpleNamespace(cfg=SimpleNamespace(class_token=class_token), num_reg_tokens=registers)
    return TokenLayout.of(model, tokens)


@pytest.mark.parametrize("class_token", [True, False])
def test_register_tokens_are_never_read(class_token):
    """Token order [cls, registers, patches]: with the register rows and columns NaN, every readout is finite."""
    lay = _layout(class_token, 2, (1 if class_token else 0) + 2 + 4)
    cls, T = lay.class_tokens, lay.prefix + 4
    assert (lay.registers, lay.patches, lay.prefix) == (2, 4, cls + 2)
    mat = torch.arange(T * T, dtype=torch.float32).reshape(1, T, T)
    mat[:, cls : cls + 2, :] = mat[:, :, cls : cls + 2] = float("nan")
    np.testing.assert_array_equal(lay.patch_rows(mat), mat[:, -4:, -4:].mean(1))
    if class_token:
        np.testing.assert_array_equal(lay.class_row(mat), mat[:, 0, -4:])
    else:
        with pytest.raises(vitkit.ShapeError, match="no class token"):
            lay.class_row(mat)
    assert torch.isfinite(lay.agnostic_row(mat)).all()


def _registers_or_skip(n: int) -> dict:
    """The config fields of ``n`` register tokens; skips where the model has none to offer."""
    if n and "reg_tokens" not in {f.name for f in dataclasses.fields(vitkit.ViTConfig)}:
        pytest.skip("this model has no register tokens")
    return {"reg_tokens": n} if n else {}


def test_registers_are_left_out_of_the_attention_maps(tmp_path, image):
    ckpt = _model(tmp_path, head_std=0.5, **_registers_or_skip(3))
    res = explain(ckpt, image, method="all")
    assert all(res[k].shape == (4, 4) for k in ("rollout", "cls", "grad"))
    model = vitkit.load(ckpt)
    from vitkit.data import decode_image, to_model_input

    maps = model.attention_maps(to_model_input(decode_image(image, 3), (32, 32), model.preprocess)[None])
    np.testing.assert_allclose(res["rollout"].ravel(), attention_rollout(maps)[0, 0, 4:].numpy(), atol=1e-6)
    np.testing.assert_allclose(res["cls"].ravel(), maps[-1].mean(1)[0, 0, 4:].numpy(), atol=1e-6)


@pytest.mark.parametrize("registers", [0, 2])
@pytest.mark.parametrize("pool", ["token", "avg"])
def test_class_map_is_read_the_way_the_model_pools(pool, registers):
    model = tiny_model(init="timm", head_std=0.5, class_token=pool == "token", global_pool=pool,
                       **_registers_or_skip(registers))
    x = torch.randn(2, 3, 32, 32)
    rel, logits = class_relevance(model, x, target=4)
    with torch.enable_grad():
        out, maps = model.forward_with_attention(x)
        grads = torch.autograd.grad(out[:, 4].sum(), maps)
    r = gradient_rollout([m.detach() for m in maps], grads)
    first = int(pool == "token") + registers  # the first patch token: [cls], registers, patches
    # the [cls] row, or the mean of the patch rows; over the patches
    expect = r[:, 0, first:] if pool == "token" else r[:, first:, first:].mean(1)
    torch.testing.assert_close(rel, expect)
    torch.testing.assert_close(logits, out.detach())
    assert not any(p.grad is not None for p in model.parameters())  # the weights were left alone


def test_attention_pooled_model_is_read_through_its_probe():
    try:
        model = tiny_model(init="timm", head_std=0.5, class_token=False, global_pool="map")
    except vitkit.ConfigError:
        pytest.skip("this model has no attention pooling")
    x = torch.randn(2, 3, 32, 32)
    rel, logits = class_relevance(model, x, target=1)
    assert rel.shape == (2, 16) and torch.isfinite(rel).all() and rel.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(logits, model(x))  # the pool computed with its attention gives the same logits
    assert not model.attn_pool._forward_hooks  # and is left as it was
    other, _ = class_relevance(model, x, target=2)
    assert not torch.allclose(rel, other)


# ------------------------------------------------------- a quickly trained digits model (the demo's)
DEMO_MODEL = "vit_hybrid_mini_patch4_28"  # `vitkit train`'s model: conv stem, 7x7 grid, average pooling


@pytest.fixture(scope="module")
def digits_model():
    """The demo's model trained for 250 steps of 32 on 4000 built-in digits (about 92% test accuracy),
    seeded, on one thread; with 64 test digits as uint8 images, prepared as the model takes them."""
    from vitkit.data import open_dataset

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        splits = open_dataset(None)
        model = vitkit.create_model(DEMO_MODEL, seed=0)
        pre = model.preprocess
        prepare = lambda u8: (u8.float() / 255 - pre.mean[0]) / pre.std[0]  # noqa: E731 - 28x28 already
        x, y = prepare(splits.train.images[:4000]), splits.train.labels[:4000]
        steps, g = 250, torch.Generator().manual_seed(0)
        opt = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=4e-3, total_steps=steps, pct_start=0.1)
        model.train()
        for _ in range(steps):
            idx = torch.randint(0, len(x), (32,), generator=g)
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        yield model, splits.test.images[:64], prepare(splits.test.images[:64])
    finally:
        torch.set_num_threads(threads)


def _deletion_aucs(model, x, orders, cls, patch=4, chunk=7) -> torch.Tensor:
    """Areas under deletion curves: the mean logit of class ``cls`` as the patches of each order (K, N)
    are blacked out ``chunk`` at a time, from none to all; one image x (C, H, W) -> (K,)."""
    gh, gw = x.shape[1] // patch, x.shape[2] // patch
    black = (0.0 - model.preprocess.mean[0]) / model.preprocess.std[0]  # a black pixel as the model sees it
    ks = range(0, gh * gw + 1, chunk)
    keep = torch.ones(len(orders), len(ks), gh * gw)
    for j, k in enumerate(ks):
        keep[torch.arange(len(orders))[:, None], j, orders[:, :k]] = 0
    mask = keep.reshape(-1, 1, gh, gw).repeat_interleave(patch, 2).repeat_interleave(patch, 3)
    with torch.no_grad():
        logits = model(x * mask + black * (1 - mask))[:, cls]
    return logits.reshape(len(orders), len(ks)).mean(1)


def test_deleting_the_most_relevant_patches_first_lowers_the_score_fastest(digits_model):
    """Deletion check (Petsiuk et al. 2018): blacking out patches in the grad map's order lowers the
    predicted class's score faster than in random orders, and the reverse order slower."""
    model, _, x = digits_model
    rel, logits = class_relevance(model, x)
    pred = logits.argmax(-1)
    g = torch.Generator().manual_seed(1)
    aucs = []
    for i in range(len(x)):
        order = rel[i].argsort(descending=True)
        randoms = torch.stack([torch.randperm(49, generator=g) for _ in range(4)])
        aucs.append(_deletion_aucs(model, x[i], torch.cat([order[None], order.flip(0)[None], randoms]), pred[i]))
    aucs = torch.stack(aucs)
    first, last, rand = aucs[:, 0].mean().item(), aucs[:, 1].mean().item(), aucs[:, 2:].mean().item()
    assert first < 0.85 * rand and last > rand, (first, rand, last)


def test_maps_of_two_classes_differ_where_both_are_likely(digits_model):
    model, images, x = digits_model
    with torch.no_grad():
        probs = model(x).softmax(-1)
    top2 = probs.topk(2, dim=-1)
    i = int(top2.values[:, 1].argmax())  # the test digit whose runner-up class is the most likely
    a, b = top2.indices[i].tolist()
    assert top2.values[i, 1] > 0.1  # both classes have probability
    ra = explain(model, images[i], method="grad", target=a)
    rb = explain(model, images[i], method="grad", target=str(b))
    assert ra["target"]["index"] == a and rb["target"]["index"] == b == int(rb["target"]["label"])
    ma, mb = ra["grad"].ravel() - ra["grad"].mean(), rb["grad"].ravel() - rb["grad"].mean()
    cosine = float(ma @ mb / (np.linalg.norm(ma) * np.linalg.norm(mb)))
    assert cosine < 0.9, cosine
    assert explain(model, images[i], method="grad")["target"]["index"] == a  # default: the predicted class


# --------------------------------------------------------------------------------------- --class
def test_class_by_name_or_index_and_default(tmp_path, image, capsys):
    ckpt = _model(tmp_path, head_std=0.5)
    res = explain(ckpt, image)  # method 'all': rollout, cls and grad for the predicted class
    assert res["method"] == "all" and res["target"] == res["pred"] and res["grad"].shape == (4, 4)
    by_name, by_index = explain(ckpt, image, target="c7"), explain(ckpt, image, target=7)
    assert by_name["target"]["label"] == by_index["target"]["label"] == "c7"
    np.testing.assert_array_equal(by_name["grad"], by_index["grad"])
    out = tmp_path / "e.png"
    for flag in ("c7", "7"):
        assert main(["explain", str(ckpt), str(image), "--out", str(out), "--class", flag, "--json"]) == 0
        got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert got["target"]["index"] == 7 and np.allclose(got["grad"], by_name["grad"], atol=1e-6)
    assert main(["explain", str(ckpt), str(image), "--out", str(out), "--class", "c7"]) == 0
    text = capsys.readouterr().out
    assert "  grad   : gradient-weighted rollout for class c7 (" in text and "strongest patch" in text
    with Image.open(out) as im:
        assert im.width == 6 + 4 * (256 + 6)  # four 256-pixel panels: input | rollout | cls | grad


@pytest.mark.parametrize("flag, msg", [
    ("dog", r"--class: 'dog' is neither a class name nor an index \(classes: c0, c1, c2, .*, c9\)$"),
    ("10", r"--class: index 10 is out of range: the model has 10 classes \(0\.\.9\)$"),
    ("-1", r"--class: '-1' is neither a class name nor an index"),
])
def test_bad_class_is_a_one_line_error(tmp_path, image, capsys, flag, msg):
    ckpt = _model(tmp_path)
    assert main(["explain", str(ckpt), str(image), "--out", str(tmp_path / "e.png"), "--class", flag]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("vitkit: error: --class: ")
    with pytest.raises(vitkit.ConfigError, match=msg):
        explain(ckpt, image, target=flag)


def test_class_needs_the_grad_map_and_a_class_score(tmp_path, image):
    ckpt = _model(tmp_path)
    with pytest.raises(vitkit.ConfigError, match=r"^--class: only the grad map is class-specific; --method both"):
        explain(ckpt, image, method="both", target=1)
    headless = _model(tmp_path, "headless", num_classes=0)
    res = explain(headless, image)  # 'all' leaves grad out, and says why
    assert res["grad"] is None and res["rollout"] is not None and "no grad map" in res["note"]
    with pytest.raises(vitkit.ConfigError, match=r"^--method grad: the model has no classification head"):
        explain(headless, image, method="grad")
    with pytest.raises(vitkit.ConfigError, match=r"^--class: the model has no classification head"):
        explain(headless, image, target=0)
