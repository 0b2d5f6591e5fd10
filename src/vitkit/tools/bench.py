"""Measure a model: throughput, latency, peak memory, FLOPs per image and MFU.

    from .bench import bench
    res = bench("vit_base_patch16_224", batch_sizes=(1, 32), dtypes=("fp32", "bf16"), modes=("infer", "train"))
    res["rows"][0]["images_per_s"], res["flops_per_image"]

For every (mode, dtype, batch size): ``warmup`` untimed steps, then ``repeats`` timed steps; latency
p50 / p95 / min / max / IQR are over the timed steps and throughput is batch / p50. A training step is
forward + cross-entropy + backward + AdamW step. Each row runs on the path the tools and training take
for that dtype (``vitkit.infer.fastpath``, on torch; given as the row's "path"): bf16 under autocast, for CPU
inference on a packed bf16 copy where that pays; a conv stem channels-last where that pays; int8 is
dynamic quantization of the Linear layers (``vitkit.infer.quantize``: int8 per-channel weights, activations
quantized on the fly; CPU, inference only); compiled only when asked.

FLOPs are counted with torch's FlopCounterMode on the model's manual attention path: the counter
does not see F.scaled_dot_product_attention on CPU in every torch version, and would miss the two
attention matmuls (2 * 2 * T^2 * D per block). ``vit_flops`` gives the same figure analytically for
a standard ViT. One multiply-add is 2 FLOPs. A training step is counted as 3x the forward.

MFU = achieved FLOP/s / peak FLOP/s, where the peak is measured on the spot: the best of a few large
square matmuls in the benchmark's dtype (fp32 or bf16) on the same device and thread count.
"""

from __future__ import annotations

import copy
import math
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from ..core.errors import ConfigError
from ..core.hardware import resolve_device
from ..core.strict import to_hw
from ..infer.fastpath import FastPath, vit_flops
from ..infer.paths import apply_path, autocast, inference_path, path_taken, pick_precision, training_path
from ..infer.quantize import int8_available
from ..model.vit import count_params
from .loading import load_model

DTYPES = ("fp32", "bf16", "int8")
MODES = ("infer", "train")


# ------------------------------------------------------------------------------------------- FLOPs
def count_flops(model, img_size: tuple[int, int] | None = None) -> int:
    """Forward FLOPs of one image, counted by FlopCounterMode on the manual attention path."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = model.cfg
    H, W = img_size or cfg.img_size
    p = next(model.parameters())
    x = torch.zeros(1, cfg.in_chans, H, W, device=p.device, dtype=p.dtype)
    was = model.training
    model.eval()
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model.forward_with_attention(x)  # manual attention: QK^T and AV are visible matmuls
    model.train(was)
    return int(fc.get_total_flops())


# ------------------------------------------------------------------------------------------ timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _stats(times: list[float]) -> dict:
    return dict(
        p50_ms=_percentile(times, 0.5) * 1e3,
        p95_ms=_percentile(times, 0.95) * 1e3,
        min_ms=min(times) * 1e3,
        max_ms=max(times) * 1e3,
        iqr_ms=(_percentile(times, 0.75) - _percentile(times, 0.25)) * 1e3,
    )


def measure_peak_flops(dtype: str, device: torch.device, budget_s: float = 1.0) -> float:
    """Peak matmul FLOP/s for ``dtype`` ('fp32' or 'bf16') on ``device``: square matmuls of growing size
    (up to 4096 on CPU, 8192 on CUDA) until one takes a while; the best rate of three timed runs."""
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    max_n = 8192 if device.type == "cuda" else 4096
    best, n = 0.0, 256
    t_start = time.perf_counter()
    while True:
        a = torch.randn(n, n, device=device).to(tdtype)
        b = torch.randn(n, n, device=device).to(tdtype)
        a @ b  # warm-up (kernel selection, allocation)
        _sync(device)
        rates = []
        for _ in range(3):
            t0 = time.perf_counter()
            a @ b
            _sync(device)
            dt = time.perf_counter() - t0
            rates.append(2 * n**3 / dt)
        best = max(best, max(rates))
        if n >= max_n or dt > 0.05 or time.perf_counter() - t_start > budget_s:
            return best
        n *= 2


class _PeakMemory:
    """Peak memory of a block of work: CUDA max_memory_allocated, or on CPU the process's resident set
    high-water mark (VmHWM, reset through /proc/self/clear_refs on Linux; else getrusage's ru_maxrss,
    which cannot be reset and so is the process peak so far)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.how = None
        self.base = None  # resident set size when the run started (CPU), MiB

    @staticmethod
    def _status(key: str) -> float | None:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024  # kB -> MiB
        return None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.how = "cuda max_memory_allocated"
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # reset the peak resident set size to the current one
                self.how = "peak RSS (VmHWM, reset per run)"
                self.base = self._status("VmRSS:")
            except OSError:
                self.how = "process peak RSS (ru_maxrss)"
        return self

    def __exit__(self, *exc):
        return False

    def peak_mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.how and self.how.startswith("peak RSS"):
            return self._status("VmHWM:")
        import resource
        import sys

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / 2**20 if sys.platform == "darwin" else r / 1024  # bytes on macOS, kB on Linux


