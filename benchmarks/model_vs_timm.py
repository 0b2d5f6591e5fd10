"""vitkit against timm on the same model and weights, side by side, as ratios of images per second.

Run in an environment with timm (see benchmarks/parity.sh for one), from the repository root:
    PYTHONPATH=src .venv-ref/bin/python benchmarks/model_vs_timm.py            # docs/performance.md's table
    python benchmarks/model_vs_timm.py --cases infer:vit_tiny_patch16_224:1,infer:vit_base_patch16_224:16
    python benchmarks/model_vs_timm.py --device cuda --cases train:vit_base_patch16_224:64
    python benchmarks/model_vs_timm.py --cases train:vit_tiny_patch4_32:128 --processes 2 --repeats 7

A case is mode:model:batch; the model is a named vitkit model (timm builds the same architecture; the
weights are vitkit's, loaded into timm by the identity key map). A training step is forward +
cross-entropy + backward + AdamW (foreach) step. For each case the ways below are timed in alternation,
repeat after repeat (the order rotating), so that load on a shared machine hits all alike; each ratio is
the median over the repeats of timm eager's time / the way's time (> 1: faster than timm eager), with
its range:
- vitkit eager: fp32, no compile (the same computation as timm's);
- vitkit default: the path vitkit's tools take (``vitkit.infer.paths.inference_path`` for inference,
  ``pick_precision('auto', ...)`` for training), named in the table;
- vitkit int8 (inference, ``--int8``): ``vitkit.infer.quantize`` on the kernel the tools pick at the case's batch
  (named in the row), with its top-1 agreement with vitkit fp32 on 500 demo test digits (the benchmark's
  random weights, with a random head); with ``--own-process`` also as the commands run it;
- vitkit ORT (inference, ``--ort``): fp32 on ONNX Runtime (``vitkit.infer.onnxrt.OrtModel``, the engine of
  ``--engine onnxruntime``; its export and session time is left out of the timing, and given); n/a
  where onnxruntime is not installed;
- timm compiled (``--compile``): torch.compile(timm) (its compile time is left out of the timing);
- timm bf16 autocast (``--bf16``): timm eager under torch.autocast(bfloat16), the bf16 baseline: vitkit's
  default path and its bf16 process ways are also given as ratios to it;
- vitkit fp32, own process (inference, ``--own-process``): fp32 inference as vitkit's commands run it:
  the path ``inference_path`` picks at fp32, in a process of its own (the same threads) with the
  allocator set as the command line sets it (``keep_freed_memory``); the process waits on a pipe, idle,
  while the other ways run; and, where the default path is not fp32 (bf16 on a CPU with fast bf16),
  vitkit default, own process: that path, run the same way (and with ``--int8``, vitkit int8, own process);
- vitkit N processes (training, ``--processes N``): how ``vitkit train`` trains a clock-bounded run of
  CIFAR-size data on a CPU with N cores or more: N data-parallel processes (DDP on a gloo group) of one
  thread each, each a share of the batch, the gradients all-reduced every step, with the allocator set
  as the command line sets it (``keep_freed_memory``). The processes start once and wait on a pipe,
  idle, while the other ways run (in this process, whose allocator is glibc's as it comes). In fp32, and, where training's precision 'auto'
  picks another, in that precision too.
With ``--memory``, the peak RSS of a fresh process that runs 3 training steps of the case (vitkit
eager, vitkit's default path, timm eager), on the CPU.

JSON goes to benchmarks/results/model_vs_timm.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

import vitkit
from vitkit.core.hardware import cpu_bf16_kind, cpu_capability
from vitkit.infer.fastpath import vit_flops
from vitkit.infer.paths import apply_path, autocast, inference_path, pick_precision

TRAIN_MODEL = ("vit_tiny_patch4_32", {"depth": 6})  # patch 4, width 192, depth 6, 32 px
DEFAULT_CASES = "infer:vit_small_patch16_224:16,train:vit_tiny_patch4_32:128"


def vitkit_model(name: str):
    """The case's vitkit model, the same weights in every process: seed 0, and a head that separates
    classes (for top-1 checks)."""
    over = TRAIN_MODEL[1] if name == TRAIN_MODEL[0] else {}
    model = vitkit.create_model(name, seed=0, **over)
    torch.nn.init.normal_(model.head.weight, std=0.02, generator=torch.Generator().manual_seed(0))
    return model


def models(name: str, device: torch.device):
    """The vitkit model and timm's, with the same weights."""
    import timm
    from timm.models.vision_transformer import VisionTransformer

    ours = vitkit_model(name)
    c = ours.cfg
    if name in timm.list_models():
        ref = timm.create_model(name, pretrained=False)
    else:
        ref = VisionTransformer(img_size=c.img_size, patch_size=c.patch_size, in_chans=c.in_chans,
                                num_classes=c.num_classes, embed_dim=c.embed_dim, depth=c.depth,
                                num_heads=c.num_heads, mlp_ratio=c.mlp_hidden / c.embed_dim)
    ref.load_state_dict(ours.state_dict())
    return ours.to(device), ref.to(device)


