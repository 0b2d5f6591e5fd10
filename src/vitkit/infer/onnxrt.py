"""ONNX: the exporter, and ONNX Runtime as an inference engine for the tools.

    from .onnxrt import OrtModel
    net = OrtModel(model, threads=2)      # exported in memory, an InferenceSession built on the CPU
    logits = net(images)                  # float (B, C, H, W) -> logits, as model(images)

``write_onnx`` is vitkit's one ONNX exporter: ``vitkit.tools.export`` writes files with it, ``OrtModel``
writes into memory (no file is left anywhere). It is torch's TorchScript-based exporter
(``dynamo=False``): the dynamo exporter needs the ``onnxscript`` package, which vitkit does not depend
on. The batch dimension is dynamic.

``OrtModel`` runs the exported graph with all of ONNX Runtime's graph optimizations (its fused
attention, LayerNorm and GELU kernels where its fusions match) on as many intra-op threads as torch
computes on, and checks itself: the first images of its first batch are also run through the eager
model, and a largest absolute difference of the logits above ``atol`` (1e-4) means the engine is not
used (see ``OrtModel``). Whether the tools use it at all is ``vitkit.infer.fastpath``'s rule (``ort_pays``).
"""

from __future__ import annotations

import importlib.util
import io
import os
import warnings
from typing import BinaryIO

import torch
from torch import nn

from ..core.errors import ExportError, VitkitWarning

ATOL = 1e-4  # the largest |onnxruntime - eager| logit difference accepted, as vitkit.tools.export checks files
CHECK_IMAGES = 4  # images of the first batch also run eagerly to check the engine (a bounded cost)


def onnxruntime_available() -> bool:
    """Whether the engine can run here: onnxruntime and onnx (the exporter's dependency) are installed.
    Looked up without importing them."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def write_onnx(model: nn.Module, example: torch.Tensor, file: str | os.PathLike | BinaryIO, opset: int = 18,
               dynamic_size: bool = False) -> None:
    """Export ``model`` traced on ``example`` to ``file`` (a path, or a binary stream such as BytesIO), with a
    dynamic batch dimension (and dynamic height and width with ``dynamic_size``). Input 'images', output
    'logits'. ExportError when the 'onnx' package is missing; the exporter's own errors pass through."""
    try:
        import onnx  # noqa: F401  (the exporter needs it)
    except ImportError:
        raise ExportError("ONNX export needs the 'onnx' package: pip install 'vitkit[onnx]'") from None
    axes = {0: "batch"}
    if dynamic_size:
        axes.update({2: "height", 3: "width"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings about shape checks that are constant per trace
        torch.onnx.export(
            model,
            (example,),
            file if isinstance(file, io.IOBase) else str(file),
            dynamo=False,
            input_names=["images"],
            output_names=["logits"],
            dynamic_axes={"images": axes, "logits": {0: "batch"}},
            opset_version=opset,
            do_constant_folding=True,
        )


def ort_session(source: bytes | str | os.PathLike, threads: int | None = None):
    """An onnxruntime InferenceSession on the CPU for an ONNX model (its bytes, or a file), silent (failures
    come back as exceptions), with every graph optimization on. ``threads``: intra-op threads (None:
    onnxruntime's default); its threads do not spin between runs, so that they leave the CPU to the image
    decoding around them. ExportError when onnxruntime is missing."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ExportError("running an ONNX model needs 'onnxruntime': pip install 'vitkit[onnx]'") from None
    ort.set_default_logger_severity(4)  # no log lines on stderr
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.inter_op_num_threads = 1
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = source if isinstance(source, bytes) else str(source)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def session_runner(sess):
    """A function images -> logits (CPU float tensors) over an InferenceSession."""
    name = sess.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(sess.run(None, {name: x.detach().cpu().float().contiguous().numpy()})[0])

    return run


def onnx_bytes(model: nn.Module, opset: int = 18) -> bytes:
    """``model`` exported to ONNX in memory, at its own image size (a batch of 2 traced: a batch of 1 lets
    the exporter specialise the batch dimension)."""
    cfg = model.cfg
    example = torch.randn(2, cfg.in_chans, *cfg.img_size, generator=torch.Generator().manual_seed(0))
    buf = io.BytesIO()
    write_onnx(model, example, buf, opset)
    return buf.getvalue()


def first_line(e: BaseException, limit: int) -> str:
    """An exception's message in one line of at most ``limit`` characters; onnxruntime's own messages
    without their source location."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    line = text.splitlines()[0]
    if "Status Message:" in line:
        line = line.split("Status Message:", 1)[1].strip()
        line = line.split(" was false. ", 1)[-1] if " was false. " in line else line
    return line[:limit]


class OrtModel(nn.Module):
    """``model`` run by ONNX Runtime: exported in memory, one InferenceSession on ``threads`` intra-op
    threads (default: torch's count). Called like the model: images (B, C, H, W) at the model's size ->
    float logits.

    The first batch is checked against the eager model (its first ``CHECK_IMAGES`` images). When the
    export or the session fails, or ONNX Runtime's logits differ from eager by more than ``atol``,
    ``strict`` (the engine was asked for) raises ExportError; otherwise the run goes on eager, and
    ``fallback`` says why in one line (also given as a VitkitWarning).
    """

    def __init__(self, model: nn.Module, threads: int | None = None, strict: bool = False, atol: float = ATOL):
        super().__init__()
        self.eager = model
        self.strict, self.atol = strict, atol
        self.checked = False
        self.fallback: str | None = None
        try:
            self.run = session_runner(ort_session(onnx_bytes(model), threads or torch.get_num_threads()))
        except ExportError as e:
            self._refuse(str(e))
        except Exception as e:  # noqa: BLE001 - an exporter's or onnxruntime's failure becomes one line
            self._refuse(f"export or session failed: {type(e).__name__}: {first_line(e, 200)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fallback is not None:
            return self.eager(x)
        got = self.run(x).to(x.device)
        if self.checked:
            return got
        self.checked = True
        with torch.no_grad():
            want = self.eager(x[:CHECK_IMAGES]).float()
        diff = float((got[:CHECK_IMAGES] - want).abs().max())
        if not diff <= self.atol:  # NaN fails too
            self._refuse(f"logits differ from eager by {diff:.3g} > {self.atol:g} on the first batch")
            return self.eager(x)
        return got

    def _refuse(self, why: str) -> None:
        """Stop using the engine: ExportError when it was asked for, else eager from now on, with a warning."""
        if self.strict:
            raise ExportError(f"engine: onnxruntime: {why}")
        self.fallback = f"{why}; ran torch instead"
        warnings.warn(f"onnxruntime: {self.fallback}", VitkitWarning, stacklevel=3)


__all__ = ["OrtModel", "ATOL", "CHECK_IMAGES", "onnxruntime_available", "write_onnx", "ort_session", "session_runner",
           "onnx_bytes", "first_line"]
