"""decode_image / list_images / to_model_input, and the bad-input corpus (built in tmp_path)."""

import io
import os

import numpy as np
import pytest
import torch
from helpers import noise_image, png_header_only
from PIL import Image, features

import vitkit
from vitkit.core.errors import DataError, ShapeError
from vitkit.data import decode_image, list_images, to_model_input
from vitkit.data.images import DEFAULT_MAX_PIXELS, show_path


def _save(path, im, **kw):
    im.save(path, **kw)
    return path


# ------------------------------------------------------------------------------------------------
# good images in every mode
def test_rgb_and_grey_png_exact(tmp_path):
    im = noise_image(5, 7)
    p = _save(tmp_path / "a.png", im)
    x = decode_image(p, 3)
    assert x.dtype == torch.uint8 and x.shape == (3, 5, 7)
    assert torch.equal(x, torch.from_numpy(np.array(im)).permute(2, 0, 1))
    g = decode_image(p, 1)
    assert g.shape == (1, 5, 7)
    assert torch.equal(g[0], torch.from_numpy(np.array(im.convert("L"))))
    # grey file to 3 channels: the value repeated
    q = _save(tmp_path / "g.png", noise_image(4, 4, channels=1))
    x3 = decode_image(q, 3)
    assert torch.equal(x3[0], x3[1]) and torch.equal(x3[1], x3[2])


@pytest.mark.parametrize("ext,kw", [(".jpg", {"quality": 95}), (".bmp", {}), (".gif", {}), (".webp", {"lossless": True}),
                                    (".tif", {})])
def test_formats(tmp_path, ext, kw):
    if ext == ".webp" and not features.check("webp"):
        pytest.skip("Pillow built without WebP")
    im = Image.new("RGB", (6, 4), (200, 30, 60))
    x = decode_image(_save(tmp_path / f"a{ext}", im, **kw), 3)
    assert x.shape == (3, 4, 6)
    assert (x.float().mean((1, 2)) - torch.tensor([200.0, 30, 60])).abs().max() <= 6  # jpeg / gif palette: close


def test_content_wins_over_extension(tmp_path):
    p = tmp_path / "really_a_png.jpg"
    Image.new("L", (3, 2), 77).save(p, format="PNG")
    assert decode_image(p, 1).flatten().tolist() == [77] * 6


def test_rgba_and_palette_transparency_composite_on_white(tmp_path):
    a = np.zeros((2, 2, 4), np.uint8)
    a[0, 0] = (255, 0, 0, 0)  # fully transparent red -> white
    a[0, 1] = (255, 0, 0, 255)  # opaque red
    a[1, 0] = (0, 0, 0, 128)  # half-transparent black -> mid grey
    p = _save(tmp_path / "rgba.png", Image.fromarray(a, "RGBA"))
    x = decode_image(p, 3)
    assert x[:, 0, 0].tolist() == [255, 255, 255]
    assert x[:, 0, 1].tolist() == [255, 0, 0]
    assert all(abs(v - 127) <= 1 for v in x[:, 1, 0].tolist())
    # palette with a transparent index
    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 255, 0, 255, 0] + [0] * 762)
    pal.putpixel((0, 0), 0)
    pal.putpixel((1, 0), 1)
    q = _save(tmp_path / "pal.png", pal, transparency=0)
    y = decode_image(q, 3)
    assert y[:, 0, 0].tolist() == [255, 255, 255] and y[:, 0, 1].tolist() == [0, 255, 0]
    assert decode_image(q, 1)[0, 0, 0].item() == 255


def test_cmyk_jpeg(tmp_path):
    p = _save(tmp_path / "cmyk.jpg", Image.new("CMYK", (8, 8), (0, 255, 255, 0)), quality=95)
    x = decode_image(p, 3)
    assert x.shape == (3, 8, 8)
    assert (x.float().mean((1, 2)) - torch.tensor([255.0, 0, 0])).abs().max() <= 8


def test_16bit_png_scaled_to_8bit(tmp_path):
    a = np.array([[0, 65535, 128 * 257, 257]], dtype=np.uint16)
    p = _save(tmp_path / "deep.png", Image.fromarray(a))
    assert Image.open(p).mode.startswith("I")
    x = decode_image(p, 1)
    assert x[0, 0].tolist() == [0, 255, 128, 1]
    assert decode_image(p, 3).shape == (3, 1, 4)