def step_fn(model, mode: str, x: torch.Tensor, precision: str = "fp32", fused: bool = False):
    """One inference forward, or one training step (forward, cross-entropy, backward, AdamW: foreach, or
    ``fused``)."""
    amp = (lambda: autocast(x.device, precision)) if precision != "fp32" else nullcontext
    if mode == "infer":
        model.eval()

        def infer():
            with torch.inference_mode(), amp():
                return model(x)
        return infer
    model.train()
    y = torch.randint(0, 10, (x.shape[0],), generator=torch.Generator().manual_seed(0)).to(x.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if fused else {"foreach": True}))

    def train():
        with amp():
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return train


def default_way(ours, mode: str, x: torch.Tensor, device: torch.device):
    """vitkit's default path for this case: (its step, its description)."""
    if mode == "infer":
        path = inference_path(ours, device, "auto", x.shape[0])
        return step_fn(apply_path(ours, path), mode, x, path.precision), path.describe()
    precision = pick_precision("auto", device, vit_flops(ours.cfg))
    return step_fn(ours, mode, x, precision), f"{precision}, eager (training: precision='auto')"


def ort_way(ours, x: torch.Tensor, device: torch.device, ways: dict) -> str:
    """Add the "vitkit ORT" way (fp32 on ONNX Runtime) to ``ways`` where it can run; what it cost to set up,
    or why it is n/a."""
    from vitkit.infer.onnxrt import OrtModel, onnxruntime_available

    if device.type != "cpu" or not onnxruntime_available():
        return f"n/a: {'onnxruntime is not installed' if device.type == 'cpu' else 'CPU only'}"
    t0 = time.perf_counter()
    net = OrtModel(ours, strict=True)  # a failed check is an error here, not a quiet fall back to torch
    setup = time.perf_counter() - t0
    ways["vitkit ORT"] = step_fn(net, "infer", x)
    return f"fp32 on onnxruntime, export + session {setup:.1f} s (left out of the timing)"


def _process_worker(rank: int, world: int, name: str, mode: str, batch: int, threads: int, precision: str,
                    conn) -> None:
    """One process of a way run in processes of its own, as a vitkit command runs: the allocator set as the
    command line sets it, ``threads`` threads, the case's model (the same weights) on ``batch`` images; in
    training a DDP replica when ``world`` > 1, in inference the path ``inference_path`` picks at
    ``precision``. Runs as many steps as the pipe asks, then says so."""
    from vitkit.core.hardware import keep_freed_memory
    from vitkit.train.distributed import DistInfo, process_group

    keep_freed_memory()  # as every vitkit command does (the command line sets it)
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    with process_group(DistInfo(rank, world, rank), device):
        _serve_steps(name, mode, batch, precision, world > 1, conn)  # its model is gone before the group ends


def _serve_steps(name: str, mode: str, batch: int, precision: str, ddp: bool, conn) -> None:
    model = vitkit_model(name)
    x = torch.randn(batch, model.cfg.in_chans, *model.cfg.img_size)
    if mode == "infer":
        path = inference_path(model, torch.device("cpu"), precision, batch)
        step, how = step_fn(apply_path(model, path), mode, x, path.precision), path.describe()
    else:
        step = step_fn(torch.nn.parallel.DistributedDataParallel(model) if ddp else model, mode, x, precision)
        how = f"{precision}, eager"
    step()  # warm-up
    conn.send(how)
    while (n := conn.recv()) is not None:
        for _ in range(n):
            step()
        conn.send("done")


class ProcessWay:
    """A way run in ``processes`` processes of their own (``_process_worker``), idle on a pipe between
    steps: a callable that runs one step on every process and waits for all. ``how``: the path taken."""

    def __init__(self, name: str, mode: str, batch: int, processes: int, threads: int, precision: str):
        import os
        import socket

        import torch.multiprocessing as mp

        if batch % processes:
            raise SystemExit(f"--processes {processes}: the batch ({batch}) must split evenly")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # the children's rendezvous
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(processes):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_process_worker, args=(rank, processes, name, mode, batch // processes,
                                                             threads, precision, theirs), daemon=True)
            proc.start()
            self.conns.append(ours)
            self.procs.append(proc)
        self.how = [conn.recv() for conn in self.conns][0]

    def __call__(self) -> None:
        for conn in self.conns:
            conn.send(1)
        for conn in self.conns:
            conn.recv()

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=60)


