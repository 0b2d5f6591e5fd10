"""Published weights by name (``hf-hub:ORG/NAME``, a model name with ``pretrained=True``) and their
preprocessing read from the source: a timm tag's pretrained_cfg, an HF model's preprocessor_config.json,
or assumed and reported for a bare file.

No test touches the network: the Hub is a local cache in huggingface_hub's own layout
(models--ORG--NAME/refs/main + snapshots/<sha>/), read in a subprocess with HF_HUB_OFFLINE=1 and
HF_HUB_CACHE pointing at it (huggingface_hub reads its environment when it is imported)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import image_folder, random_model, tiny_model
from PIL import Image

import vitkit
from vitkit.cli.main import main
from vitkit.data.images import resize_center_crop, to_model_input
from vitkit.io.convert import describe, detect_format, read, to_hf
from vitkit.io.preprocess import from_pretrained_cfg
from vitkit.io.timm import save_timm

pytestmark = pytest.mark.usefixtures("one_thread")

SRC = os.path.join(os.path.dirname(__file__), "..", "src")
IMAGENET = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
LABELS = [f"l{i}" for i in range(10)]
# a timm tag's pretrained_cfg, as timm's push_to_hub writes it (the values differ from vitkit's defaults)
PRETRAINED_CFG = dict(tag="test", input_size=[3, 32, 32], interpolation="bilinear", crop_pct=0.9,
                      crop_mode="squash", num_classes=10, first_conv="patch_embed.proj", classifier="head",
                      **IMAGENET)
FT = ["--epochs", "1", "--batch-size", "8", "--threads", "1", "--device", "cpu", "--precision", "fp32",
      "--set", "plots=false"]


# ------------------------------------------------------------------------------------- the local Hub
def timm_folder(folder: Path, model, architecture: str = "vit_test", pretrained_cfg=PRETRAINED_CFG) -> Path:
    """A timm Hub repository's files: model.safetensors (timm's layout) and config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    save_timm(model, folder / "model.safetensors")
    config = dict(architecture=architecture, num_classes=model.cfg.num_classes, num_features=model.cfg.embed_dim,
                  global_pool="token", label_names=LABELS, pretrained_cfg=pretrained_cfg)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def hf_folder(folder: Path, model, **processor) -> Path:
    """An HF model's files (to_hf), its preprocessor_config.json a ViTImageProcessor's (the whole image
    squashed to the model's size) changed by ``processor``."""
    to_hf(model, folder)
    file = folder / "preprocessor_config.json"
    vit = {k: v for k, v in json.loads(file.read_text()).items() if k not in ("do_center_crop", "crop_size")}
    h, w = model.cfg.img_size
    vit.update(image_processor_type="ViTImageProcessor", size={"height": h, "width": w})
    file.write_text(json.dumps({**vit, **processor}))
    return folder


