"""What gradient checkpointing saves: the peak memory and the time of one training step, with and without.

    PYTHONPATH=src .venv/bin/python benchmarks/grad_ckpt_memory.py [--model vit_base_patch16_224]
        [--batch-size 32] [--threads 2] [--device cpu|cuda] [--precision fp32|bf16] [--out FILE]

Each setting runs in a fresh process (so that one's peak cannot hide the other's): it builds the model
(fresh weights, training mode), then runs one step, forward + cross-entropy + backward (in fp32, or
under bf16 autocast), and reports the step's time and the peak memory: on the CPU the process's peak
resident memory (``resource.getrusage``'s ``ru_maxrss``); on CUDA ``torch.cuda.max_memory_allocated``
over the timed step, which follows one untimed warm-up step (kernels chosen, workspaces allocated;
its gradients freed). The model's own memory (weights, then gradients) is in both; the saving is in
the activations that the backward pass keeps. The two settings are printed side by side with their
ratios, and the JSON goes to benchmarks/results/grad_ckpt_memory.json (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import vitkit
from vitkit.infer.paths import autocast
from vitkit.io.atomic import atomic_write_text

RESULTS = Path(__file__).parent / "results" / "grad_ckpt_memory.json"


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_alloc_mib() -> float:
    """The peak of the memory torch allocated on the current GPU since the last reset, in MiB."""
    return torch.cuda.max_memory_allocated() / 2**20


def memory_kind(device: str) -> str:
    """What is measured on ``device``: 'rss' (the process's resident memory) or 'alloc' (CUDA's allocations)."""
    return "alloc" if device == "cuda" else "rss"


def one_step(model_name: str, batch: int, threads: int, checkpointing: bool, device: str = "cpu",
             precision: str = "fp32") -> dict:
    """One training step of a fresh ``model_name`` on random images: the peak memory and the step's time."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    model = vitkit.create_model(model_name).train().to(dev)
    model.set_grad_checkpointing(checkpointing)
    cfg = model.cfg
    x = torch.randn(batch, cfg.in_chans, *cfg.img_size, device=dev)
    y = torch.randint(0, cfg.num_classes, (batch,), device=dev)

    def step():
        with autocast(dev, precision):
            logits = model(x)
        F.cross_entropy(logits.float(), y).backward()

    peak = peak_rss_mib
    if dev.type == "cuda":
        step()  # warm-up, untimed
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        peak = peak_alloc_mib
    before = peak()  # the weights (on the CPU also the interpreter and torch)
    t0 = time.perf_counter()
    step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    kind = memory_kind(device)
    return {"grad_checkpointing": checkpointing, f"peak_{kind}_mib": round(peak(), 1),
            f"{kind}_before_step_mib": round(before, 1), "step_s": round(seconds, 4 if dev.type == "cuda" else 2)}


def run_child(args, checkpointing: bool) -> dict:
    """``one_step`` in a fresh interpreter; its JSON is the last line it prints."""
    cmd = [sys.executable, __file__, "--model", args.model, "--batch-size", str(args.batch_size),
           "--threads", str(args.threads), "--device", args.device, "--precision", args.precision,
           "--child", "on" if checkpointing else "off"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: under autocast")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"where the JSON goes (default: {RESULTS})")
    p.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)  # run one setting, print JSON
    args = p.parse_args()
    if args.child:
        print(json.dumps(one_step(args.model, args.batch_size, args.threads, args.child == "on", args.device,
                                  args.precision)))
        return

    off, on = run_child(args, False), run_child(args, True)
    kind = memory_kind(args.device)
    peak, before = f"peak_{kind}_mib", f"{kind}_before_step_mib"
    # what the step itself added on top of the model: the activations kept for backward, and the gradients
    step_off, step_on = off[peak] - off[before], on[peak] - on[before]
    ratios = {f"peak_{kind}": round(on[peak] / off[peak], 3),
              "step_memory": round(step_on / step_off, 3), "step_time": round(on["step_s"] / off["step_s"], 3)}
    where = f"CPU, {args.threads} threads" if args.device == "cpu" else torch.cuda.get_device_name(0)
    label = "peak RSS (MiB)" if kind == "rss" else "peak allocated (MiB)"
    print(f"{args.model}, batch {args.batch_size}, {args.precision}, {where}: one training step")
    print(f"{'':24}{'off':>10}{'on':>10}{'on/off':>9}")
    print(f"{label:24}{off[peak]:>10.0f}{on[peak]:>10.0f}{ratios[f'peak_{kind}']:>9.2f}")
    print(f"{'  of it the step (MiB)':24}{step_off:>10.0f}{step_on:>10.0f}{ratios['step_memory']:>9.2f}")
    print(f"{'step time (s)':24}{off['step_s']:>10.3f}{on['step_s']:>10.3f}{ratios['step_time']:>9.2f}")
    result = {"model": args.model, "batch_size": args.batch_size, "precision": args.precision, "device": args.device,
              "threads": args.threads, "off": off, "on": on, "ratios_on_over_off": ratios,
              "torch": torch.__version__, "machine": platform.machine(), "processor": platform.processor()}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
