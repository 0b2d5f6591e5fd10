"""Export a model to ONNX, TorchScript or a torch.export ExportedProgram, checked against eager.

    from .export import export
    report = export("ckpt/", "model.onnx", fmt="onnx")     # raises ExportError if the check fails
    report["max_abs_diff"]                                  # worst |export - eager| over the checks

Every export has a dynamic batch dimension. Before success is reported the exported file is loaded
back (onnxruntime for ONNX, torch.jit.load, torch.export.load) and compared with the eager model on
at least two batch sizes (and two image sizes with ``dynamic_size``): the largest absolute difference
of the logits must be at most ``atol`` (1e-4 in float32).

ONNX is written by ``vitkit.infer.onnxrt.write_onnx`` (torch's TorchScript-based exporter) and checked with
``vitkit.infer.onnxrt.ort_session``, the exporter and the session that ONNX Runtime as an engine uses too.

Dynamic image size needs a model built with ``dynamic_img_size=True``: under an exporter such a model
records the position-embedding resampling in the graph, so one file takes any multiple of the patch
size; the check at a second size proves it.
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from pathlib import Path

import torch

from ..core.errors import ExportError
from ..infer.onnxrt import first_line, ort_session, session_runner, write_onnx
from .loading import load_model

FORMATS = ("onnx", "torchscript", "exported-program")
SUFFIX = {"onnx": ".onnx", "torchscript": ".pt", "exported-program": ".pt2"}


def _check_sizes(model, dynamic_size: bool) -> list[tuple[int, int]]:
    """Image sizes to check: the model's own, plus a different one (a multiple of P) when dynamic."""
    cfg = model.cfg
    h, w = cfg.img_size
    if not dynamic_size:
        return [(h, w)]
    P = cfg.patch_size
    # a size with a different grid in both directions and a different aspect ratio
    return [(h, w), (h + P, max(P, w - P) if w > P else w + 2 * P)]