def cached_repo(cache: Path, repo: str) -> Path:
    """The snapshot folder of ``repo`` in a huggingface_hub cache at ``cache`` (refs/main holds its sha)."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(sha)
    return root / "snapshots" / sha


def offline(cache: Path, *argv: str, code: str | None = None, timeout: float = 240):
    """``vitkit ARGV`` (or ``python -c CODE``) in a subprocess, offline, with the Hub cache at ``cache``."""
    pytest.importorskip("huggingface_hub")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf_home"),
               PYTHONPATH=os.pathsep.join([SRC, os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "vitkit", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cache.parent)


def offline_json(cache: Path, code: str):
    """``python -c CODE`` offline (``offline``), which must succeed: the last line it prints, read as JSON."""
    r = offline(cache, code=code)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.fixture()
def hub(tmp_path):
    """A Hub cache holding a timm tag (org/tiny-timm: vit_test with a pretrained_cfg) and an HF model
    (org/tiny-hf: ViTImageProcessor, which squashes), and the models they hold."""
    cache = tmp_path / "hub"
    timm_model = random_model(seed=1)
    timm_folder(cached_repo(cache, "org/tiny-timm"), timm_model)
    hf_model = random_model(seed=2)
    hf_folder(cached_repo(cache, "org/tiny-hf"), hf_model, image_mean=[0.4, 0.4, 0.4], image_std=[0.2, 0.2, 0.2])
    return cache, timm_model, hf_model


def saved_preprocess(run: Path) -> dict:
    return json.loads((run / "best" / "vitkit.json").read_text())["preprocess"]


# ------------------------------------------------------------------------------- names, end to end
def test_finetune_a_timm_tag_by_name_offline(hub, tmp_path):
    cache, _, _ = hub
    data = image_folder(tmp_path / "data")
    out = tmp_path / "run"
    r = offline(cache, "finetune", "hf-hub:org/tiny-timm", "--data", str(data), "--out", str(out), *FT)
    assert r.returncode == 0, r.stderr
    assert "read timm: hf-hub:org/tiny-timm" in r.stdout
    assert "not in the weights" not in r.stdout  # the architecture named vit_test, which vitkit has
    assert "crop_pct 0.9, bilinear, resize squash (from " in r.stdout and "pretrained_cfg" in r.stdout
    pre = saved_preprocess(out)  # the images are stored at the model's size: the run keeps the source's crop
    assert pre == dict(IMAGENET, crop_pct=0.9, interpolation="bilinear", resize="squash")
    assert json.loads((out / "config.json").read_text())["init_from"] == "hf-hub:org/tiny-timm"


def test_train_from_published_weights_is_a_fine_tune_at_their_resolution(tmp_path):
    """`vitkit train --data photos/ --model NAME --pretrained` takes vitkit finetune's defaults, not the photos
    recipe's from-scratch settings and resolution."""
    from vitkit.io.hub import PRETRAINED
    from vitkit.train.config import FINETUNE_DEFAULTS

    cache = tmp_path / "hub"
    timm_folder(cached_repo(cache, PRETRAINED["vit_tiny_patch16_224"]), random_model(seed=1))  # vit_test, 32 px
    data = image_folder(tmp_path / "photos", size=80)  # larger than 64 px: the photos recipe's data
    out = tmp_path / "run"
    r = offline(cache, "train", "--data", str(data), "--model", "vit_tiny_patch16_224", "--pretrained", "--out",
                str(out), *FT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("fine-tuning: the run starts from weights, so it takes vitkit finetune's defaults")
    assert "recipe photos" not in r.stdout
    saved = json.loads((out / "config.json").read_text())
    assert {k: saved["optim"][k] for k in FINETUNE_DEFAULTS["optim"]} == FINETUNE_DEFAULTS["optim"]
    assert saved["img_size"] is None and saved["ema"] is None and saved["tta"] is False
    model = json.loads((out / "best" / "vitkit.json").read_text())
    assert model["model"]["img_size"] == [32, 32]  # the weights' own, not the recipe's 64 or 96 px
    pre = saved_preprocess(out)  # the weights' own normalisation and resize (the eval crop of whole photos is
    assert {k: pre[k] for k in ("mean", "std", "interpolation", "resize")} == \
        dict(IMAGENET, interpolation="bilinear", resize="squash")  # data.crop_pct's, as vitkit finetune's)


def test_finetune_an_hf_model_by_name_with_a_preprocess_override(hub, tmp_path):
    cache, _, _ = hub
    data = image_folder(tmp_path / "data")
    out = tmp_path / "run"
    r = offline(cache, "finetune", "hf-hub:org/tiny-hf", "--data", str(data), "--out", str(out), *FT,
                "--set", "preprocess.crop_pct=0.8")
    assert r.returncode == 0, r.stderr
    assert "read hf: hf-hub:org/tiny-hf" in r.stdout and "preprocessor_config.json" in r.stdout
    pre = saved_preprocess(out)
    assert pre == dict(mean=[0.4] * 3, std=[0.2] * 3, crop_pct=0.8, interpolation="bicubic", resize="squash")


def test_predict_and_eval_by_name_use_the_sources_preprocessing(hub, tmp_path):
    cache, timm_model, _ = hub
    img = tmp_path / "img.png"
    pixels = torch.randint(0, 256, (40, 56, 3), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    Image.fromarray(pixels.numpy()).save(img)
    r = offline(cache, "predict", "hf-hub:org/tiny-timm", str(img), "--json", "--top-k", "1", "--engine", "torch",
                "--precision", "fp32", "--device", "cpu", "--quiet")
    assert r.returncode == 0, r.stderr
    top = json.loads(r.stdout.splitlines()[-1])["predictions"][0]["top"][0]
    # what the source's preprocessing (squash, crop 0.9, bilinear, ImageNet mean/std) makes of the image
    model, _ = read(timm_folder(tmp_path / "local", timm_model))
    x = to_model_input(pixels.permute(2, 0, 1).contiguous(), (32, 32), model.preprocess)
    with torch.no_grad():
        probs = model(x[None]).softmax(-1)[0]
    assert top["label"] == LABELS[int(probs.argmax())] and abs(top["prob"] - float(probs.max())) < 1e-5

    # eval on images of mixed sizes: each squashed whole (a centre crop first would keep their aspect ratio)
    data = tmp_path / "data"
    for i, label in enumerate(LABELS):
        (data / label).mkdir(parents=True)
        Image.fromarray(pixels[: 30 + i, : 60 - 2 * i].numpy()).save(data / label / "a.png")
    r = offline(cache, "eval", "hf-hub:org/tiny-timm", "--data", str(data), "--json", "--engine", "torch",
                "--precision", "fp32", "--device", "cpu", "--quiet")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.splitlines()[-1])
    assert res["scored"] == "whole: all 10 images" and not res["skipped_files"], res


def test_create_model_pretrained_reads_the_tag_of_its_name(hub):
    cache, timm_model, _ = hub
    code = ("import json, vitkit\n"
            "from vitkit.io import hub\n"
            "hub.PRETRAINED['vit_test'] = 'org/tiny-timm'  # the table maps a test name to the local tag\n"
            "m = vitkit.create_model('vit_test', pretrained=True)\n"
            "n = vitkit.create_model(weights='hf-hub:org/tiny-hf', num_classes=3, preprocess={'crop_pct': 0.5})\n"
            "print(json.dumps([sum(float(p.detach().double().sum()) for p in m.parameters()), m.preprocess.to_dict(),\n"
            "                  m.labels, n.cfg.num_classes, n.preprocess.resize, n.preprocess.crop_pct]))\n")
    total, pre, labels, classes, resize, crop_pct = offline_json(cache, code)
    assert abs(total - sum(float(p.detach().double().sum()) for p in timm_model.parameters())) < 1e-6
    assert pre == dict(IMAGENET, crop_pct=0.9, interpolation="bilinear", resize="squash")
    assert labels == LABELS and classes == 3 and (resize, crop_pct) == ("squash", 0.5)


def test_convert_by_name_and_a_model_without_published_weights(hub, tmp_path):
    cache, _, _ = hub
    r = offline(cache, "convert", "hf-hub:org/tiny-timm", str(tmp_path / "ckpt"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "ckpt" / "vitkit.json").read_text())["preprocess"]["crop_pct"] == 0.9
    r = offline(cache, code="import vitkit; vitkit.create_model('vit_test', pretrained=True)")
    assert r.returncode == 1 and "model 'vit_test' has no published weights" in r.stderr.splitlines()[-1]


# ------------------------------------------------------------------------------------ one-line errors
def test_offline_with_nothing_cached_is_one_line(tmp_path):
    cache = tmp_path / "empty"
    cache.mkdir()
    for argv in (["convert", "hf-hub:org/missing", str(tmp_path / "out")],
                 ["predict", "hf-hub:org/missing", str(tmp_path)],
                 ["finetune", "hf-hub:org/missing", "--data", str(tmp_path), *FT]):
        r = offline(cache, *argv)
        assert r.returncode == 1, (argv, r.stderr)
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1 and err.startswith("vitkit: error: hf-hub:org/missing: not in the local "
                                                             "Hugging Face cache"), (argv, err)


def test_without_huggingface_hub_is_one_line_naming_the_extra(tmp_path):
    cache = tmp_path / "empty"
    cache.mkdir()
    code = ("import sys\nsys.modules['huggingface_hub'] = None  # as if it were not installed\n"
            "from vitkit.cli.main import main\nsys.exit(main(['convert', 'hf-hub:org/x', 'out']))\n")
    r = offline(cache, code=code)
    err = r.stderr.strip()
    assert r.returncode == 1 and len(err.splitlines()) == 1, err
    assert err == ("vitkit: error: hf-hub:org/x: weights from the Hugging Face Hub need the huggingface_hub "
                   "package: pip install 'vitkit[hub]'")


def test_malformed_names_and_local_paths_first(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "hf-hub:only-one-part", "out"]) == 1
    assert "expected hf-hub:ORG/NAME" in capsys.readouterr().err
    assert main(["convert", "timm/vit_x", "out", "--from", "timm"]) == 1  # a path that does not exist
    assert "(a model on the Hugging Face Hub is written hf-hub:timm/vit_x)" in capsys.readouterr().err
    # a folder named as a model with published weights is that folder, not the published weights
    Path("vit_base_patch16_224").mkdir()
    assert main(["convert", "vit_base_patch16_224", "out", "--from", "timm"]) == 1
    assert "vit_base_patch16_224" in capsys.readouterr().err