def test_rare_modes(tmp_path):
    cases = [
        ("bits.png", Image.new("1", (3, 2), 1), 255),
        ("la.png", Image.new("LA", (3, 2), (100, 0)), 255),  # fully transparent -> white
        ("float.tif", Image.fromarray(np.full((2, 3), 0.5, np.float32)), 128),  # floats in 0..1
        ("lab.tif", Image.new("LAB", (3, 2), (128, 128, 128)), 119),  # L* = 50 is sRGB grey 119
        ("ycc.jpg", Image.new("YCbCr", (3, 2), (128, 128, 128)), 128),
    ]
    for name, im, grey in cases:
        im.save(tmp_path / name)
        x = decode_image(tmp_path / name, 3)
        assert x.shape == (3, 2, 3), name
        assert int((x.int() - grey).abs().max()) <= 1, (name, x[:, 0, 0].tolist())


def test_exif_rotation_applied(tmp_path):
    a = np.zeros((8, 16), np.uint8)
    a[:, :8] = 255  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    p = _save(tmp_path / "rot.jpg", Image.fromarray(a, "L"), exif=exif.tobytes(), quality=95)
    x = decode_image(p, 1)
    assert x.shape == (1, 16, 8)  # height and width swapped
    assert x[0, :8].float().mean() > 200 and x[0, 8:].float().mean() < 50  # the left side is now on top


def test_one_pixel_and_animated_gif_first_frame(tmp_path):
    assert decode_image(_save(tmp_path / "one.png", Image.new("L", (1, 1), 9)), 1).tolist() == [[[9]]]
    frames = [Image.new("RGB", (4, 4), (255, 0, 0)), Image.new("RGB", (4, 4), (0, 0, 255))]
    p = tmp_path / "anim.gif"
    frames[0].save(p, save_all=True, append_images=frames[1:], duration=50)
    assert Image.open(p).n_frames == 2
    x = decode_image(p, 3)
    assert x[:, 0, 0].tolist() == [255, 0, 0]


def test_non_utf8_file_name(tmp_path):
    name = os.fsencode(str(tmp_path)) + b"/caf\xe9.png"
    buf = io.BytesIO()
    Image.new("L", (3, 2), 7).save(buf, format="PNG")
    with open(name, "wb") as f:
        f.write(buf.getvalue())
    assert decode_image(name, 1).shape == (1, 2, 3)
    assert decode_image(os.fsdecode(name), 1).shape == (1, 2, 3)
    with open(name, "wb") as f:
        f.write(b"not an image at all")
    with pytest.raises(DataError, match=r"caf\\xe9\.png: a text file, not an image") as e:
        decode_image(name, 1)
    str(e.value).encode("utf-8")  # printable: no lone surrogates
    assert list_images([os.fsdecode(name)])[0].name == os.fsdecode(b"caf\xe9.png")


# ------------------------------------------------------------------------------------------------
# the bad-input corpus
def test_zero_byte_file(tmp_path):
    p = tmp_path / "empty.jpg"
    p.write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.jpg: empty file \(0 bytes\)$"):
        decode_image(p, 3)


def test_truncated_jpeg_and_png(tmp_path):
    for ext in ("jpg", "png"):
        buf = io.BytesIO()
        noise_image(64, 64).save(buf, format="JPEG" if ext == "jpg" else "PNG")
        p = tmp_path / f"cut.{ext}"
        p.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
        with pytest.raises(DataError, match=rf"cut\.{ext}: truncated or corrupt image data"):
            decode_image(p, 3)


def test_html_and_text_named_jpg(tmp_path):
    p = tmp_path / "page.jpg"
    p.write_text("<!DOCTYPE html><html><body>404 Not Found</body></html>")
    with pytest.raises(DataError, match=r"page\.jpg: an HTML page, not an image$"):
        decode_image(p, 3)
    q = tmp_path / "notes.png"
    q.write_text("hello")
    with pytest.raises(DataError, match=r"notes\.png: a text file, not an image$"):
        decode_image(q, 3)
    r = tmp_path / "noise.png"
    r.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(DataError, match=r"noise\.png: not a recognised image format$"):
        decode_image(r, 3)