# ------------------------------------------------------------------------------------------- bench
_INT8_NOTE = "int8: dynamic quantization of Linear layers (weights int8), inference only"


def _resolve_model(model_or_name, img_size, device):
    """A module, a registered model name (random weights, seed 0) or a checkpoint / run directory, at
    ``img_size`` (a fixed-size model is resampled) and in eval mode on ``device``; and its name."""
    from ..model.variants import REGISTRY, build_model

    if isinstance(model_or_name, str) and model_or_name in REGISTRY:
        over = {"img_size": img_size} if img_size else {}
        return build_model(model_or_name, seed=0, **over).to(device).eval(), model_or_name
    source = type(model_or_name).__name__ if isinstance(model_or_name, torch.nn.Module) else str(model_or_name)
    model = load_model(model_or_name, device)
    if img_size and tuple(model.cfg.img_size) != tuple(img_size) and not model.cfg.dynamic_img_size:
        model.resample_to(img_size)
    return model, source


def _check_options(dtypes, modes, batch_sizes, repeats: int, warmup: int) -> None:
    for d in dtypes:
        if d not in DTYPES + ("auto",):
            raise ConfigError(f"--dtype: {d!r} is not one of {', '.join(DTYPES + ('auto',))}")
    for m in modes:
        if m not in MODES:
            raise ConfigError(f"--mode: {m!r} is not one of {', '.join(MODES)}")
    if not batch_sizes or any(int(b) < 1 for b in batch_sizes):
        raise ConfigError(f"--batch-sizes: every batch size must be >= 1, got {list(batch_sizes)}")
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"--repeats must be >= 1 and --warmup >= 0, got {repeats} and {warmup}")