# -------------------------------------------------------------------------- preprocessing per source
def test_a_timm_folder_is_read_with_its_architecture_and_pretrained_cfg(tmp_path):
    folder = timm_folder(tmp_path / "tag", random_model(seed=1))
    assert detect_format(folder) == detect_format(folder / "model.safetensors") == "timm"
    model, info = read(folder)
    assert info["format"] == "timm" and info["assumed"] == info["preprocess_assumed"] == {}
    assert model.labels == LABELS
    assert model.cfg.num_heads == 2  # from vit_test: a width of 32 does not show the heads
    p = model.preprocess
    assert (p.mean, p.std) == (tuple(IMAGENET["mean"]), tuple(IMAGENET["std"]))
    assert (p.crop_pct, p.interpolation, p.resize) == (0.9, "bilinear", "squash")
    # a field the pretrained_cfg leaves out takes timm's default, reported as assumed
    cfg = {k: v for k, v in PRETRAINED_CFG.items() if k not in ("crop_pct", "crop_mode")}
    model, info = read(timm_folder(tmp_path / "partial", random_model(), pretrained_cfg=cfg))
    assert model.preprocess.crop_pct == 0.875 and model.preprocess.resize == "shorter_then_crop"
    assert info["preprocess_assumed"] == {"preprocess.crop_pct": 0.875, "preprocess.resize": "shorter_then_crop"}
    # an architecture vitkit does not have: read from the weights, which do not show the heads here
    with pytest.raises(Exception, match="number of heads is not visible"):
        read(timm_folder(tmp_path / "other", random_model(), architecture="vit_unknown_patch8"))