def test_directory_missing_and_broken_symlink(tmp_path):
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(DataError, match=r"folder\.png: is a directory, not an image file$"):
        decode_image(tmp_path / "folder.png", 3)
    with pytest.raises(DataError, match=r"nothere\.png: no such file$"):
        decode_image(tmp_path / "nothere.png", 3)
    os.symlink(tmp_path / "gone.png", tmp_path / "link.png")
    with pytest.raises(DataError, match=r"link\.png: broken symbolic link \(points to .*gone\.png\)$"):
        decode_image(tmp_path / "link.png", 3)


def test_decompression_bomb_refused_unless_allowed(tmp_path):
    p = png_header_only(tmp_path / "bomb.png", 20000, 20000)
    with pytest.raises(DataError, match=r"bomb\.png: 400000000 pixels exceeds max_pixels=89478485 \(possible decompression bomb; raise max_pixels if the file is trusted\)$"):
        decode_image(p, 1)
    # between Pillow's warning and error thresholds: the warning is an error too
    q = png_header_only(tmp_path / "big.png", 10000, 10000)
    with pytest.raises(DataError, match=r"big\.png: 100000000 pixels exceeds max_pixels=89478485 \(possible decompression bomb"):
        decode_image(q, 1)
    with pytest.raises(DataError, match=r"big\.png: 100000000 pixels exceeds max_pixels=1000 \(possible decompression bomb"):
        decode_image(q, 1, max_pixels=1000)
    # a raised limit lets the header through; this file then fails on its (missing) data, not as a bomb
    with pytest.raises(DataError, match=r"bomb\.png: (truncated|cannot read|corrupt)") as e:
        decode_image(p, 1, max_pixels=None)
    assert "bomb (" not in str(e.value)
    assert Image.MAX_IMAGE_PIXELS == DEFAULT_MAX_PIXELS  # the global limit is restored


def test_bad_channels_argument(tmp_path):
    p = _save(tmp_path / "a.png", Image.new("L", (2, 2)))
    with pytest.raises(DataError, match=r"a\.png: channels must be 1 \(grey\) or 3 \(RGB\), got 4"):
        decode_image(p, 4)


# ------------------------------------------------------------------------------------------------
def test_list_images(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for n in ("d/b.png", "d/a.JPG", "d/sub/c.webp", "d/readme.txt", "d/.hidden.png"):
        (tmp_path / n).write_bytes(b"x")
    got = [p.relative_to(tmp_path).as_posix() for p in list_images([str(tmp_path / "d")])]
    assert got == ["d/a.JPG", "d/b.png", "d/sub/c.webp"]
    assert [p.name for p in list_images([str(tmp_path / "d")], recursive=False)] == ["a.JPG", "b.png"]
    assert [p.name for p in list_images([str(tmp_path / "d" / "*.png"), str(tmp_path / "d" / "b.png")])] == ["b.png"]
    with pytest.raises(DataError, match=r"nope: no such file or folder$"):
        list_images([str(tmp_path / "nope")])
    with pytest.raises(DataError, match=r"\*\.gif: pattern matches no image files$"):
        list_images([str(tmp_path / "d" / "*.gif")])
    (tmp_path / "e").mkdir()
    with pytest.raises(DataError, match=r"e: folder has no image files"):
        list_images([str(tmp_path / "e")])


def test_to_model_input_resize_crop_normalise():
    pre = vitkit.Preprocess(mean=(0.5,), std=(0.25,), crop_pct=1.0, interpolation="bilinear")
    img = torch.full((1, 10, 20), 153, dtype=torch.uint8)
    x = to_model_input(img, (8, 8), pre)
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32
    torch.testing.assert_close(x, torch.full((1, 8, 8), (153 / 255 - 0.5) / 0.25), atol=1e-5, rtol=0)
    # same size: only the normalisation
    img = torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8)
    pre3 = vitkit.Preprocess()
    torch.testing.assert_close(to_model_input(img, (4, 4), pre3), (img.float() / 255 - 0.5) / 0.5, atol=1e-6, rtol=0)
    # crop_pct: resize the short side to 4 / 0.5 = 8, keep the centre 4x4 -> a 2x upscale of the centre 2x2
    img = torch.zeros((1, 4, 4), dtype=torch.uint8)
    img[:, 1:3, 1:3] = 255
    out = to_model_input(img, (4, 4), vitkit.Preprocess(mean=(0.0,), std=(1.0,), crop_pct=0.5, interpolation="nearest"))
    torch.testing.assert_close(out, torch.ones(1, 4, 4))
    with pytest.raises(ShapeError, match=r"to_model_input: expected dtype uint8"):
        to_model_input(img.float(), (4, 4), pre)
    with pytest.raises(ShapeError, match=r"to_model_input: expected a uint8 tensor \(C, H, W\), got shape \(4, 4\)"):
        to_model_input(img[0], (4, 4), pre)