def bench(
    model_or_name,
    batch_sizes=(1, 32),
    img_size: int | tuple[int, int] | None = None,
    dtypes=("fp32",),
    modes=("infer",),
    repeats: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    compile: bool = False,
    device: str = "cpu",
    peak: bool = True,
) -> dict:
    """Benchmark a model; returns {"model", "device", "flops_per_image", "peak_flops", "auto_dtype", "rows": [...]}.

    ``dtypes`` may name 'auto': the precision the tools and training pick for this model on this device
    (``vitkit.infer.fastpath``), measured under its own name and given as "auto_dtype". Each row: mode, dtype, batch, images_per_s, p50_ms, p95_ms, min_ms, max_ms, iqr_ms,
    images_per_s_min / _max (from the slowest / fastest step), peak_mem_mib, tflops, mfu, note.
    """
    _check_options(dtypes, modes, batch_sizes, repeats, warmup)
    dev = resolve_device(device, what="--device")
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads: must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    img_size = None if img_size is None else to_hw(img_size, "--img-size")
    model, source = _resolve_model(model_or_name, img_size, dev)
    cfg = model.cfg
    size = img_size or tuple(cfg.img_size)
    if size[0] % cfg.patch_size or size[1] % cfg.patch_size:
        raise ConfigError(f"--img-size: {size[0]}x{size[1]} is not a multiple of the patch size {cfg.patch_size}")
    flops = count_flops(model, size)
    auto = pick_precision("auto", dev, vit_flops(cfg, size))  # what the tools and training pick (vitkit.infer.fastpath)
    dtypes = list(dict.fromkeys(auto if d == "auto" else d for d in dtypes))
    peaks: dict[str, float] = {}
    rows = []
    for mode in modes:
        for dt in dtypes:
            if dt == "int8" and (mode == "train" or dev.type != "cpu"):
                why = "int8 dynamic quantization is inference only" if mode == "train" else "int8 runs on CPU only"
                rows += [dict(mode=mode, dtype=dt, batch=int(b), skipped=why) for b in batch_sizes]
                continue
            if dt in ("fp32", "bf16") and peak and dt not in peaks:
                peaks[dt] = measure_peak_flops(dt, dev)
            for b in batch_sizes:
                rows.append(_bench_one(model, mode, dt, int(b), size, repeats, warmup, compile, dev, flops,
                                       peaks.get(dt)))
    return dict(
        model=source,
        device=str(dev),
        threads=torch.get_num_threads() if dev.type == "cpu" else None,
        torch=torch.__version__,
        img_size=list(size),
        params=count_params(model),
        flops_per_image=flops,
        flops_counted_with="FlopCounterMode, manual attention path (matmuls; 1 multiply-add = 2 FLOPs)",
        peak_flops={k: v for k, v in peaks.items()},
        repeats=repeats,
        warmup=warmup,
        compile=compile,
        auto_dtype=auto,
        rows=rows,
    )


def bench_path(model, mode: str, dtype: str, batch: int, steps: int, compile: bool, dev: torch.device) -> FastPath:
    """The path a row runs: what the tools (inference) or training take for ``dtype`` on ``dev`` for
    ``steps`` batches of ``batch`` images (``vitkit.infer.fastpath``), on torch, compiled when ``compile``."""
    if dtype == "fp16":  # 'auto' on a GPU without bf16: autocast, no rule applies
        return FastPath("fp16", compile=compile)
    if mode == "train":
        return training_path(model.cfg, dev, dtype, compile=compile, images=steps * batch)
    return inference_path(model, dev, dtype, images=steps * batch, engine="torch", batch=batch,
                          compile=True if compile else None)