def test_a_timm_tags_test_size_brings_its_test_crop(tmp_path):
    cfg = dict(PRETRAINED_CFG, test_input_size=[3, 48, 48], test_crop_pct=1.0)
    folder = timm_folder(tmp_path / "tag", random_model(), pretrained_cfg=cfg)
    assert main(["convert", str(folder), str(tmp_path / "a"), "--img-size", "48"]) == 0
    assert json.loads((tmp_path / "a" / "vitkit.json").read_text())["preprocess"]["crop_pct"] == 1.0
    assert main(["convert", str(folder), str(tmp_path / "b"), "--img-size", "40"]) == 0
    assert json.loads((tmp_path / "b" / "vitkit.json").read_text())["preprocess"]["crop_pct"] == 0.9


def test_hf_preprocessor_config_squash_and_crop(tmp_path):
    model, info = read(hf_folder(tmp_path / "vit", random_model(), resample=3))  # ViTImageProcessor
    p = model.preprocess
    assert (p.crop_pct, p.interpolation, p.resize) == (1.0, "bicubic", "squash") and not info["preprocess_assumed"]
    assert info["preprocess_from"].endswith("preprocessor_config.json")
    # an older ViT processor gives its size as one number: a square
    p = read(hf_folder(tmp_path / "old", random_model(), size=32, feature_extractor_type="ViTFeatureExtractor"))[0]
    assert (p.preprocess.crop_pct, p.preprocess.resize) == (1.0, "squash")
    # DeiT's processor: squash to 256 x 256, centre crop 224 (here 32 / 40 of it)
    deit = dict(size=40, do_center_crop=True, crop_size=32, image_processor_type="DeiTImageProcessor")
    p = read(hf_folder(tmp_path / "deit", random_model(), **deit))[0].preprocess
    assert (p.crop_pct, p.resize) == (0.8, "squash")
    p = read(hf_folder(tmp_path / "clip", random_model(), **dict(deit, image_processor_type="CLIPImageProcessor")))
    assert (p[0].preprocess.crop_pct, p[0].preprocess.resize) == (0.8, "shorter_then_crop")
    # DINOv2's (BitImageProcessor): the short side to 256, centre crop 224
    bit = dict(size={"shortest_edge": 40}, do_center_crop=True, crop_size={"height": 32, "width": 32},
               image_mean=IMAGENET["mean"], image_std=IMAGENET["std"])
    p = read(hf_folder(tmp_path / "bit", random_model(), **bit))[0].preprocess
    assert (p.crop_pct, p.resize, p.mean) == (0.8, "shorter_then_crop", tuple(IMAGENET["mean"]))
    # no preprocessor_config.json: ViTImageProcessor's defaults, reported as assumed
    (tmp_path / "vit" / "preprocessor_config.json").unlink()
    model, info = read(tmp_path / "vit")
    assert model.preprocess.resize == "squash" and info["preprocess_assumed"]["preprocess.interpolation"] == "bilinear"


