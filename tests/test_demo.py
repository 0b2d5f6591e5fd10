"""`vitkit demo`: the model shipped in the package reads the built-in test digits, and the command shows them."""

import re
import tomllib
from pathlib import Path

import torch

from vitkit.cli.main import main
from vitkit.tools.demo import DEMO_MODEL, ascii_art, classify, demo_digits, load_demo_model

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_model_is_a_current_checkpoint_in_the_package_data():
    """Loaded as every checkpoint is (so it follows the checkpoint format), and listed for the wheel."""
    assert sorted(p.name for p in DEMO_MODEL.iterdir()) == ["vitkit.json", "vitkit.safetensors"]
    model = load_demo_model()
    assert model.labels == [str(i) for i in range(10)] and model.cfg.img_size == (28, 28)
    assert sum(p.numel() for p in model.parameters()) < 200_000
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["vitkit"]
    assert "data/demo/model/*" in patterns


def test_the_shipped_model_reads_test_digits_it_never_saw():
    images, labels = demo_digits(400, start=1000)
    assert images.shape == (400, 1, 28, 28) and images.dtype == torch.uint8
    acc = (classify(load_demo_model(), images).argmax(1) == labels).float().mean().item()
    assert acc >= 0.95, acc


def test_ascii_art_draws_bright_pixels_dense():
    img = torch.zeros(1, 4, 6, dtype=torch.uint8)
    img[0, :2, 3:] = 255  # the top-right block
    assert ascii_art(img) == ["   @@@", ""]


def test_demo_prints_digits_with_their_top3_then_points_to_train(capsys):
    assert main(["demo", "-n", "2", "--start", "5"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("A 0.13M-parameter ViT, trained for 2 minutes on the built-in digits, reads 2 test")
    assert out.count("true: ") == 2
    tops = [m.group(1) for m in re.finditer(r"^.*\s{3}\s*(\d) +\d+\.\d%$", out, re.M)]
    assert len(tops) == 6  # three guesses for each digit
    _, labels = demo_digits(2, start=5)
    assert [int(t) for t in tops[::3]] == labels.tolist()  # the shipped model reads both right
    assert sum(any(c in line for c in "#%@") for line in lines) >= 10  # the digits are drawn
    assert lines[-1].startswith("Train your own: `vitkit train`")