def _bench_one(model, mode, dtype, batch, size, repeats, warmup, compile, dev, flops, peak):
    """One row: ``warmup`` untimed steps, then ``repeats`` timed ones, of ``mode`` in ``dtype`` at ``batch``,
    on the path ``bench_path`` gives."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(batch, model.cfg.in_chans, *size, generator=g).to(dev)
    if dtype == "int8" and not int8_available():
        return dict(mode=mode, dtype=dtype, batch=batch, skipped="this torch build has no int8 kernels")
    path = bench_path(model, mode, dtype, batch, warmup + repeats, compile, dev)
    # training, and channels-last (which apply_path sets in place), on a copy: the model is left as it was
    m = copy.deepcopy(model).train() if mode == "train" or path.channels_last else model
    m = apply_path(m, path)
    if path.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    step = _step_fn(m, mode, path.precision, x, g)
    times, mem = _time_steps(step, warmup, repeats, path.compile, dev)
    st = _stats(times)
    achieved = flops * batch * (3 if mode == "train" else 1) / (st["p50_ms"] / 1e3)
    row = dict(
        mode=mode,
        dtype=dtype,
        batch=batch,
        images_per_s=batch / (st["p50_ms"] / 1e3),
        images_per_s_min=batch / (st["max_ms"] / 1e3),
        images_per_s_max=batch / (st["min_ms"] / 1e3),
        **st,
        peak_mem_mib=mem.peak_mib(),
        peak_mem_how=mem.how,
        mem_at_start_mib=mem.base,
        tflops=achieved / 1e12,
        mfu=(achieved / peak) if peak else None,
        path=path_taken(path, m),
    )
    if dtype == "int8":
        row["note"] = _INT8_NOTE
    return row


def _step_fn(m, mode: str, dtype: str, x: torch.Tensor, g: torch.Generator):
    """One step on the batch ``x``: a forward pass under inference mode, or (train) forward +
    cross-entropy against labels drawn from ``g`` + backward + AdamW step; bf16 and fp16 under autocast."""
    dev = x.device
    amp = autocast(dev, dtype) if dtype in ("bf16", "fp16") else nullcontext()  # fp16: 'auto' on old GPUs
    if mode != "train":

        def step():
            with torch.inference_mode(), amp:
                m(x)

        return step
    cfg = m.cfg
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    y = torch.randint(0, max(cfg.num_classes, 1), (x.shape[0],), generator=g).to(dev)

    def step():
        with amp:
            out = m(x)
            loss = F.cross_entropy(out.float(), y) if cfg.num_classes else out.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _time_steps(step, warmup: int, repeats: int, compile: bool, dev: torch.device):
    """The seconds of each of ``repeats`` timed steps (after ``warmup`` untimed ones), and the peak memory."""
    with _PeakMemory(dev) as mem:
        if compile:  # compilation happens on the first call: make its failure one line
            try:
                step()
            except Exception as e:  # noqa: BLE001
                msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                raise ConfigError(f"--compile: torch.compile failed ({type(e).__name__}: {msg})") from None
        for _ in range(warmup):
            step()
        _sync(dev)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            _sync(dev)
            times.append(time.perf_counter() - t0)
    return times, mem


def format_table(res: dict) -> str:
    """The result of ``bench`` as a fixed-width text table."""
    head = (f"{res['model']}  {res['img_size'][0]}x{res['img_size'][1]}  {res['params'] / 1e6:.2f}M params  "
            f"{res['flops_per_image'] / 1e9:.3f} GFLOPs/image (fwd)  device {res['device']}"
            + (f", {res['threads']} threads" if res.get("threads") else "")
            + (", compiled" if res.get("compile") else ""))
    peaks = ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in res["peak_flops"].items())
    lines = [head, f"measured matmul peak: {peaks or 'n/a'}; {res['repeats']} timed steps after {res['warmup']} warm-up",
             f"{'mode':<6} {'dtype':<5} {'batch':>5} {'img/s':>9} {'(min-max)':>17} {'p50 ms':>9} {'p95 ms':>9} "
             f"{'IQR ms':>8} {'peak MiB':>9} {'TFLOP/s':>8} {'MFU':>6}"]
    for r in res["rows"]:
        if "skipped" in r:
            lines.append(f"{r['mode']:<6} {r['dtype']:<5} {r['batch']:>5}  skipped: {r['skipped']}")
            continue
        rng = f"{r['images_per_s_min']:.1f}-{r['images_per_s_max']:.1f}"
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        lines.append(
            f"{r['mode']:<6} {r['dtype']:<5} {r['batch']:>5} {r['images_per_s']:>9.1f} {rng:>17} {r['p50_ms']:>9.2f} "
            f"{r['p95_ms']:>9.2f} {r['iqr_ms']:>8.2f} {r['peak_mem_mib']:>9.0f} {r['tflops']:>8.4f} {mfu:>6}")
    if any(r.get("dtype") == "int8" and "skipped" not in r for r in res["rows"]):
        lines.append("int8 = dynamic quantization of Linear layers (vitkit.infer.quantize), inference only; MFU is n/a for int8")
    paths = {(r["mode"], r["dtype"], r["path"]) for r in res["rows"] if "path" in r}
    for mode, dtype, path in sorted(paths):
        lines.append(f"path {mode} {dtype}: {path}")
    return "\n".join(lines)


__all__ = ["bench", "bench_path", "vit_flops", "count_flops", "measure_peak_flops", "format_table", "DTYPES", "MODES"]