def test_a_bare_file_reports_its_assumed_preprocessing_and_takes_overrides(tmp_path, capsys):
    weights = tmp_path / "vit.safetensors"
    save_timm(random_model(), weights)
    model, info = read(weights, overrides=["num_heads=2"])
    # timm's defaults, as for a Hub repository whose pretrained_cfg leaves the fields out
    assert info["preprocess_assumed"] == {
        "preprocess.mean": IMAGENET["mean"], "preprocess.std": IMAGENET["std"], "preprocess.crop_pct": 0.875,
        "preprocess.interpolation": "bicubic", "preprocess.resize": "shorter_then_crop"}
    assert main(["convert", str(weights), str(tmp_path / "ck"), "--set", "num_heads=2",
                 "--set", "preprocess.crop_pct=0.9", "--set", "preprocess.mean=[0.5,0.5,0.5]"]) == 0
    out = capsys.readouterr().out
    assert (f"preprocessing not in the source, assumed: preprocess.std={IMAGENET['std']}, "
            "preprocess.interpolation=bicubic, preprocess.resize=shorter_then_crop "
            "(change with --set preprocess.KEY=VALUE)") in out
    pre = json.loads((tmp_path / "ck" / "vitkit.json").read_text())["preprocess"]
    assert pre["crop_pct"] == 0.9 and pre["mean"] == [0.5, 0.5, 0.5]
    assert main(["convert", str(weights), str(tmp_path / "x"), "--set", "num_heads=2",
                 "--set", "preprocess.crop=0.9"]) == 1
    assert "preprocess.crop: not a Preprocess field" in capsys.readouterr().err
    lines = describe({"src": "w", "from": "timm", "config": model.cfg.to_dict(), "params": 1,
                      "assumed": info["assumed"], "preprocess_assumed": info["preprocess_assumed"]})
    assert lines[-1].startswith(f"preprocessing not in the source, assumed: preprocess.mean={IMAGENET['mean']}")


def test_convert_to_timm_keeps_the_runs_preprocessing_beside_the_file(tmp_path):
    """`vitkit convert CKPT out.safetensors --to timm` writes out.json beside it, a pretrained_cfg as timm's Hub
    repositories hold one; reading the file back takes it, nothing assumed; a user's file there is refused."""
    from vitkit import Preprocess

    model = random_model()
    model.preprocess = Preprocess(mean=(0.4, 0.4, 0.4), std=(0.2, 0.3, 0.2), crop_pct=0.9, interpolation="bilinear",
                                  resize="squash")
    model.labels = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"][: model.cfg.num_classes]
    vitkit.save(model, tmp_path / "ck")
    assert main(["convert", str(tmp_path / "ck"), str(tmp_path / "vit.safetensors"), "--to", "timm"]) == 0
    beside = json.loads((tmp_path / "vit.json").read_text())
    assert beside["pretrained_cfg"] == {"input_size": [3, 32, 32], "mean": [0.4] * 3, "std": [0.2, 0.3, 0.2],
                                        "crop_pct": 0.9, "crop_mode": "squash", "interpolation": "bilinear",
                                        "num_classes": model.cfg.num_classes}
    back, info = read(tmp_path / "vit.safetensors", overrides=["num_heads=2"])
    assert back.preprocess == model.preprocess and back.labels == model.labels
    assert info["preprocess_assumed"] == {} and info["preprocess_from"].endswith("vit.json (pretrained_cfg)")
    (tmp_path / "mine.json").write_text('{"notes": "mine"}')
    assert main(["convert", str(tmp_path / "ck"), str(tmp_path / "mine.safetensors"), "--to", "timm"]) == 1
    assert not (tmp_path / "mine.safetensors").exists() and (tmp_path / "mine.json").read_text() == '{"notes": "mine"}'


