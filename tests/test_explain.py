"""explain: rollout against a hand computation, class-token maps, non-square inputs, PNG, errors."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.explain import attention_rollout, colormap, explain

from helpers import noise_image, tiny_model


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
