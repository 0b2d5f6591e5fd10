"""The data path of image folders: whole images kept at a short side, random resized crops drawn from the
whole image, mixed aspect ratios, the eval transform (resize to size / crop_pct + centre crop), the
DataLoader workers' default, and the data options' errors."""


import numpy as np
import pytest
import torch
from helpers import image_folder, tiny_run_config, tiny_splits
from PIL import Image

from vitkit.core.errors import ConfigError, DataError
from vitkit.core.hardware import usable_cpus
from vitkit.data import AugmentConfig, BatchAugment, eval_batch, open_dataset
from vitkit.data.splits import decode_short_side
from vitkit.model.config import Preprocess
from vitkit.train.build import eval_crop, open_data
from vitkit.train.config import resolve_config
from vitkit.train.loader import MAX_WORKERS, BatchLoader, loader_workers

RED = (255, 0, 0)
PLAIN = Preprocess(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # the output is pixel / 255


def _marked(path, h, w, seed=0):
    """An h x w grey-noise image whose first 10% of columns (its left border) are pure red: a centre
    crop of a wide image never holds any of them."""
    a = np.random.default_rng(seed).integers(90, 160, (h, w, 3), dtype=np.uint8)
    a[:, : max(1, w // 10)] = RED
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path)


def _folder(root, shapes, n=6):
    """Class folders a/ and b/, image i of each of shape shapes[i % len(shapes)]."""
    for c in ("a", "b"):
        for i in range(n):
            _marked(root / c / f"{i}.png", *shapes[i % len(shapes)], seed=10 * (c == "b") + i)
    return root


def _has_red(x: torch.Tensor) -> torch.Tensor:
    """(B,) whether each normalised-to-[0, 1] image holds a clearly red pixel."""
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    return ((r > 0.9) & (g < 0.15) & (b < 0.15)).flatten(1).any(1)


def test_short_side_keeps_whole_images_and_crops_reach_the_border(tmp_path):
    # wide 32x96 images, model 32: a store centre-cropped at 32x32 loses the red border, the whole image keeps it
    root = _folder(tmp_path / "wide", [(32, 96)])
    cropped = open_dataset(root, img_size=32, val_fraction=0).train
    assert not _has_red(cropped.images.float() / 255).any()
    d = open_dataset(root, short_side=36, val_fraction=0).train
    assert d.images.shape == (12, 3, 32, 96) and d.short_side == 36  # never enlarged: one size, one tensor
    aug = BatchAugment(AugmentConfig(crop="rrc", hflip=0.0), 32, PLAIN, 2)
    x, _ = aug(d.images, d.labels, torch.Generator().manual_seed(0))
    assert x.shape == (12, 3, 32, 32)
    assert 0 < int(_has_red(x).sum()) < 12  # some crops hold the border, not all


def test_mixed_aspect_ratios_load_as_a_ragged_store(tmp_path):
    root = _folder(tmp_path / "mixed", [(40, 80), (80, 40), (50, 50)])
    splits = open_dataset(root, short_side=36, val_fraction=0.34, seed=1)
    tr = splits.train
    assert tr.images is None and tr.ragged is not None and tr.in_memory
    sizes = {tuple(tr.get(i)[0].shape) for i in range(len(tr))}
    assert sizes == {(3, 36, 72), (3, 72, 36), (3, 36, 36)}  # short side 36, aspect ratios kept
    assert "short side <= 36" in splits.summary()
    imgs, labels = tr.get_batch(torch.arange(len(tr)))
    assert isinstance(imgs, list) and len(imgs) == len(labels)
    aug = BatchAugment(AugmentConfig(crop="rrc", hflip=0.5), 32, PLAIN, 2)
    x, y = aug(imgs, labels, torch.Generator().manual_seed(0))
    assert x.shape == (len(tr), 3, 32, 32) and torch.equal(y, labels)
    x2, _ = aug(imgs, labels, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)  # the generator alone decides
    assert _has_red(x).any()
    # the other crops of a list: resized to the model's size first
    for crop in ("pad", "none"):
        out, _ = BatchAugment(AugmentConfig(crop=crop), 32, PLAIN, 2)(imgs, labels, torch.Generator())
        assert out.shape == (len(tr), 3, 32, 32)
    # streamed: the same images, decoded on demand, as a list; in DataLoader workers too
    st = open_dataset(root, short_side=36, val_fraction=0, in_memory=False).train
    assert st.paths is not None and st.short_side == 36
    streamed, _ = st.get_batch(torch.arange(3))
    mem = open_dataset(root, short_side=36, val_fraction=0).train
    assert all(torch.equal(a, b) for a, b in zip(streamed, mem.get_batch(torch.arange(3))[0]))
    loader = BatchLoader(st, 4, seed=0, workers=2)
    got = [x for _, x, _ in loader.epoch(0)]
    want = [x for _, x, _ in BatchLoader(mem, 4, seed=0, workers=0).epoch(0)]
    assert all(torch.equal(a, b) for ga, wa in zip(got, want) for a, b in zip(ga, wa))


def test_eval_is_resize_short_side_then_centre_crop(tmp_path):
    # by hand: a 48x80 image, model 32, crop_pct 0.8 -> short side 40 (40x66), centre crop rows 4..36, cols 17..49
    img = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 48, 80), dtype=np.uint8))
    pre = Preprocess(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), crop_pct=0.8, interpolation="bilinear")
    resized = torch.nn.functional.interpolate(img[None].float(), size=(40, 66), mode="bilinear",
                                              align_corners=False, antialias=True)
    want = resized[..., 4:36, 17:49] / 255
    got = eval_batch([img], 32, pre)
    assert got.shape == (1, 3, 32, 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert torch.equal(eval_batch(img[None], 32, pre), got)  # a batch of one size: the same transform
    assert decode_short_side((224, 224), 0.875) == 256 and decode_short_side((32, 32), 0.875) == 36


def test_a_run_on_large_images_evaluates_at_its_crop_pct(tmp_path):
    root = _folder(tmp_path / "big", [(64, 96), (96, 64)], n=8)
    cfg = tiny_run_config(data=dict(path=str(root), crop_pct=0.8))
    from vitkit.train.build import model_config

    mcfg = model_config(cfg)
    splits = open_data(cfg, mcfg, lambda m: None)
    assert splits.train.short_side == 40 and splits.train.ragged is not None  # 32 / 0.8
    assert eval_crop(Preprocess(), splits.train, (32, 32), 0.8).crop_pct == 0.8
    # images stored at the model's size (the demo digits, CIFAR-size folders) keep the fast path
    small = open_data(tiny_run_config(data=dict(path=str(image_folder(tmp_path / "small")))), mcfg, lambda m: None)
    assert small.train.images.shape[-2:] == (32, 32)
    assert eval_crop(Preprocess(), small.train, (32, 32), 0.8).crop_pct == 1.0
    assert eval_crop(Preprocess(), tiny_splits().train, (32, 32), 0.8).crop_pct == 1.0


def test_workers_default_to_the_machine():
    assert resolve_config().data.workers is None
    assert loader_workers(None) == max(1, min(MAX_WORKERS, usable_cpus()))
    assert loader_workers(None, processes=64) == 1
    assert loader_workers(0) == 0 and loader_workers(3, processes=2) == 3


@pytest.mark.parametrize("key, value", [("data.short_side", "0"), ("data.crop_pct", "0"), ("data.crop_pct", "1.5"),
                                        ("data.workers", "-1"), ("data.img_size", "0")])
def test_bad_data_options_are_one_line_errors(key, value):
    with pytest.raises(ConfigError, match=rf"^{key.replace('.', '[.]')}: ") as e:
        resolve_config(overrides=[f"{key}={value}"])
    assert "\n" not in str(e.value)


def test_open_dataset_refuses_bad_short_side(tmp_path):
    root = _folder(tmp_path / "d", [(32, 32)], n=2)
    with pytest.raises(DataError, match=r"^short_side: must be a positive integer"):
        open_dataset(root, short_side=0)
    with pytest.raises(DataError, match=r"^short_side: give img_size .* or short_side"):
        open_dataset(root, short_side=36, img_size=32)


@pytest.mark.parametrize("in_memory", [True, False])
def test_training_on_whole_images_end_to_end(tmp_path, in_memory):
    # mixed aspect ratios, held in memory (a ragged store) or streamed through 2 DataLoader workers; then
    # the saved model evaluates as the run validated: short side to 32 / 0.8, centre crop
    from vitkit import load
    from vitkit.train.loop import train

    root = _folder(tmp_path / "mixed", [(40, 80), (80, 40)], n=8)
    cfg = tiny_run_config(epochs=1, augment=dict(crop="rrc", hflip=0.5),
                          data=dict(path=str(root), in_memory=in_memory, workers=2, crop_pct=0.8))
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and 0 <= summary["val_acc"] <= 1 and summary["data_cache"] == "off"
    again = train(cfg, tmp_path / "again")
    assert again["val_loss"] == summary["val_loss"]  # the same seed, the same run, whatever the workers do
    model = load(tmp_path / "run" / "best")
    assert model.preprocess.crop_pct == 0.8


def test_short_side_follows_exif_rotation(tmp_path):
    # stored 40 high x 60 wide, EXIF orientation 6 (shown rotated a quarter turn): shown 60 x 40, so short side 20
    # gives 30 x 20; decoded with libjpeg's draft scaling, as a folder of large photos is
    from vitkit.data.images import decode_array

    im = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    im.save(tmp_path / "r.jpg", exif=exif)
    assert decode_array(tmp_path / "r.jpg", 3, None, short_side=20).shape == (30, 20, 3)
    assert decode_array(tmp_path / "r.jpg", 3, None, short_side=50).shape == (60, 40, 3)  # never enlarged