# -------------------------------------------------------------- a bad field of a source is one line naming it
NAN, INF = float("nan"), float("inf")
# pretrained_cfg field changes -> the error after "config.json: pretrained_cfg."
TIMM_BAD = {
    "mean-nan": ({"mean": [NAN] * 3}, r"mean\[0\]: expected a finite number in \[-10, 10\], got nan"),
    "mean-text": ({"mean": "abc"}, r"mean: expected a number or a list of numbers in \[-10, 10\], got 'abc'"),
    "mean-empty": ({"mean": []}, r"mean: expected a number or a list of numbers in \[-10, 10\], got \[\]"),
    "mean-two": ({"mean": [0.5, 0.5], "std": [0.5, 0.5]}, r"mean: 2 values for a model of 3 channels"),
    "std-inf": ({"std": [INF] * 3}, r"std\[0\]: expected a finite number in \[0.001, 10\], got inf"),
    "std-zero": ({"std": [0.2, 0.0, 0.2]}, r"std\[1\]: expected a finite number in \[0.001, 10\], got 0.0"),
    "crop-tiny": ({"crop_pct": 1e-9}, r"crop_pct: expected a finite number in \[0.1, 1\], got 1e-09"),
    "crop-subnormal": ({"crop_pct": 5e-324}, r"crop_pct: expected a finite number in \[0.1, 1\], got 5e-324"),
    "crop-text": ({"crop_pct": "0.9"}, r"crop_pct: expected a finite number in \[0.1, 1\], got '0.9'"),
    "crop-mode-list": ({"crop_mode": ["center"]}, r"crop_mode: expected a string, got \['center'\]"),
    "test-size-text": ({"test_input_size": [3, "a", 5]},
                       r"test_input_size\[1\]: expected a whole number in \[1, 16384\], got 'a'"),
    "test-size-zero": ({"test_input_size": [3, 0, 0]}, r"test_input_size\[1\]: expected a whole number in \[1, 16384\]"),
    "test-crop-nan": ({"test_input_size": [3, 48, 48], "test_crop_pct": NAN},
                      r"test_crop_pct: expected a finite number in \[0.1, 1\], got nan"),
}
# preprocessor_config.json changes -> the error after "preprocessor_config.json: "
HF_PROCESSOR_BAD = {
    "size-huge": ({"size": {"height": 10**9, "width": 10**9}},
                  r"size\.height: expected a whole number in \[1, 16384\], got 1000000000"),
    "size-text": ({"size": {"height": "x", "width": 32}}, r"size\.height: expected a whole number in \[1, 16384\], got 'x'"),
    "size-zero": ({"size": {"height": 0, "width": 0}}, r"size\.height: expected a whole number in \[1, 16384\], got 0"),
    "shortest-edge-zero": ({"size": {"shortest_edge": 0}}, r"size\.shortest_edge: expected a whole number in \[1, 16384\]"),
    "size-far-beyond-crop": ({"size": 16384}, r"size \(16384, 16384\) for a crop of 32x32 makes crop_pct 0.00195, "
                                              r"outside \[0.1, 1\]"),
    "crop-size-float": ({"do_center_crop": True, "crop_size": 31.5}, r"crop_size: expected a whole number in \[1, 16384\]"),
    "rescale-text": ({"rescale_factor": "abc"}, r"rescale_factor: rescales pixels by 'abc' \(do_rescale True\); vitkit "
                                                r"scales them to \[0, 1\]"),
    "do-resize-text": ({"do_resize": "no"}, r"do_resize: expected true or false, got 'no'"),
    "resample-list": ({"resample": [3]}, r"resample: expected a PIL filter number"),
    "mean-nan": ({"image_mean": [NAN] * 3}, r"image_mean\[0\]: expected a finite number in \[-10, 10\], got nan"),
    "mean-empty": ({"image_mean": []}, r"image_mean: expected a number or a list of numbers in \[-10, 10\], got \[\]"),
    "std-inf": ({"image_std": INF}, r"image_std: expected a finite number in \[0.001, 10\], got inf"),
}
# config.json changes -> the error after "config.json: "
HF_CONFIG_BAD = {
    "hidden-act-list": ({"hidden_act": ["gelu"]}, r"hidden_act: expected a string, got \['gelu'\]"),
    "norm-eps-text": ({"layer_norm_eps": "abc"}, r"layer_norm_eps: expected a finite number in \(0, 0.1\], got 'abc'"),
    "norm-eps-inf": ({"layer_norm_eps": INF}, r"layer_norm_eps: expected a finite number in \(0, 0.1\], got inf"),
    "dropout-text": ({"hidden_dropout_prob": "x"}, r"hidden_dropout_prob: expected a finite number in \[0, 1\), got 'x'"),
    "attn-dropout-nan": ({"attention_probs_dropout_prob": NAN}, r"attention_probs_dropout_prob: expected a finite number"),
    "mlp-width-text": ({"intermediate_size": "abc"},
                       r"intermediate_size: expected a whole number in \[1, 9007199254740992\], got 'abc'"),
    "channels-zero": ({"num_channels": 0}, r"num_channels: expected a whole number in \[1, 9007199254740992\], got 0"),
    "image-size-text": ({"image_size": [32, "x"]}, r"image_size: expected a whole number in \[1, 9007199254740992\], got 'x'"),
    "qkv-bias-text": ({"qkv_bias": "yes"}, r"qkv_bias: expected true or false, got 'yes'"),
}