def race(ways: dict, repeats: int, iters: int, device: torch.device) -> dict:
    """Median seconds per step of each way over ``repeats`` rounds, the order rotating; and every round's
    times."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for fn in ways.values():  # warm-up (and compilation)
        fn()
    names = list(ways)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                ways[n]()
            sync()
            times[n].append((time.perf_counter() - t0) / iters)
    return times


def cpu_cases(args):
    """The cases of a CPU benchmark of vitkit's paths (``args.cases``: model:batch, comma-separated), in this
    process with the allocator set as every command sets it and ``args.threads`` threads: (case, model
    name, batch, the model in eval mode, a fixed random batch) for each."""
    from vitkit.core.hardware import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(args.threads)
    for case in args.cases.split(","):
        name, batch = case.split(":")
        model = vitkit_model(name).eval()
        x = torch.randn(int(batch), model.cfg.in_chans, *model.cfg.img_size, generator=torch.Generator().manual_seed(1))
        yield case, name, int(batch), model, x


def write_rows(args, script: str, rows: list[dict], **meta) -> None:
    """``rows`` and what they were measured with to ``args.out`` (JSON), after every case: a run cut short
    keeps what it measured."""
    from vitkit.infer.paths import detect_hardware

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(torch=torch.__version__, threads=args.threads,
                                   hardware=str(detect_hardware(torch.device("cpu"))),
                                   command=" ".join([script] + sys.argv[1:]), **meta, rows=rows), indent=2) + "\n")


def ratio(times: dict, way: str, base: str = "timm eager") -> tuple[float, float, float]:
    r = sorted(b / a for a, b in zip(times[way], times[base]))
    return statistics.median(r), r[0], r[-1]


def top1_agreement(ours, device: torch.device, kernel: str, n: int = 500) -> float:
    """Share of the first ``n`` demo test digits (at the model's size and channels, through its own
    preprocessing) on which vitkit int8 (on ``kernel``) and fp32 predict the same class."""
    from vitkit.data import eval_batch, open_dataset
    from vitkit.infer.quantize import quantize_int8

    c = ours.cfg
    test = open_dataset(None, channels=c.in_chans, img_size=c.img_size).test
    imgs, _ = test.get_batch(torch.arange(min(n, len(test))))
    x = eval_batch(imgs, c.img_size, ours.preprocess)
    q, fp32 = quantize_int8(ours, kernel=kernel), ours.eval()
    agree = 0
    with torch.inference_mode():
        for i in range(0, len(x), 50):
            agree += (fp32(x[i:i + 50]).argmax(-1) == q(x[i:i + 50]).argmax(-1)).sum().item()
    return agree / len(x)


def peak_rss_mib(way: str, name: str, batch: int, threads: int) -> float:
    """Peak RSS of a fresh process that builds the case's model and runs 3 training steps."""
    out = subprocess.run([sys.executable, __file__, "--_memory", f"{way}:{name}:{batch}", "--threads", str(threads)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def memory_child(spec: str, threads: int) -> None:
    way, name, batch = spec.split(":")
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    ours, ref = models(name, device)
    x = torch.randn(int(batch), ours.cfg.in_chans, *ours.cfg.img_size)
    if way == "vitkit default":
        del ref
        step, _ = default_way(ours, "train", x, device)
    elif way == "vitkit eager":
        del ref
        step = step_fn(ours, "train", x)
    else:
        del ours
        step = step_fn(ref, "train", x)
    for _ in range(3):
        step()
    # VmHWM: this process's own peak (ru_maxrss would carry the parent's peak over the fork and exec)
    status = Path("/proc/self/status")
    if status.exists():
        line = next(x for x in status.read_text().splitlines() if x.startswith("VmHWM:"))
        print(int(line.split()[1]) / 1024)
    else:  # not Linux
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def write(args, rows: list[dict]) -> None:
    import timm

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    out.write_text(json.dumps(dict(torch=torch.__version__, timm=timm.__version__, threads=args.threads,
                                   device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                                   cpu_isa=cpu_capability(), cpu_bf16=cpu_bf16_kind(),
                                   command=" ".join(sys.argv), repeats=args.repeats, rows=rows), indent=2) + "\n")


def main() -> None:

    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated mode:model:batch")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--int8", action="store_true", help="also time vitkit int8 inference (CPU)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(timm)")
    ap.add_argument("--bf16", action="store_true", help="also time timm under bf16 autocast, and vitkit's "
                    "bf16 ways against it (a CPU with fast bf16, or CUDA)")
    ap.add_argument("--ort", action="store_true", help="also time vitkit fp32 on ONNX Runtime (CPU inference)")
    ap.add_argument("--memory", action="store_true", help="peak RSS of training, fresh processes (CPU)")
    ap.add_argument("--own-process", action="store_true", help="also time inference as vitkit's commands run it "
                    "in fp32: in a process of its own, the allocator set as the command line sets it (CPU)")
    ap.add_argument("--processes", type=int, default=0, help="also time training in N data-parallel processes "
                    "of one thread each (CPU), as vitkit train runs CIFAR-size data against the clock")
    ap.add_argument("--out", default="benchmarks/results/model_vs_timm.json")
    ap.add_argument("--_memory", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._memory:
        return memory_child(args._memory, args.threads)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []
    for case in args.cases.split(","):
        mode, name, batch = case.split(":")
        batch = int(batch)
        ours, ref = models(name, device)
        x = torch.randn(batch, ours.cfg.in_chans, *ours.cfg.img_size, device=device)
        default, how = default_way(models(name, device)[0], mode, x, device)
        ways = {"timm eager": step_fn(ref, mode, x), "vitkit eager": step_fn(ours, mode, x), "vitkit default": default}
        if args.compile:
            ways["timm compiled"] = step_fn(torch.compile(models(name, device)[1]), mode, x)
        if args.bf16:
            ways["timm bf16 autocast"] = step_fn(models(name, device)[1], mode, x, "bf16")
        int8_path = None
        if args.int8 and mode == "infer":
            int8_path = inference_path(ours, device, "int8", batch=batch)  # the kernel the tools take at this batch
            ways["vitkit int8"] = step_fn(apply_path(ours, int8_path), mode, x)
        ort_note = None
        if args.ort and mode == "infer":
            ort_note = ort_way(ours, x, device, ways)
        apart, own_how = [], None
        if args.processes and mode == "train" and device.type == "cpu":
            auto = pick_precision("auto", device, vit_flops(ours.cfg))
            for precision in dict.fromkeys(["fp32", auto]):
                way = ProcessWay(name, mode, batch, args.processes, 1, precision)
                ways[f"vitkit {args.processes} processes ({precision})"] = way
                apart.append(way)
        if args.own_process and mode == "infer" and device.type == "cpu":
            way = ProcessWay(name, mode, batch, 1, args.threads, "fp32")
            ways["vitkit fp32, own process"] = way
            apart.append(way)
            own_how = way.how
            if inference_path(ours, device, "auto", batch).precision != "fp32":
                way = ProcessWay(name, mode, batch, 1, args.threads, "auto")
                ways["vitkit default, own process"] = way
                apart.append(way)
            if args.int8:
                way = ProcessWay(name, mode, batch, 1, args.threads, "int8")
                ways["vitkit int8, own process"] = way
                apart.append(way)
        try:
            times = race(ways, args.repeats, args.iters, device)
        finally:
            for way in apart:
                way.close()
        row = dict(case=case, mode=mode, model=name, batch=batch, default_path=how,
                   img_s={n: batch / statistics.median(t) for n, t in times.items()})
        for way in ways:
            if way != "timm eager":
                row[f"{way} / timm eager"] = ratio(times, way)
        if "timm compiled" in ways:
            row["vitkit default / timm compiled"] = ratio(times, "vitkit default", "timm compiled")
        if "timm bf16 autocast" in ways:
            for way in ways:
                if way.startswith("vitkit") and "fp32" not in way and "int8" not in way and way not in ("vitkit eager", "vitkit ORT"):
                    row[f"{way} / timm bf16 autocast"] = ratio(times, way, "timm bf16 autocast")
        if int8_path is not None:
            row["vitkit int8: path"] = int8_path.describe()
            row["int8 top-1 agreement (demo digits)"] = top1_agreement(ours, device, int8_path.int8_kernel)
        if own_how is not None:
            row["vitkit fp32, own process: path"] = own_how
        if ort_note is not None:
            row["vitkit ORT"] = ort_note
            row.setdefault("vitkit ORT / timm eager", "n/a")
        if args.memory and mode == "train" and device.type == "cpu":
            row["peak_rss_mib"] = {way: peak_rss_mib(way, name, batch, args.threads)
                                   for way in ("vitkit eager", "vitkit default", "timm eager")}
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(args, rows)  # after every case: a run cut short keeps what it measured
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
