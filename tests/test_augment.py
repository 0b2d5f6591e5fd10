"""BatchAugment, its ops (checked against Pillow where Pillow has the op), mixing and eval_batch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance, ImageOps

import vitkit
from vitkit.core.errors import ConfigError, ShapeError
from vitkit.data import AugmentConfig, BatchAugment, eval_batch
from vitkit.data import augment as A

pytestmark = pytest.mark.usefixtures("one_thread")


PRE = vitkit.Preprocess(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _batch(b=8, c=3, h=16, w=16, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (b, c, h, w), generator=g, dtype=torch.uint8)
    return x.to(device), (torch.arange(b) % 10).to(device)


def _norm(x):
    return (x.float() / 255 - 0.5) / 0.5


ALL = dict(crop="rrc", auto="randaugment", mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, erase_prob=0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [{}, dict(crop="pad", hflip=0.0), dict(crop="none", auto="trivialaugment"), ALL])
def test_shapes_dtypes_and_determinism(device, cfg):
    x, y = _batch(device=device, h=12, w=20)
    aug = BatchAugment(AugmentConfig(**cfg), (16, 16), PRE, 10)
    out1, t1 = aug(x, y, torch.Generator(device).manual_seed(5))
    out2, t2 = aug(x, y, torch.Generator(device).manual_seed(5))
    out3, _ = aug(x, y, torch.Generator(device).manual_seed(6))
    assert out1.shape == (8, 3, 16, 16) and out1.dtype == torch.float32 and out1.device.type == device
    assert torch.equal(out1, out2) and torch.equal(t1, t2)  # the generator fully determines the batch
    assert not torch.equal(out1, out3)
    if cfg is ALL:
        assert t1.shape == (8, 10) and t1.dtype == torch.float32
        torch.testing.assert_close(t1.sum(1), torch.ones(8, device=device), atol=1e-5, rtol=0)
    else:
        assert torch.equal(t1, y)


def test_full_crop_without_flip_is_plain_normalisation():
    x, y = _batch()
    aug = BatchAugment(AugmentConfig(rrc_scale=(1.0, 1.0), rrc_ratio=(1.0, 1.0), hflip=0.0), (16, 16), PRE, 10)
    out, _ = aug(x, y, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, _norm(x), atol=1e-4, rtol=0)
    aug = BatchAugment(AugmentConfig(rrc_scale=(1.0, 1.0), rrc_ratio=(1.0, 1.0), hflip=1.0), (16, 16), PRE, 10)
    out, _ = aug(x, y, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, _norm(x.flip(-1)), atol=1e-4, rtol=0)


def test_rrc_boxes_respect_scale_and_ratio():
    g = torch.Generator().manual_seed(1)
    boxes = A.rrc_boxes(4000, 32, 48, (0.2, 0.6), (0.5, 2.0), g, "cpu")
    x0, y0, cw, ch = boxes.unbind(1)
    area = cw * ch / (32 * 48)
    assert float(area.min()) >= 0.2 - 1e-5 and float(area.max()) <= 0.6 + 1e-5
    assert float((cw / ch).min()) >= 0.5 - 1e-5 and float((cw / ch).max()) <= 2.0 + 1e-5
    assert float(x0.min()) >= 0 and float((x0 + cw).max()) <= 48 + 1e-4 and float((y0 + ch).max()) <= 32 + 1e-4


def test_crop_resize_matches_interpolate_inside_the_box():
    x = torch.rand(2, 3, 16, 16) * 255
    boxes = torch.tensor([[4.0, 4.0, 8.0, 8.0], [0.0, 8.0, 8.0, 8.0]])
    out = A.crop_resize(x, boxes, (16, 16))
    for i, (x0, y0, cw, ch) in enumerate(boxes.int().tolist()):
        ref = F.interpolate(x[i : i + 1, :, y0 : y0 + ch, x0 : x0 + cw], size=(16, 16), mode="bilinear", align_corners=False)
        # the border row/column of the output samples half a pixel outside the box
        torch.testing.assert_close(out[i, :, 1:-1, 1:-1], ref[0, :, 1:-1, 1:-1], atol=1e-3, rtol=0)


def test_affine_grid_matches_torch():
    theta = torch.randn(5, 2, 3)
    torch.testing.assert_close(A.affine_grid(theta, 7, 9), F.affine_grid(theta, [5, 1, 7, 9], align_corners=False),
                               atol=1e-6, rtol=0)


def test_pad_crop_is_a_shifted_window_of_the_padded_image():
    x = torch.rand(16, 2, 6, 5) * 255
    out = A.pad_crop(x, 2, torch.Generator().manual_seed(0))
    xp = F.pad(x, (2, 2, 2, 2))
    offsets = set()
    for i in range(16):
        hits = [(dy, dx) for dy in range(5) for dx in range(5) if torch.equal(out[i], xp[i, :, dy : dy + 6, dx : dx + 5])]
        assert hits
        offsets.add(hits[0])
    assert len(offsets) > 4
    assert torch.equal(A.pad_crop(x, 0, torch.Generator()), x)


# ------------------------------------------------------------------------------------------------
# ops against Pillow
def _pil_ref(x_u8, fn):
    return torch.stack([torch.from_numpy(np.array(fn(Image.fromarray(a.permute(1, 2, 0).numpy())))).permute(2, 0, 1)
                        for a in x_u8])


def _op(x_u8, name, m):
    fn, _ = A.OPS[name]
    mt = None if m is None else torch.full((len(x_u8),), float(m))
    return fn(x_u8.float(), mt).clamp(0, 255)


@pytest.mark.parametrize("name,m,pil,tol", [
    ("autocontrast", None, ImageOps.autocontrast, 1),
    ("equalize", None, ImageOps.equalize, 0),
    ("solarize", 100.0, lambda im: ImageOps.solarize(im, 100), 0),
    ("posterize", 3.0, lambda im: ImageOps.posterize(im, 3), 0),
    ("color", 0.6, lambda im: ImageEnhance.Color(im).enhance(1.6), 2),
    ("contrast", -0.5, lambda im: ImageEnhance.Contrast(im).enhance(0.5), 2),
    ("brightness", 0.4, lambda im: ImageEnhance.Brightness(im).enhance(1.4), 1),
    ("sharpness", 0.8, lambda im: ImageEnhance.Sharpness(im).enhance(1.8), 2),
])
def test_color_ops_match_pillow(name, m, pil, tol):
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(4, 3, 12, 12, generator=g) * 200 + 20).to(torch.uint8)  # not full range: autocontrast works
    got = _op(x, name, m)
    ref = _pil_ref(x, pil).float()
    assert float((got.round() - ref).abs().max()) <= tol


def test_geometric_ops():
    x = torch.arange(64, dtype=torch.float32).view(1, 1, 8, 8).repeat(2, 1, 1, 1)
    r = A.op_rotate(x, torch.tensor([90.0, -90.0]))
    k = 1 if torch.equal(r[0, 0], torch.rot90(x[0, 0], 1, (0, 1))) else -1
    assert torch.equal(r[0, 0], torch.rot90(x[0, 0], k, (0, 1)))  # exact: pixel centres map onto centres
    assert torch.equal(r[1, 0], torch.rot90(x[0, 0], -k, (0, 1)))  # the opposite sign turns the other way
    t = A.op_translate_x(x[:1], torch.tensor([0.25]))  # 2 of 8 pixels to the right, grey fill
    assert torch.equal(t[0, 0, :, 2:], x[0, 0, :, :-2]) and bool((t[0, 0, :, :2] == A.FILL).all())
    t = A.op_translate_y(x[:1], torch.tensor([-0.25]))
    assert torch.equal(t[0, 0, :-2], x[0, 0, 2:]) and bool((t[0, 0, -2:] == A.FILL).all())
    s = A.op_shear_x(x[:1], torch.tensor([0.0]))
    assert torch.equal(s, x[:1])


def test_auto_augment_modes_grey_and_rgb():
    for c in (1, 3):
        x, y = _batch(b=64, c=c)
        for mode in ("randaugment", "trivialaugment"):
            out = A.apply_auto(x.float(), torch.Generator().manual_seed(0), mode, 2, 9)
            assert out.shape == x.shape and float(out.min()) >= 0 and float(out.max()) <= 255
            changed = (out != x.float()).flatten(1).any(1).float().mean()
            assert 0.5 < float(changed) <= 1.0  # most images hit a non-identity op
    assert len(A.OP_NAMES) == 14


def test_randaugment_levels_as_timm_sets_them():
    f, plus = torch.tensor([27 / 30]), torch.tensor([1.0])  # timm's m9 of its 10 is 27 of vitkit's 30
    assert float(A.op_level("color", f, -plus)) == pytest.approx(-0.81)  # increasing: factor 1 -+ 0.9 f
    assert float(A.op_level("color", f, -plus, increasing=False)) == pytest.approx(0.72)  # factor 0.1 + 1.8 f
    assert float(A.op_level("posterize", f, plus, increasing=False)) == 3  # timm: int(9 / 10 * 4) bits kept
    assert float(A.op_level("solarize", f, plus, increasing=False)) == 230  # timm: int(9 / 10 * 256)
    assert float(A.op_level("rotate", f, -plus, increasing=False)) == pytest.approx(-27.0)  # the same either way
    assert A.op_level("equalize", f, plus) is None


def test_randaugment_magnitude_noise_and_op_probability():
    g = torch.Generator().manual_seed(0)
    assert torch.equal(A.ra_fractions(g, 5, 15, 0.0, "cpu"), torch.full((5,), 0.5))
    noisy = A.ra_fractions(g, 20000, 15, 3.0, "cpu")  # N(15, 3) on the 0..30 scale
    assert float(noisy.mean()) == pytest.approx(0.5, abs=0.005) and float(noisy.std()) == pytest.approx(0.1, abs=0.005)
    assert float(A.ra_fractions(g, 1000, 30, 6.0, "cpu").max()) == 1.0  # clipped to 30
    x, _ = _batch(b=400, c=3)
    x = x.float()

    def changed(**kw):
        out = A.apply_auto(x, torch.Generator().manual_seed(0), "randaugment", 1, 30, **kw)
        return float((out != x).flatten(1).any(1).float().mean())

    assert changed(prob=0.0) == 0.0  # no op applied
    assert changed() > 0.85 and 0.35 < changed(prob=0.5) < 0.6  # about half of them


# ------------------------------------------------------------------------------------------------
# erasing, mixing, targets
def test_random_erasing():
    x = torch.zeros(64, 3, 16, 16)
    assert torch.equal(A.random_erase(x, 0.0, torch.Generator()), x)
    out = A.random_erase(x, 1.0, torch.Generator().manual_seed(0))
    frac = (out != 0).any(1).flatten(1).float().mean(1)
    assert float(frac.min()) > 0.01 and float(frac.max()) < 0.40  # a box of 2..33% of the area per image
    # the erased region is one rectangle per image
    m = (out[0] != 0).any(0)
    rows, cols = m.any(1).nonzero().flatten(), m.any(0).nonzero().flatten()
    assert int(m.sum()) == len(rows) * len(cols)


def test_label_smoothing_targets():
    x, y = _batch(b=4)
    aug = BatchAugment(AugmentConfig(label_smoothing=0.1, crop="none", hflip=0), (16, 16), PRE, 5)
    _, t = aug(x, y % 5, torch.Generator().manual_seed(0))
    expect = torch.full((4, 5), 0.02)
    expect[torch.arange(4), y % 5] = 0.92
    torch.testing.assert_close(t, expect)


def test_mixup_and_cutmix():
    x, y = _batch(b=6)
    aug = BatchAugment(AugmentConfig(crop="none", hflip=0, mixup_alpha=1.0), (16, 16), PRE, 10)
    out, t = aug(x, y, torch.Generator().manual_seed(0))
    lam = aug.last_info["lam"]
    assert aug.last_info["mode"] == "mixup" and 0 < lam < 1
    torch.testing.assert_close(out, lam * _norm(x) + (1 - lam) * _norm(x.flip(0)), atol=1e-5, rtol=0)
    torch.testing.assert_close(t, lam * F.one_hot(y, 10).float() + (1 - lam) * F.one_hot(y.flip(0), 10).float())

    aug = BatchAugment(AugmentConfig(crop="none", hflip=0, cutmix_alpha=1.0), (16, 16), PRE, 10)
    out, t = aug(x, y, torch.Generator().manual_seed(1))
    lam = aug.last_info["lam"]
    assert aug.last_info["mode"] == "cutmix"
    from_other = (~torch.isclose(out, _norm(x), atol=1e-5)).any(1)[0].float().mean()  # share of pixels taken from the partner image
    assert abs(float(from_other) - (1 - lam)) < 0.02
    rows = torch.arange(6)
    torch.testing.assert_close(t[rows, y] + t[rows, y.flip(0)], torch.ones(6))
    assert t[0, y[0]].item() == pytest.approx(lam)

    aug = BatchAugment(AugmentConfig(crop="none", hflip=0, mixup_alpha=1.0, mix_prob=0.5), (16, 16), PRE, 10)
    mixed = []
    for seed in range(8):
        out, t = aug(x, y, torch.Generator().manual_seed(seed))
        mixed.append(aug.last_info["mixed"])
        if not mixed[-1]:
            assert torch.equal(t, F.one_hot(y, 10).float())  # soft targets even when this batch is not mixed
    assert 0 < sum(mixed) < 8
    aug = BatchAugment(AugmentConfig(mixup_alpha=1.0, mix_prob=0.0), (16, 16), PRE, 10)
    assert torch.equal(aug(x, y, torch.Generator())[1], y)  # mixing off: plain labels


def test_eval_batch():
    x, _ = _batch(b=2, h=16, w=16)
    torch.testing.assert_close(eval_batch(x, (16, 16), PRE), _norm(x), atol=1e-6, rtol=0)
    out = eval_batch(x, (8, 8), PRE)
    assert out.shape == (2, 3, 8, 8)
    grey = vitkit.Preprocess(mean=(0.1307,), std=(0.3081,))
    xg = torch.full((1, 1, 28, 28), 255, dtype=torch.uint8)
    torch.testing.assert_close(eval_batch(xg, (32, 32), grey), torch.full((1, 1, 32, 32), (1 - 0.1307) / 0.3081))


def test_config_and_input_errors():
    with pytest.raises(ConfigError, match=r"AugmentConfig: unknown field\(s\) 'flip'"):
        AugmentConfig.from_dict({"flip": 0.5})
    with pytest.raises(ConfigError, match=r"AugmentConfig\.crop: expected one of 'rrc', 'pad', 'none', got 'center'"):
        AugmentConfig.from_dict({"crop": "center"})
    with pytest.raises(ConfigError, match=r"AugmentConfig\.hflip: is a probability, expected 0\.\.1, got 2\.0"):
        AugmentConfig(hflip=2.0)
    with pytest.raises(ConfigError, match=r"AugmentConfig\.rrc_scale: expected 0 < min <= max <= 1, got \(0\.5, 0\.2\)"):
        AugmentConfig(rrc_scale=(0.5, 0.2))
    with pytest.raises(ConfigError, match=r"AugmentConfig\.ra_magnitude: expected an integer in 0\.\.30, got 31"):
        AugmentConfig(ra_magnitude=31)
    cfg = AugmentConfig.from_dict({"crop": "pad", "rrc_scale": [0.5, 1]})
    assert cfg.rrc_scale == (0.5, 1.0) and AugmentConfig.from_dict(cfg.to_dict()) == cfg
    aug = BatchAugment(AugmentConfig(label_smoothing=0.1), 16, PRE, 10)
    x, y = _batch()
    with pytest.raises(ShapeError, match=r"BatchAugment: expected dtype uint8 \(0\.\.255\), got torch\.float32"):
        aug(x.float(), y, torch.Generator())
    with pytest.raises(ShapeError, match=r"BatchAugment: labels must have shape \(8,\), got \(4,\)"):
        aug(x, y[:4], torch.Generator())
    with pytest.raises(ShapeError, match=r"BatchAugment: labels must be in 0\.\.9, got 0\.\.12"):
        aug(x, torch.tensor([0, 1, 2, 3, 4, 5, 6, 12]), torch.Generator())


def test_alternating_flips_flip_each_image_on_every_other_epoch():
    first = A.first_flips(1000, seed=3)
    assert torch.equal(first, A.first_flips(1000, seed=3)) and 400 < int(first.sum()) < 600  # seeded, a half
    assert not torch.equal(first, A.first_flips(1000, seed=4))
    e0, e1, e2 = (A.alternating_flips(first, e) for e in (0, 1, 2))
    assert torch.equal(e0, first) and torch.equal(e1, ~first) and torch.equal(e2, first)


def test_flips_given_to_batch_augment_replace_the_random_draw():
    x, y = _batch(b=6)
    flips = torch.tensor([True, False, False, True, True, False])
    aug = BatchAugment(AugmentConfig(crop="none", hflip=0.5, flip_mode="alternate"), (16, 16), PRE, 10)
    out, _ = aug(x, y, torch.Generator().manual_seed(0), flips)
    plain = eval_batch(x, (16, 16), PRE)
    torch.testing.assert_close(out, torch.where(flips.view(-1, 1, 1, 1), plain.flip(-1), plain))
    with pytest.raises(ConfigError, match="AugmentConfig.flip_mode: expected 'random' or 'alternate'"):
        AugmentConfig(flip_mode="sometimes")


def test_a_smaller_size_is_the_same_crop_resized_or_the_same_box_cropped_to_it():
    """Progressive resizing: ``size`` gives the batch at another side. Pad-and-crop draws the same crops and
    flips, then resizes them (bilinear, antialiased); 'rrc' crops the same boxes to the size directly."""
    x, y = _batch(h=16, w=16)
    pad = BatchAugment(AugmentConfig(crop="pad", pad=2, hflip=0.5), (16, 16), PRE, 10)
    full, _ = pad(x, y, torch.Generator().manual_seed(3))
    small, _ = pad(x, y, torch.Generator().manual_seed(3), size=8)
    assert small.shape == (8, 3, 8, 8)
    torch.testing.assert_close(small, F.interpolate(full, size=(8, 8), mode="bilinear", antialias=True),
                               atol=1e-5, rtol=0)  # normalising is affine: it commutes with the resize
    rrc = BatchAugment(AugmentConfig(rrc_scale=(1.0, 1.0), rrc_ratio=(1.0, 1.0), hflip=0.0), (16, 16), PRE, 10)
    whole, _ = rrc(x, y, torch.Generator().manual_seed(0), size=(8, 8))
    assert whole.shape == (8, 3, 8, 8)
    # the whole image sampled at 8x8 pixel centres: the mean of each 2x2 block
    torch.testing.assert_close(whole, _norm(F.avg_pool2d(x.float(), 2)), atol=1e-4, rtol=0)


def test_low_size_and_share_are_checked_and_say_when_a_step_is_low():
    with pytest.raises(ConfigError, match=r"AugmentConfig\.low_size: expected an integer >= 0 \(0 = off\), got -8"):
        AugmentConfig(low_size=-8, low_share=0.5)
    with pytest.raises(ConfigError, match=r"AugmentConfig\.low_share: is a share of the run, expected 0\.\.1, got 1\.5"):
        AugmentConfig(low_size=16, low_share=1.5)
    with pytest.raises(ConfigError, match=r"AugmentConfig\.low_share: low_size=16 needs the share of the run it lasts"):
        AugmentConfig(low_size=16)
    half = AugmentConfig(low_size=16, low_share=0.5)
    assert [half.low_at(p) for p in (0.0, 0.49, 0.5, 1.0)] == [True, True, False, False]
    assert AugmentConfig(low_size=16, low_share=1.0).low_at(1.0)  # all of the run, the last step too
    assert not AugmentConfig().low_at(0.0)