def _predict_error(capsys, folder: Path, tmp_path: Path) -> str:
    """``vitkit predict FOLDER IMAGE``'s one error line (asserting exit 1, one line, no traceback)."""
    img = tmp_path / "img.png"
    if not img.exists():
        Image.new("RGB", (40, 56), (90, 120, 200)).save(img)
    assert main(["predict", str(folder), str(img), "--json", "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("vitkit: error: "), err
    return err[len("vitkit: error: "):]


@pytest.mark.parametrize("case", sorted(TIMM_BAD))
def test_a_bad_pretrained_cfg_field_is_one_line_naming_it(case, tmp_path, capsys):
    change, message = TIMM_BAD[case]
    folder = timm_folder(tmp_path / "tag", random_model(), pretrained_cfg={**PRETRAINED_CFG, **change})
    line = _predict_error(capsys, folder, tmp_path)
    assert re.fullmatch(re.escape(f"{folder / 'config.json'}: pretrained_cfg.") + message + ".*", line), line


@pytest.mark.parametrize("case", sorted(HF_PROCESSOR_BAD))
def test_a_bad_preprocessor_config_field_is_one_line_naming_it(case, tmp_path, capsys):
    change, message = HF_PROCESSOR_BAD[case]
    folder = hf_folder(tmp_path / "hf", random_model(), **change)
    line = _predict_error(capsys, folder, tmp_path)
    assert re.fullmatch(re.escape(f"{folder / 'preprocessor_config.json'}: ") + message + ".*", line), line


@pytest.mark.parametrize("case", sorted(HF_CONFIG_BAD))
def test_a_bad_hf_config_field_is_one_line_naming_it(case, tmp_path, capsys):
    change, message = HF_CONFIG_BAD[case]
    folder = hf_folder(tmp_path / "hf", random_model())
    config = folder / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **change}))
    line = _predict_error(capsys, folder, tmp_path)
    assert re.fullmatch(re.escape(f"{config}: ") + message + ".*", line), line


def test_sources_in_range_still_read_with_their_values(tmp_path):
    """The published forms at the edges of the ranges: crop_pct 1.0 and a test crop, a grey model's three
    ImageNet constants, one number for a mean, a processor's null switch (its default)."""
    cfg = dict(PRETRAINED_CFG, crop_pct=1.0, test_input_size=[3, 48, 48], test_crop_pct=0.95)
    model, info = read(timm_folder(tmp_path / "tag", random_model(), pretrained_cfg=cfg))
    assert model.preprocess.crop_pct == 1.0 and info["test"] == {"img_size": (48, 48), "crop_pct": 0.95}
    grey = from_pretrained_cfg(PRETRAINED_CFG, 1, "config.json")[0]
    assert grey.mean == (sum(IMAGENET["mean"]) / 3,) and grey.std == (sum(IMAGENET["std"]) / 3,)
    p = read(hf_folder(tmp_path / "hf", random_model(), image_mean=0.5, image_std=0.25, do_center_crop=None,
                       size=320))[0].preprocess
    assert (p.mean, p.std, p.crop_pct) == ((0.5,) * 3, (0.25,) * 3, 0.1)


