"""The mirror check (data/mirror.py): flips only where mirroring keeps an image's class."""

import json

import pytest
import torch
from helpers import TINY_MODEL, tiny_run_config

from vitkit.data.mirror import KEPT_MIN, MIN_IMAGES, Z_MIN, MirrorCheck, features, mirror_check, mirrored
from vitkit.data.sets import DataSplits, ImageSet
from vitkit.infer.paths import model_logits, shifted_views
from vitkit.train.budget import eval_views, fewer_views, views_words
from vitkit.train.loop import train


def wedge(n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` 32x32 RGB images of a bright wedge pointing left (widest at its right end), at random heights, with
    noise: uint8 (n, 3, 32, 32)."""
    x = torch.randint(0, 60, (n, 3, 32, 32), generator=g)
    for i in range(n):
        top = int(torch.randint(6, 10, (1,), generator=g))
        for col in range(6, 26):
            half = (col - 6) // 3
            x[i, :, top + 8 - half: top + 9 + half, col] += 150
    return x.clamp(0, 255).to(torch.uint8)


def arrows(n: int, seed: int = 0) -> ImageSet:
    """Two classes, each the other's mirror image: 'left' (a wedge pointing left) and 'right' (the same, mirrored),
    as traffic signs' 'keep left' and 'keep right' are."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 2
    images = wedge(n, g)
    images[labels == 1] = images[labels == 1].flip(-1)
    return ImageSet(labels=labels, classes=["left", "right"], images=images, paths=None, size=(32, 32), channels=3)


def shapes(n: int, seed: int = 0) -> ImageSet:
    """Two classes whose mirror images are their own: 'wedge' (pointing left or right, half each, as photos hold
    both ways of a thing) and 'bar' (an upright bar at the centre)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 2
    images = wedge(n, g)
    images[torch.arange(n) % 4 == 2] = images[torch.arange(n) % 4 == 2].flip(-1)
    bars = torch.randint(0, 60, (n, 3, 32, 32), generator=g)
    bars[:, :, 4:28, 13:19] += 150
    images[labels == 1] = bars[labels == 1].clamp(0, 255).to(torch.uint8)
    return ImageSet(labels=labels, classes=["wedge", "bar"], images=images, paths=None, size=(32, 32), channels=3)


# ------------------------------------------------------------------------------------------ the check
def test_classes_that_are_each_others_mirror_refuse_flips():
    found = mirror_check(arrows(400))
    assert found.images == 400 and found.plain > 0.95 and found.mirrored < 0.05  # mirrored: all taken for the other
    assert found.kept < 0 and found.z > 10 and found.refuses
    assert found.pair is not None and found.pair[2] > 0.9 and set(found.pair[:2]) == {"left", "right"}
    assert f"of mirrored {found.pair[0]!r} images are taken for {found.pair[1]!r}" in found.describe()


def test_classes_whose_mirror_images_are_their_own_keep_flips():
    found = mirror_check(shapes(400))
    assert found.plain > 0.95 and abs(found.mirrored - found.plain) < 0.02
    assert found.kept > KEPT_MIN and not found.refuses
    assert "taken for" not in found.describe() and "mirroring keeps" in found.describe()


def test_the_built_in_digits_refuse_flips():
    """Real data: the 8,000 MNIST digits shipped with vitkit; mirrored digits are not the digits they were."""
    from vitkit.data.datasets import open_dataset

    found = mirror_check(open_dataset(None).train)
    assert found.plain > 0.8 and found.kept < 0.5 and found.refuses  # 86.5% and 0.36 when measured


@pytest.mark.parametrize("kept_plain_mirrored, z, refuses", [
    ((0.9, 0.1 + 0.8 * (KEPT_MIN - 0.01)), Z_MIN + 1, True),   # just under the share kept
    ((0.9, 0.1 + 0.8 * (KEPT_MIN + 0.01)), Z_MIN + 1, False),  # just over it
    ((0.9, 0.2), Z_MIN - 0.1, False),  # a loss within the noise
    ((0.1, 0.1), 0.0, False),  # nothing above chance to keep
])
def test_the_rule_takes_the_share_kept_and_the_margin_past_noise(kept_plain_mirrored, z, refuses):
    plain, mirrored = kept_plain_mirrored
    assert MirrorCheck(1000, plain, mirrored, 0.1, z).refuses is refuses


def test_features_are_area_averaged_and_standardised_per_image():
    x = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    f = features(x)
    pooled = torch.nn.functional.avg_pool2d(x.float(), 2).flatten(1)
    want = (pooled - pooled.mean(1, keepdim=True)) / (pooled.std(1, keepdim=True) + 1.0)
    assert f.shape == (3, 3 * 16 * 16) and torch.allclose(f, want, atol=1e-5)
    ragged = features([x[0], x[1, :, :24]])  # images of different sizes: each to 16x16 alone
    assert torch.allclose(ragged[0], want[0], atol=1e-5) and ragged.shape == (2, 768)
    # the mirror images' features are the features' grid flipped, at sizes that divide into 16 and not
    for size in (32, 37, 50):
        y = torch.randint(0, 256, (4, 3, size, size + 3), dtype=torch.uint8)
        assert torch.allclose(features(y.flip(-1)), mirrored(features(y), 3), atol=1e-5), size
    grey = torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8)
    assert torch.allclose(features(grey.flip(-1)), mirrored(features(grey), 1), atol=1e-5)


# ------------------------------------------------------------------------------------- views without mirrors
def test_views_without_mirror_images_are_the_image_and_its_shifted_copies():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    x = torch.randn(2, 3, 8, 8)
    a, b = shifted_views(x, 1)
    want = model(x) / 2 + model(a) / 4 + model(b) / 4
    assert torch.allclose(model_logits(model, x, True, 1, flip=False), want, atol=1e-6)
    assert torch.allclose(model_logits(model, x, True, 0, flip=False), model(x), atol=0)
    flipped = (model(x) + model(x.flip(-1))) / 2  # with mirrors: as before
    assert torch.allclose(model_logits(model, x, True, 0), flipped, atol=1e-6)
    assert (eval_views(True, 1, False), eval_views(True, 0, False), eval_views(True, 1), eval_views(False, 1)) == \
        (3, 1, 6, 1)
    assert fewer_views(True, 1, False) == [(True, 1), (True, 0)]  # 3 views, then 1
    assert views_words(True, 1, False) == "3 views (the image and shifted copies)"
    assert views_words(True, 0, False) == "1 view"


# ------------------------------------------------------------------------------------------------ a run
def splits_of(images: ImageSet) -> DataSplits:
    half = torch.arange(len(images)) < len(images) * 3 // 4
    return DataSplits(train=images.subset(torch.nonzero(half)[:, 0]), val=images.subset(torch.nonzero(~half)[:, 0]),
                      test=None, classes=list(images.classes), format="folder")


@pytest.mark.parametrize("data, flips", [(arrows, False), (shapes, True)])
def test_a_run_that_checks_trains_and_scores_flips_only_where_mirroring_keeps_the_class(tmp_path, capsys, data,
                                                                                       flips):
    lines: list[str] = []
    cfg = tiny_run_config(epochs=1, batch_size=32, tta=True, tta_shift=1,
                          augment=dict(crop="pad", pad=2, hflip=0.5, flip_mode="alternate", mirror_check=True))
    summary = train(cfg, tmp_path / "r", splits=splits_of(data(160)), log=lines.append)
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (saved["augment"]["hflip"], saved["tta_flip"]) == ((0.5, True) if flips else (0.0, False))
    said = [line for line in lines if line.startswith("mirror check: ")]
    assert len(said) == 1 and ("flips kept" in said[0]) == flips
    assert saved["tta"] is True and saved["tta_shift"] == 1 and saved["augment"]["mirror_check"] is True
    assert 0 <= summary["val_acc"] <= 1
    # evaluated later, on the same images from files, the run's views are what it scored with
    from PIL import Image

    from vitkit.tools.evaluate import evaluate

    val = splits_of(data(160)).val
    for i in range(len(val)):
        image, label = val.get(i)
        folder = tmp_path / "val" / val.classes[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{i}.png")
    res = evaluate(tmp_path / "r", data=tmp_path / "val", split="all")
    assert (res["tta"], res["tta_shift"], res["tta_flip"]) == (True, 1, flips)
    assert res["top1"] == pytest.approx(summary["val_acc"], abs=1e-4)
    # the command line names the views, and --tta-flip / --no-tta-flip say otherwise than the run
    from vitkit.cli.main import main

    other = "--tta-flip" if not flips else "--no-tta-flip"
    assert main(["eval", str(tmp_path / "r"), "--data", str(tmp_path / "val"), "--split", "all", "--quiet"]) == 0
    assert main(["eval", str(tmp_path / "r"), "--data", str(tmp_path / "val"), "--split", "all", "--quiet", other]) == 0
    first = [line for line in capsys.readouterr().out.splitlines() if "images" in line and "all" in line]
    words = (", flip TTA with 1-px shifts", ", TTA of 1-px shifts")
    assert first[0].endswith(words[not flips]) and first[1].endswith(words[flips])


def test_without_the_check_or_with_too_few_images_the_flips_stay(tmp_path):
    for name, images, check in (("off", arrows(160), False), ("few", arrows(MIN_IMAGES), True)):
        lines: list[str] = []
        cfg = tiny_run_config(epochs=1, batch_size=32, model=TINY_MODEL,
                              augment=dict(crop="pad", pad=2, hflip=0.5, mirror_check=check))
        train(cfg, tmp_path / name, splits=splits_of(images), log=lines.append)  # 3/4 of MIN_IMAGES train
        saved = json.loads((tmp_path / name / "config.json").read_text())
        assert saved["augment"]["hflip"] == 0.5 and saved["tta_flip"] is True
        assert not any(line.startswith("mirror check") for line in lines)


def test_a_recipe_checks_unless_the_run_sets_its_own_flips(tmp_path):
    from helpers import image_folder

    from vitkit.train.resolve import RunRequest, resolve_run

    data = image_folder(tmp_path / "data", n=4, test=1)
    flags = {"model": "vit_test", "epochs": 1, "threads": 1, "device": "cpu"}
    run = resolve_run(RunRequest(data=str(data), flags=flags, out=str(tmp_path / "r")))
    assert run.cfg.augment.mirror_check is True and run.cfg.augment.hflip == 0.5
    for given in (["augment.hflip=0.5"], ["tta_flip=true"], ["augment.flip_mode=random"]):
        own = resolve_run(RunRequest(data=str(data), flags=flags, overrides=given, out=str(tmp_path / "r2")))
        assert own.cfg.augment.mirror_check is False, given


def test_a_finetune_checks_too_unless_the_run_sets_its_own_flips(tmp_path):
    from helpers import image_folder, tiny_model

    from vitkit.io import checkpoint as ckpt_io
    from vitkit.train.resolve import RunRequest, resolve_run

    data = image_folder(tmp_path / "data", n=4, test=1)
    ckpt_io.save(tiny_model(num_classes=2), tmp_path / "w")
    flags = {"epochs": 1, "threads": 1, "device": "cpu"}
    run = resolve_run(RunRequest(data=str(data), weights=str(tmp_path / "w"), flags=flags, out=str(tmp_path / "r")))
    assert run.cfg.augment.mirror_check is True and run.cfg.augment.hflip == 0.5
    own = resolve_run(RunRequest(data=str(data), weights=str(tmp_path / "w"), flags=flags,
                                 overrides=["augment.hflip=0.3"], out=str(tmp_path / "r2")))
    assert own.cfg.augment.mirror_check is False and own.cfg.augment.hflip == 0.3


def test_images_read_from_their_files_are_checked_on_a_smaller_sample(tmp_path, monkeypatch):
    from PIL import Image

    import vitkit.data.mirror as mirror

    images = arrows(160)
    paths = []
    for i in range(len(images)):
        image, _ = images.get(i)
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(paths[-1])
    streamed = ImageSet(labels=images.labels, classes=images.classes, images=None, paths=paths, size=(32, 32),
                        channels=3)
    monkeypatch.setattr(mirror, "MAX_STREAMED", 120)
    found = mirror.mirror_check(streamed)
    assert not streamed.in_memory and found.images == 120 and found.refuses
    assert mirror.mirror_check(images).images == 160  # in memory: up to MAX_IMAGES