def _inputs(model, batch_sizes, sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    C = model.cfg.in_chans
    return [torch.randn(b, C, h, w, generator=g) for (h, w) in sizes for b in batch_sizes]


# --------------------------------------------------------------------------------------- writers
def _export_torchscript(model, example, file: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, (example,), check_trace=False)
    torch.jit.save(traced, str(file))


def _export_program(model, example, file: Path, dynamic_size: bool) -> None:
    P = model.cfg.patch_size
    dims = {0: torch.export.Dim("batch", min=1, max=65536)}
    if dynamic_size:
        # height and width as multiples of the patch size, so that the grid is an integer
        dims[2] = P * torch.export.Dim("grid_h", min=1, max=1024)
        dims[3] = P * torch.export.Dim("grid_w", min=1, max=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, (example,), dynamic_shapes={"x": dims})
    torch.export.save(ep, str(file))


# --------------------------------------------------------------------------------------- runners
def _runner(fmt: str, file: Path):
    """A function images -> logits that runs the exported file as a user would."""
    if fmt == "onnx":
        try:
            return session_runner(ort_session(file))
        except ExportError as e:
            raise ExportError(f"checking an ONNX export: {e} (or pass check=False)") from None
    if fmt == "torchscript":
        m = torch.jit.load(str(file), map_location="cpu").eval()
    else:
        m = torch.export.load(str(file)).module()

    def run(x):
        with torch.no_grad():
            return m(x)

    return run


def check_export(model, fmt: str, file: str | os.PathLike, batch_sizes=(1, 3), dynamic_size: bool = False,
                 atol: float = 1e-4) -> dict:
    """Compare an exported file with the eager model; a dict with one row per checked input shape."""
    file = Path(file)
    run = _runner(fmt, file)
    rows = []
    for x in _inputs(model, batch_sizes, _check_sizes(model, dynamic_size), seed=1):
        with torch.no_grad():
            ref = model(x).float()
        shape = list(x.shape)
        try:
            got = run(x).float()
        except Exception as e:  # noqa: BLE001 - a runtime's own error is the finding
            rows.append(dict(shape=shape, max_abs_diff=None, error=first_line(e, 200)))
            continue
        if tuple(got.shape) != tuple(ref.shape):
            rows.append(dict(shape=shape, max_abs_diff=None, error=f"output {tuple(got.shape)} != {tuple(ref.shape)}"))
            continue
        rows.append(dict(shape=shape, max_abs_diff=float((got - ref).abs().max())))
    diffs = [r["max_abs_diff"] for r in rows if r["max_abs_diff"] is not None]
    ok = len(diffs) == len(rows) and max(diffs) <= atol
    return dict(ok=ok, atol=atol, max_abs_diff=max(diffs) if diffs else None, checks=rows)


def export(
    model_or_path,
    out: str | os.PathLike,
    fmt: str = "onnx",
    *,
    opset: int = 18,
    dynamic_size: bool = False,
    check: bool = True,
    batch_sizes: tuple[int, ...] = (1, 3),
    atol: float = 1e-4,
) -> dict:
    """Export ``model_or_path`` (a module, checkpoint or run directory) to ``out`` in format ``fmt``.

    Returns {"format", "out", "bytes", "dynamic_batch", "dynamic_size", "check": {...}}. Raises
    ExportError if the export fails or the check finds a difference above ``atol``; the file is only
    left at ``out`` when the check passes (it is written next to it and renamed).
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if not 0 <= atol < math.inf:  # NaN would fail every check, infinity pass any
        raise ExportError(f"--atol: must be a finite number >= 0, got {atol}")
    if len(set(batch_sizes)) < 2 and check:
        raise ExportError(f"batch_sizes: the check needs at least two batch sizes, got {tuple(batch_sizes)}")
    model = load_model(model_or_path, "cpu").float()
    cfg = model.cfg
    out = Path(out)
    _check_target(cfg, fmt, out, dynamic_size)
    tmpdir = _private_dir(out)
    tmp = tmpdir / out.name
    try:
        _write(model, fmt, tmp, opset, dynamic_size)
        result = dict(
            format=fmt,
            out=str(out),
            bytes=tmp.stat().st_size,
            dynamic_batch=True,
            dynamic_size=dynamic_size,
            opset=opset if fmt == "onnx" else None,
            check=None,
        )
        if check:
            result["check"] = _verify(model, fmt, tmp, batch_sizes, dynamic_size, atol)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return result


def _private_dir(out: Path) -> Path:
    """The folder next to ``out`` to write it in under its final name (torch.export.load wants the .pt2
    suffix); checked, then renamed over ``out``, so that a failed export or check leaves ``out`` untouched.
    One that a killed export left is removed by the next; a folder that cannot be written is one line."""
    from ..core.errors import CheckpointError
    from ..io.atomic import ensure_dir, private_dir

    try:
        ensure_dir(out.parent)
        return private_dir(out)
    except CheckpointError as e:
        raise ExportError(f"--out: {e}") from None


def _check_target(cfg, fmt: str, out: Path, dynamic_size: bool) -> None:
    """Refuse, before any work, a dynamic size the model cannot take and an ``out`` that cannot be written."""
    if dynamic_size and not cfg.dynamic_img_size:
        raise ExportError(
            f"--dynamic-size: the model was built with dynamic_img_size=False (fixed {cfg.img_size[0]}x"
            f"{cfg.img_size[1]} input); rebuild it with dynamic_img_size=True, or export at a fixed size"
        )
    if fmt == "exported-program" and out.suffix != ".pt2":
        raise ExportError(f"--out: {out}: an ExportedProgram file must end in .pt2 (torch.export.load requires it)")
    if out.is_dir():
        raise ExportError(f"--out: {out} is a directory; give a file name such as model{SUFFIX[fmt]}")


def _write(model, fmt: str, file: Path, opset: int, dynamic_size: bool) -> None:
    """Export ``model`` to ``file``; an exporter's failure becomes a one-line ExportError."""
    cfg = model.cfg
    # Example batch of 2 (a batch of 1 lets some exporters specialise the batch dimension).
    example = torch.randn(2, cfg.in_chans, *cfg.img_size, generator=torch.Generator().manual_seed(0))
    try:
        if fmt == "onnx":
            write_onnx(model, example, file, opset, dynamic_size)
        elif fmt == "torchscript":
            _export_torchscript(model, example, file)
        else:
            _export_program(model, example, file, dynamic_size)
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001 - exporter failures become one line
        hint = _dynamic_hint(cfg) if dynamic_size else ""
        raise ExportError(f"{fmt} export failed: {type(e).__name__}: {first_line(e, 300)}{hint}") from None


def _verify(model, fmt: str, file: Path, batch_sizes, dynamic_size: bool, atol: float) -> dict:
    """``check_export``'s report; ExportError naming the first input shape that does not match."""
    res = check_export(model, fmt, file, batch_sizes, dynamic_size, atol)
    if not res["ok"]:
        cfg = model.cfg
        first = next(r for r in res["checks"] if r["max_abs_diff"] is None or r["max_abs_diff"] > atol)
        shape = "x".join(map(str, first["shape"]))
        what = first.get("error") or f"max abs difference {first['max_abs_diff']:.3g} > {atol:g}"
        hint = _dynamic_hint(cfg) if dynamic_size and first["shape"][2:] != list(cfg.img_size) else ""
        raise ExportError(f"{fmt} export does not match the eager model on input {shape}: {what}{hint}")
    return res


def _dynamic_hint(cfg) -> str:
    return (
        f" (the exported graph does not hold at sizes other than {cfg.img_size[0]}x{cfg.img_size[1]}; "
        "export without --dynamic-size)"
    )


__all__ = ["export", "check_export", "ExportError", "FORMATS"]