def test_bad_fields_by_hub_name_are_one_line_naming_the_cached_file(tmp_path):
    """The same checks on models named hf-hub:ORG/NAME, read from the local Hub cache."""
    cache = tmp_path / "hub"
    timm_folder(cached_repo(cache, "org/nan-mean"), random_model(), pretrained_cfg=dict(PRETRAINED_CFG, mean=[NAN] * 3))
    hf_folder(cached_repo(cache, "org/huge-size"), random_model(), size={"height": 10**9, "width": 10**9})
    code = ("import json, vitkit\nout = []\n"
            "for name in ('hf-hub:org/nan-mean', 'hf-hub:org/huge-size'):\n"
            "    try:\n        vitkit.create_model(weights=name)\n        out.append('read')\n"
            "    except vitkit.VitkitError as e:\n        out.append(str(e))\n"
            "print(json.dumps(out))\n")
    nan_mean, huge = offline_json(cache, code)
    assert re.fullmatch(r".*models--org--nan-mean/snapshots/\w+/config\.json: pretrained_cfg\.mean\[0\]: expected a "
                        r"finite number in \[-10, 10\], got nan", nan_mean), nan_mean
    assert re.fullmatch(r".*models--org--huge-size/snapshots/\w+/preprocessor_config\.json: size\.height: expected a "
                        r"whole number in \[1, 16384\], got 1000000000", huge), huge


# ----------------------------------------------------------------------------------- the squash resize
def test_squash_resizes_each_side_and_every_reader_honours_it():
    x = torch.arange(3 * 20 * 50, dtype=torch.float32).reshape(1, 3, 20, 50) % 255
    squashed = resize_center_crop(x, (16, 16), 1.0, "bilinear", "squash")
    direct = torch.nn.functional.interpolate(x, size=(16, 16), mode="bilinear", antialias=True, align_corners=False)
    assert torch.equal(squashed, direct)
    # crop_pct < 1: each side to size / crop_pct (20 x 20), then the centre 16 x 16, as timm's crop_mode 'squash'
    big = torch.nn.functional.interpolate(x, size=(20, 20), mode="bilinear", antialias=True, align_corners=False)
    assert torch.equal(resize_center_crop(x, (16, 16), 0.8, "bilinear", "squash"), big[..., 2:18, 2:18])
    model = tiny_model()
    model.preprocess = model.preprocess.__class__(crop_pct=1.0, interpolation="bilinear", resize="squash")
    img = x[0].to(torch.uint8)
    direct_u8 = torch.nn.functional.interpolate(img[None].float(), size=(32, 32), mode="bilinear", antialias=True,
                                                align_corners=False)
    assert torch.allclose(to_model_input(img, (32, 32), model.preprocess), (direct_u8[0] / 255 - 0.5) / 0.5,
                          atol=1e-5)


@pytest.mark.parametrize("error, message", [
    ("RepositoryNotFoundError", "hf-hub:org/nope: no such model on the Hugging Face Hub (a private one needs a login"),
    ("RevisionNotFoundError", "hf-hub:org/nope@v9: no revision 'v9' in that repository on the Hugging Face Hub"),
    ("GatedRepoError", "hf-hub:org/nope: a gated repository: accept its terms on huggingface.co and log in"),
    ("ConnectError", "hf-hub:org/nope: download failed (ConnectError: boom)"),
])
def test_hub_errors_are_one_line_naming_the_name(monkeypatch, error, message):
    """huggingface_hub's errors, told apart by their class names (here a stand-in module raising them)."""
    import types

    from vitkit.core.errors import CheckpointError
    from vitkit.io import hub

    def snapshot_download(repo, **kw):
        raise type(error, (OSError,), {})("boom\nmore lines")

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=snapshot_download))
    monkeypatch.setattr(hub, "_resolved", {})
    name = "hf-hub:org/nope@v9" if error == "RevisionNotFoundError" else "hf-hub:org/nope"
    with pytest.raises(CheckpointError) as e:
        read(name)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
