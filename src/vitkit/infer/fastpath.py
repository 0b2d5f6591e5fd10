"""Which way to run a model fastest: the rules, given the hardware and the size of the work.

The tools (predict, eval, bench) and training ask ``choose_path`` once, with what the hardware can do
(``Hardware``, detected by ``vitkit.infer.paths.detect_hardware``) and the work (``Work``: inference or
training, forward FLOPs per image, how many images and how many a batch), and get a ``FastPath``: the
precision, whether to torch.compile, whether to run a conv stem channels-last, the engine (torch or
ONNX Runtime). Each tool says which path it took
(``FastPath.describe``).

The rules are thresholds measured on real hardware and kept with the benchmarks that measured them,
never a timing race at run time (which would make a run's numerics depend on the machine's load). Each
table below cites, in one comment line, its benchmark script and results file (in benchmarks/results/);
what each rule rests on, the machines and the earlier figures are in docs/performance.md, a heading per
rule.

- bf16 autocast only where the hardware multiplies bf16 matrices fast (CUDA, AMX or AVX512-BF16 CPUs)
  and the model reaches ``BF16_MIN_FLOPS`` forward FLOPs per image, below which the casts around the
  products cost more than the faster products save; on every device with fast bf16, AMX CPUs included
  (``auto_precision``).
- torch.compile where the time it saves on the whole run (its total FLOPs at the measured eager speed,
  times the measured gain) exceeds its compile time (``compile_pays``, ``COMPILE_MEASURED``). The CPU's
  measured gain is at most 1.0, so a CPU never compiles on its own; a device without measurements compiles only
  when asked.
- channels_last for a conv stem (patch stems have one strided conv, which gains nothing) where
  ``CHANNELS_LAST_MEASURED`` has it faster (``channels_last_pays``). Not under FSDP: it shards
  contiguous parameters only.
- packed bf16 weights (``vitkit.infer.packed``): bf16 inference on a CPU with AMX or AVX512-BF16 runs a bf16
  copy of the model whose Linear weights are cast and packed for oneDNN once, instead of autocast casting
  and oneDNN reordering them on every call (``packed_pays``, ``PACKED_MEASURED``); and its encoder
  blocks wholly in bf16, the residual sums inside the Linear kernels, where that was measured faster
  (``bf16_stream_pays``, ``STREAM_MEASURED``).
- int8 (``vitkit.infer.quantize``) is never automatic: it changes the numbers. It is opt-in, for CPU
  inference only. Its kernel (``int8_kernel``): oneDNN's where ``INT8_ONEDNN_MEASURED`` has it faster
  than fbgemm's on this kind of CPU (AMX) at the model's size and batch, fbgemm's elsewhere.
- The engine: torch, or ONNX Runtime (``vitkit.infer.onnxrt``: the model exported in memory and run by an
  InferenceSession) for fp32 inference on a CPU where onnxruntime is installed. Like compile, it pays
  when the time it saves on the work (its eager time, estimated as for compile, times the measured
  gain at the model's size and batch) exceeds what exporting and building the session costs
  (``ort_pays``, ``ORT_MEASURED``, from benchmarks/ort_vs_torch.py); where it measured no faster than
  torch it is never chosen.

Nothing here imports torch: the rules are plain functions of plain data, tested one by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ..core.errors import ConfigError

Mode = Literal["infer", "train"]
ENGINES = ("auto", "torch", "onnxruntime")

# benchmarks/fastpath_rules.py -> fastpath_rules.json; vitkit bench -> bench_{demo,tiny}_precision.json
BF16_MIN_FLOPS = 3e8  # forward FLOPs per image from which bf16 beats fp32 on an AVX512-BF16 CPU, or on CUDA

# (device, mode) -> (compile s, compiled / eager, FLOP/s a thread): benchmarks/fastpath_rules.py --compile (no file)
CPU_EAGER_RATE = 2e10  # eager fp32 FLOP/s a thread on that CPU
COMPILE_MEASURED: dict[tuple[str, str], tuple[float, float, float]] = {
    ("cpu", "train"): (114.0, 0.99, CPU_EAGER_RATE),
    ("cpu", "infer"): (75.0, 1.0, CPU_EAGER_RATE),
}

# model -> (FLOPs/image, ORT / torch at batch 1, at 16, setup s): benchmarks/ort_vs_torch.py -> ort_vs_torch.json
ORT_MEASURED: dict[str, tuple[float, float, float, float]] = {
    "vit_hybrid_mini_patch4_28": (7_753_472, 2.20, 1.27, 0.32),  # the demo model
    "vit_tiny_patch16_224": (2_507_366_400, 1.17, 1.06, 0.55),
    "vit_small_patch16_224": (9_197_764_608, 1.03, 0.99, 0.96),
    "vit_base_patch16_224": (35_127_656_448, 1.16, 1.02, 4.49),
}
ORT_MIN_GAIN = 1.10  # below this onnxruntime is not chosen (from the same results)

# CPU kind -> model -> packed / autocast at batch 16: benchmarks/packed_bf16.py -> results/packed_bf16_<kind>.json
PACKED_MEASURED: dict[str, dict[str, float]] = {
    "amx": {
        "vit_tiny_patch16_224": 1.15,  # [1.04, 1.23]
        "vit_small_patch16_224": 1.24,  # [0.82, 2.03]
        "vit_base_patch16_224": 1.13,  # [0.74, 1.46]
    },
    "avx512bf16": {
        "vit_tiny_patch16_224": 1.12,  # [0.71, 1.47]
        "vit_small_patch16_224": 1.09,  # [1.03, 1.59]
        "vit_base_patch16_224": 1.10,  # [1.08, 1.14]
    },
}

# CPU kind -> model -> bf16 / float32 stream at batch 16: benchmarks/packed_bf16.py -> results/packed_bf16_<kind>.json
STREAM_MEASURED: dict[str, dict[str, float]] = {
    "amx": {
        "vit_tiny_patch16_224": 1.16,  # [1.09, 1.22]
        "vit_small_patch16_224": 1.07,  # [0.99, 1.47]
        "vit_base_patch16_224": 1.05,  # [0.84, 1.63]
    },
}

# kind -> model -> (FLOPs/image, oneDNN / fbgemm at batch 1, 16): benchmarks/int8_kernels.py -> int8_kernels_<kind>.json
INT8_ONEDNN_MEASURED: dict[str, dict[str, tuple[float, float, float]]] = {
    "amx": {
        "vit_hybrid_mini_patch4_28": (7_753_472, 0.87, 0.94),  # [0.79, 0.96], [0.90, 0.98]: the demo model
        "vit_tiny_patch16_224": (2_507_366_400, 0.95, 1.12),  # [0.91, 1.05], [0.62, 1.58]
        "vit_small_patch16_224": (9_197_764_608, 1.03, 1.20),  # [0.97, 1.08], [0.86, 1.70]
        "vit_base_patch16_224": (35_127_656_448, 1.32, 1.34),  # [1.06, 1.51], [1.04, 1.63]
    },
}

# (device, mode) -> channels-last / contiguous: benchmarks/fastpath_rules.py -> fastpath_{rules,channels_last}.json
CHANNELS_LAST_MEASURED: dict[tuple[str, str], float] = {
    ("cpu", "infer"): 1.53,
    ("cpu", "train"): 1.09,
}


@dataclass(frozen=True)
class Hardware:
    """What the device can do, as the rules need it (``vitkit.infer.paths.detect_hardware`` fills it in)."""

    device_type: str  # 'cpu', 'cuda' or 'mps'
    cpu_bf16_kind: str = "none"  # the CPU's bf16 matrix instructions: 'amx', 'avx512bf16' or 'none'
    onednn_bf16: bool = False  # a torch build whose oneDNN runs bf16 Linear on packed weights on this CPU
    onednn_int8: bool = False  # a torch build whose oneDNN runs int8 Linear exactly on this CPU (vitkit.infer.quantize)
    onednn_int8_why: str = ""  # where it cannot: why (vitkit.infer.quantize.onednn_int8_problem)
    cuda_bf16: bool = False  # a CUDA GPU with bf16
    threads: int = 1  # CPU threads this process computes on
    onnxruntime: bool = False  # onnxruntime (and onnx, which exports to it) installed

    @property
    def cpu_bf16(self) -> bool:
        """A CPU with bf16 matrix instructions (AMX or AVX512-BF16)."""
        return self.cpu_bf16_kind != "none"


@dataclass(frozen=True)
class Work:
    """The work to run: inference or training, its forward FLOPs per image, how many images in all
    (a training run: steps x global batch; 0 = unknown, taken as short) and per batch (0 = unknown)."""

    mode: Mode
    flops_per_image: float
    images: int = 0
    conv_stem: bool = False
    batch: int = 0
    sharded: bool = False  # training sharded over the processes (FSDP)


@dataclass(frozen=True)
class FastPath:
    """How to run: ``precision`` ('fp32', 'bf16', 'fp16' autocast, or 'int8' weights), ``compile``,
    ``channels_last``, ``packed`` (bf16 inference on a CPU: a bf16 copy with its Linear weights packed),
    the ``engine`` ('torch' or 'onnxruntime'; ``engine_asked``: it was forced, so a
    failure of onnxruntime is an error rather than a fall back to torch); ``why`` says why, one reason per
    choice that was made automatically."""

    precision: str
    compile: bool = False
    channels_last: bool = False
    engine: str = "torch"
    packed: bool = False  # bf16 CPU inference on a bf16 copy with packed Linear weights (vitkit.infer.packed)
    stream: str = "float32"  # packed: the residual stream's dtype between the blocks ('float32' or 'bfloat16')
    int8_kernel: str = ""  # int8: the kernel of the Linear layers ('onednn' or 'fbgemm', vitkit.infer.quantize)
    engine_asked: bool = False
    why: tuple[str, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        """One line for a tool's output, e.g. 'fp32, eager (bf16: 0.014 GFLOPs/image is too small ...)';
        'fp32, onnxruntime (...)' on ONNX Runtime."""
        parts = [self.precision, "onnxruntime" if self.engine == "onnxruntime" else
                 "compiled" if self.compile else "eager"]
        if self.channels_last:
            parts.append("channels_last")
        if self.packed:
            parts.append("packed bf16 weights" + (", bf16 residual stream" if self.stream == "bfloat16" else ""))
        if self.int8_kernel:
            parts.append(f"{self.int8_kernel} int8 kernels")
        return ", ".join(parts) + (f" ({'; '.join(self.why)})" if self.why else "")


def auto_precision(hw: Hardware, flops_per_image: float | None = None) -> tuple[str, str]:
    """The precision 'auto' means on ``hw`` for a model of ``flops_per_image`` (None: size unknown, the
    hardware alone decides), and why: bf16 (fp16 on a GPU without bf16) where the device has fast bf16
    and the model reaches ``BF16_MIN_FLOPS``, else fp32."""
    fast = {"cuda": "the GPU has bf16" if hw.cuda_bf16 else "the GPU has fp16",
            "cpu": "the CPU has AMX or AVX512-BF16" if hw.cpu_bf16 else None}.get(hw.device_type)
    if fast is None:
        return "fp32", "no fast bf16 on this device"
    if flops_per_image is not None and flops_per_image < BF16_MIN_FLOPS:
        return "fp32", f"bf16 does not pay at {flops_per_image / 1e9:.3g} GFLOPs/image (< {BF16_MIN_FLOPS / 1e9:g})"
    size = f" and {flops_per_image / 1e9:.3g} GFLOPs/image pays" if flops_per_image is not None else ""
    low = "fp16" if hw.device_type == "cuda" and not hw.cuda_bf16 else "bf16"
    return low, fast + size


def eager_seconds(hw: Hardware, work: Work, rate: float) -> float:
    """The eager time of ``work`` estimated from its FLOPs at ``rate`` FLOP/s a thread (a training step is
    ~3 forwards: forward + backward)."""
    passes = 3 if work.mode == "train" else 1
    return work.images * work.flops_per_image * passes / (rate * max(hw.threads, 1))


def compile_pays(hw: Hardware, work: Work) -> tuple[bool, str]:
    """Whether torch.compile repays its compile time on ``work``, and why: the time it saves (eager time
    x (1 - 1 / speedup), the eager time estimated from the work's FLOPs) must exceed the compile time.
    Devices without a measured speedup never compile on their own (``compile=True`` still does)."""
    measured = COMPILE_MEASURED.get((hw.device_type, work.mode))
    if measured is None:
        return False, f"torch.compile: not measured for {work.mode} on {hw.device_type}, off unless asked for"
    seconds, speedup, rate = measured
    eager_s = eager_seconds(hw, work, rate)
    saved = eager_s * (1 - 1 / speedup) if speedup > 1 else 0.0
    if saved > seconds:
        return True, f"compiled: saves ~{saved:.0f} s of ~{eager_s:.0f} s for ~{seconds:.0f} s of compiling"
    if speedup <= 1:
        return False, f"eager: compiling measured {speedup:.2f}x eager for {work.mode} on {hw.device_type}"
    return False, f"eager: ~{eager_s:.0f} s of work does not repay ~{seconds:.0f} s of compiling"


def nearest_measured(table: dict, flops_per_image: float):
    """The entry of ``table`` (model -> (forward FLOPs per image, ...)) nearest in size, in log FLOPs."""
    size = math.log(max(flops_per_image, 1.0))
    return min(table.items(), key=lambda item: abs(math.log(item[1][0]) - size))


def ort_measurement(flops_per_image: float) -> tuple[str, tuple[float, float, float, float]]:
    """The ``ORT_MEASURED`` model nearest in size (in log FLOPs) to a model of ``flops_per_image``."""
    return nearest_measured(ORT_MEASURED, flops_per_image)


def ort_pays(hw: Hardware, work: Work) -> tuple[bool, str]:
    """Whether ONNX Runtime runs fp32 inference ``work`` faster than torch by more than it costs to set up,
    and why: its gain measured at the nearest model size (at batch 16 for batches of 16 or more, else the
    lesser of batch 1's and 16's) must reach ``ORT_MIN_GAIN``, and the time it saves (the eager time as
    ``compile_pays`` estimates it x (1 - 1 / gain)) must exceed the export and session time."""
    if hw.device_type != "cpu" or work.mode != "infer":
        return False, f"torch: onnxruntime is for inference on a CPU, not {work.mode} on {hw.device_type}"
    if not hw.onnxruntime:
        return False, "torch: onnxruntime is not installed"
    name, (_, at1, at16, setup_s) = ort_measurement(work.flops_per_image)
    gain = at16 if work.batch >= 16 else min(at1, at16)
    if gain < ORT_MIN_GAIN:
        return False, f"torch: onnxruntime measured {gain:.2f}x torch at this size ({name})"
    eager_s = eager_seconds(hw, work, CPU_EAGER_RATE)
    saved = eager_s * (1 - 1 / gain)
    if saved > setup_s:
        return True, (f"onnxruntime: measured {gain:.2f}x torch ({name}), saves ~{saved:.1f} s of ~{eager_s:.1f} s "
                      f"for ~{setup_s:.1f} s of export and session")
    return False, f"torch: ~{eager_s:.1f} s of work does not repay ~{setup_s:.1f} s of exporting to onnxruntime"


def forced_ort(hw: Hardware, work: Work, precision: str, compile: bool | None) -> FastPath:
    """The path of ``engine='onnxruntime'``: fp32 inference on a CPU with onnxruntime installed; any other
    combination is a one-line ConfigError."""
    if work.mode != "infer" or hw.device_type != "cpu":
        where = "training" if work.mode != "infer" else f"on {hw.device_type}"
        raise ConfigError(f"engine: onnxruntime runs inference on a CPU, not {where}")
    if precision not in ("auto", "fp32"):
        raise ConfigError(f"engine: onnxruntime runs fp32, not {precision} (use precision auto or fp32 with it)")
    if compile:
        raise ConfigError("engine: onnxruntime runs its own graph; torch.compile does not apply to it")
    if not hw.onnxruntime:
        raise ConfigError("engine: onnxruntime is not installed: pip install 'vitkit[onnx]'")
    why = ("fp32: onnxruntime runs fp32",) if precision == "auto" else ()
    return FastPath("fp32", engine="onnxruntime", engine_asked=True, why=why + ("onnxruntime: asked for",))


def pays_at_every_size(table: dict[str, dict[str, float]], kind: str, what: str, base: str, yes: str,
                       no: str) -> tuple[bool, str]:
    """Whether ``what`` beat ``base`` at every size ``table`` (CPU kind -> model -> gain) measured on a CPU of
    ``kind``, and why, the reason led by ``yes`` or ``no``."""
    measured = table.get(kind)
    if not measured:
        return False, f"{no}: {what} not measured on a CPU with {kind}"
    low, high = min(measured.values()), max(measured.values())
    if low <= 1:
        return False, f"{no}: {what} measured {low:.2f}x {base} on {kind}"
    return True, f"{yes} measured {low:.2f}-{high:.2f}x {base} on {kind}"


def packed_pays(hw: Hardware, work: Work, precision: str, compile: bool) -> tuple[bool, str]:
    """Whether bf16 inference runs on a bf16 copy of the model with its Linear weights packed for oneDNN
    (``vitkit.infer.packed``) rather than under autocast, and why: where ``PACKED_MEASURED`` has it faster at
    every size measured on this kind of CPU (AMX, or AVX512-BF16 alone)."""
    if precision != "bf16" or work.mode != "infer" or hw.device_type != "cpu" or compile:
        return False, "autocast"
    if not hw.onednn_bf16:
        return False, "autocast: this torch build cannot pack bf16 Linear weights for oneDNN here"
    return pays_at_every_size(PACKED_MEASURED, hw.cpu_bf16_kind, "packed bf16 weights", "autocast",
                              "packed: bf16 weights cast and packed once", "autocast")


NO_ONEDNN_INT8 = "this torch build cannot run oneDNN's int8 Linear here"


def int8_kernel(hw: Hardware, work: Work) -> tuple[str, str]:
    """The kernel of int8 inference's Linear layers for ``work`` on ``hw`` (``vitkit.infer.quantize``), and why:
    'onednn' where this torch build runs it and ``INT8_ONEDNN_MEASURED`` has it faster than fbgemm on this
    kind of CPU at the nearest model size (at batch 16 for batches of 16 or more, else the lesser of batch
    1's and 16's), else 'fbgemm'."""
    if not hw.onednn_int8:
        return "fbgemm", f"fbgemm: {hw.onednn_int8_why or NO_ONEDNN_INT8}"
    measured = INT8_ONEDNN_MEASURED.get(hw.cpu_bf16_kind)
    if not measured:
        return "fbgemm", f"fbgemm: oneDNN's int8 kernels not measured on a CPU with {hw.cpu_bf16_kind}"
    name, (_, at1, at16) = nearest_measured(measured, work.flops_per_image)
    gain = at16 if work.batch >= 16 else min(at1, at16)
    kernel = "onednn" if gain > 1 else "fbgemm"
    return kernel, f"{kernel}: oneDNN's int8 kernels measured {gain:.2f}x fbgemm's ({name}, {hw.cpu_bf16_kind})"


def bf16_stream_pays(hw: Hardware) -> tuple[bool, str]:
    """Whether the packed bf16 copy runs its residual stream in bf16 (``vitkit.infer.packed.Bf16Inference``,
    stream='bfloat16') rather than float32, and why: where ``STREAM_MEASURED`` has it faster at every size
    measured on this kind of CPU."""
    return pays_at_every_size(STREAM_MEASURED, hw.cpu_bf16_kind, "a bf16 stream", "the float32 stream",
                              "bf16 residual stream:", "float32 residual stream")


def channels_last_pays(hw: Hardware, work: Work) -> tuple[bool, str]:
    """Whether to run a conv stem channels-last (its conv weights and the input batches), and why:
    where ``CHANNELS_LAST_MEASURED`` has it faster than the contiguous layout. Never under FSDP, which
    shards contiguous parameters only (torch's ``fully_shard`` refuses channels-last ones)."""
    if not work.conv_stem:
        return False, "channels_last: no conv stem"
    if work.sharded:
        return False, "contiguous: FSDP shards contiguous parameters only"
    speedup = CHANNELS_LAST_MEASURED.get((hw.device_type, work.mode))
    if speedup is None:
        return False, f"contiguous: channels-last not measured for {work.mode} on {hw.device_type}"
    layout = "channels_last" if speedup > 1 else "contiguous"
    return speedup > 1, f"{layout}: a conv stem measured {speedup:.2f}x for {work.mode} on {hw.device_type}"


def choose_path(hw: Hardware, work: Work, precision: str = "auto", compile: bool | None = None,
                channels_last: bool | None = None, engine: str = "auto") -> FastPath:
    """The path to run ``work`` on ``hw``: ``precision`` 'auto' or a name ('int8': opt-in, CPU inference
    only, a ConfigError elsewhere), ``compile`` and ``channels_last`` None (auto) or forced, ``engine``
    'auto' (onnxruntime where ``ort_pays``), 'torch' or 'onnxruntime' (fp32 CPU inference only, a
    ConfigError elsewhere). A training path also says why it took its layout (an inference path names
    the layout alone)."""
    if engine not in ENGINES:
        raise ConfigError(f"engine: {engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "onnxruntime":
        return forced_ort(hw, work, precision, compile)
    why = []
    if precision == "int8":
        if work.mode != "infer" or hw.device_type != "cpu":
            raise ConfigError(f"precision: int8 dynamic quantization is for inference on a CPU, not "
                              f"{'training' if work.mode != 'infer' else 'on ' + hw.device_type}")
        layout = channels_last_pays(hw, work)[0] if channels_last is None else channels_last
        kernel, reason = int8_kernel(hw, work)
        return FastPath("int8", compile=bool(compile), channels_last=layout, int8_kernel=kernel,
                        why=("int8 weights, dynamically quantized activations: asked for", reason))
    if precision == "auto":
        precision, reason = auto_precision(hw, work.flops_per_image)
        why.append(f"{precision}: {reason}")
    ort_reason = None
    if engine == "auto" and precision == "fp32" and not compile and hw.device_type == "cpu" and work.mode == "infer":
        ort, ort_reason = ort_pays(hw, work)
        if ort:
            return FastPath("fp32", engine="onnxruntime", why=tuple(why) + (ort_reason,))
    if compile is None:
        compile, reason = compile_pays(hw, work)
        why.append(reason)
    if channels_last is None:
        channels_last, reason = channels_last_pays(hw, work)
        if work.mode == "train" and work.conv_stem:
            why.append(reason)
    if ort_reason is not None:
        why.append(ort_reason)
    packed, reason = packed_pays(hw, work, precision, bool(compile))
    if work.mode == "infer" and precision == "bf16" and hw.device_type == "cpu":
        why.append(reason)
    stream = "float32"
    if packed:
        bf16_stream, reason = bf16_stream_pays(hw)
        stream = "bfloat16" if bf16_stream else stream
        why.append(reason)
    return FastPath(precision, bool(compile), channels_last, packed=packed, stream=stream, why=tuple(why))


def vit_flops(cfg, img_size: tuple[int, int] | None = None) -> int:
    """Forward FLOPs of one image through a standard ViT (patch stem, pre-LN blocks, linear head).

    Counts matmuls only (2 FLOPs per multiply-add): patch embedding, per block qkv + attention
    (QK^T and AV: 2 * 2 * T^2 * D) + projection + MLP, the optional pre-logits layer and the head.
    Norms, softmax, GELU and additions are left out, as FlopCounterMode does. For a conv stem the stem
    is counted as the patch projection it replaces (an estimate, good enough for the rules above). A MAP
    head (``global_pool='map'``) adds its probe's attention over the N patch tokens and its MLP.
    """
    H, W = img_size or cfg.img_size
    P, C, D = cfg.patch_size, cfg.in_chans, cfg.embed_dim
    N = (H // P) * (W // P)
    T = N + cfg.num_prefix_tokens
    hid = cfg.mlp_hidden
    stem = 2 * N * D * C * P * P
    per_block = 2 * T * D * 3 * D + 2 * 2 * T * T * D + 2 * T * D * D + 2 * 2 * T * D * hid
    feat = D
    pre = 0
    if cfg.representation_size:
        pre = 2 * D * cfg.representation_size
        feat = cfg.representation_size
    head = 2 * feat * cfg.num_classes
    pool = 0
    if cfg.global_pool == "map":  # one probe query: q and proj on it, k and v of N tokens, its MLP
        pool = 2 * D * D + 2 * N * D * 2 * D + 2 * 2 * N * D + 2 * D * D + 2 * 2 * D * hid
    return stem + cfg.depth * per_block + pool + pre + head


__all__ = ["Hardware", "Work", "FastPath", "choose_path", "auto_precision", "compile_pays", "channels_last_pays",
           "ort_pays", "ort_measurement", "nearest_measured", "int8_kernel", "INT8_ONEDNN_MEASURED",
           "bf16_stream_pays", "STREAM_MEASURED", "forced_ort",
           "eager_seconds", "vit_flops", "BF16_MIN_FLOPS", "ENGINES",
           "ORT_MEASURED", "ORT_MIN_GAIN", "CHANNELS_LAST_MEASURED"]