def test_to_model_input_matches_a_pillow_eval_transform():
    """Resize(floor(32 / 0.875) = 36) + CenterCrop(32) done with Pillow's bicubic filter, as timm's eval
    transform does: the same geometry, values within 2 levels out of 255."""
    rng = np.random.default_rng(1)
    a = (rng.random((48, 64, 3)) * 80 + np.linspace(0, 150, 64)[None, :, None]).astype(np.uint8)  # smooth-ish
    im = Image.fromarray(a)
    ref = im.resize((48, 36), Image.BICUBIC)  # short side 36, long int(64 * 36 / 48) = 48
    ref = np.asarray(ref.crop((8, 2, 40, 34)), dtype=np.float32)  # left round(16/2)=8, top round(4/2)=2
    pre = vitkit.Preprocess(mean=(0.0,) * 3, std=(1.0,) * 3, crop_pct=0.875, interpolation="bicubic")
    got = to_model_input(torch.from_numpy(a).permute(2, 0, 1).contiguous(), (32, 32), pre) * 255
    assert got.shape == (3, 32, 32)
    assert float((got.permute(1, 2, 0) - torch.from_numpy(ref)).abs().max()) <= 2.0


def test_show_path_escapes_undecodable_bytes():
    assert show_path(b"/x/caf\xe9.png") == "/x/caf\\xe9.png"


def test_damaged_files_only_ever_raise_data_error(tmp_path):
    """Seeded byte mutations (flips, cuts, insertions) of small images in six formats: each file either
    decodes or raises a one-line DataError that starts with its path; nothing else escapes."""
    import random
    import warnings

    srcs = {}
    for fmt, ext in (("JPEG", "jpg"), ("PNG", "png"), ("GIF", "gif"), ("BMP", "bmp"), ("TIFF", "tif"), ("WEBP", "webp")):
        if fmt == "WEBP" and not features.check("webp"):
            continue
        buf = io.BytesIO()
        noise_image(12, 12).save(buf, format=fmt)
        srcs[ext] = buf.getvalue()
    r = random.Random(0)
    outcomes = {"ok": 0, "error": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warnings leak out of decode_image
        for i in range(200):
            ext = r.choice(sorted(srcs))
            d = bytearray(srcs[ext])
            for _ in range(r.randint(1, 6)):
                if not d:
                    break
                k = r.random()
                if k < 0.6:
                    d[r.randrange(len(d))] = r.randrange(256)
                elif k < 0.8:
                    del d[r.randrange(len(d)):]
                else:
                    p = r.randrange(len(d))
                    d[p:p] = bytes(r.randrange(256) for _ in range(r.randint(1, 16)))
            f = tmp_path / f"m{i}.{ext}"
            f.write_bytes(bytes(d))
            try:
                decode_image(f, 3)
                outcomes["ok"] += 1
            except DataError as e:
                assert str(e).startswith(f"{f}: ") and "\n" not in str(e), str(e)
                outcomes["error"] += 1
    assert outcomes["ok"] > 20 and outcomes["error"] > 100


def test_small_images_enlarged_to_a_square_read_whole_whatever_their_sizes(tmp_path):
    """An image enlarged to the evaluation's size: where the scale computed back gives its binding side a hair
    more than it has (13x13 -> 73x73; 30x33 -> 73x73, as 8% of GTSRB's test photos), the crop box stays inside
    it, and every such image is read, none skipped as corrupt."""
    import numpy as np
    from PIL import Image

    from vitkit.data.images import decode_array

    g = np.random.default_rng(0)
    for w, h in [(13, 13), (30, 33), (13, 22), (47, 45), (25, 31), (119, 118)]:
        px = g.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(px).save(tmp_path / f"{w}x{h}.png")
        for out in (64, 73, 224):
            a = decode_array(tmp_path / f"{w}x{h}.png", 3, None, size=(out, out))
            assert a.shape == (out, out, 3), (w, h, out)
    whole = np.array(Image.open(tmp_path / "13x13.png").resize((73, 73), Image.BICUBIC))
    assert np.array_equal(decode_array(tmp_path / "13x13.png", 3, None, size=(73, 73)), whole)  # a square: all of it
