"""What gradient checkpointing saves: the peak memory and the time of one training step, with and without.

    PYTHONPATH=src .venv/bin/python benchmarks/grad_ckpt_memory.py [--model vit_base_patch16_224]
        [--batch-size 32] [--threads 2]

Each setting runs in a fresh process (so that one's peak cannot hide the other's): it builds the model
(fresh weights, training mode), then runs one step in fp32 on the CPU, forward + cross-entropy +
backward, and reports the process's peak resident memory (``resource.getrusage``'s ``ru_maxrss``) and
the step's time. The model's own memory (weights, then gradients) is in both; the saving is in the
activations that the backward pass keeps. The two settings are printed side by side with their ratios,
and the JSON goes to benchmarks/results/grad_ckpt_memory.json.
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
from vitkit.io.atomic import atomic_write_text

RESULTS = Path(__file__).parent / "results" / "grad_ckpt_memory.json"


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_step(model_name: str, batch: int, threads: int, checkpointing: bool) -> dict:
    """One fp32 training step of a fresh ``model_name`` on random images: peak RSS and the step's time."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = vitkit.create_model(model_name).train()
    model.set_grad_checkpointing(checkpointing)
    cfg = model.cfg
    x = torch.randn(batch, cfg.in_chans, *cfg.img_size)
    y = torch.randint(0, cfg.num_classes, (batch,))
    before = peak_rss_mib()  # the interpreter, torch and the weights
    t0 = time.perf_counter()
    F.cross_entropy(model(x), y).backward()
    seconds = time.perf_counter() - t0
    return {"grad_checkpointing": checkpointing, "peak_rss_mib": round(peak_rss_mib(), 1),
            "rss_before_step_mib": round(before, 1), "step_s": round(seconds, 2)}


def run_child(args, checkpointing: bool) -> dict:
    """``one_step`` in a fresh interpreter; its JSON is the last line it prints."""
    cmd = [sys.executable, __file__, "--model", args.model, "--batch-size", str(args.batch_size),
           "--threads", str(args.threads), "--child", "on" if checkpointing else "off"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)  # run one setting, print JSON
    args = p.parse_args()
    if args.child:
        print(json.dumps(one_step(args.model, args.batch_size, args.threads, args.child == "on")))
        return

    off, on = run_child(args, False), run_child(args, True)
    # what the step itself added on top of the model: the activations kept for backward, and the gradients
    step_off = off["peak_rss_mib"] - off["rss_before_step_mib"]
    step_on = on["peak_rss_mib"] - on["rss_before_step_mib"]
    ratios = {"peak_rss": round(on["peak_rss_mib"] / off["peak_rss_mib"], 3),
              "step_memory": round(step_on / step_off, 3), "step_time": round(on["step_s"] / off["step_s"], 3)}
    print(f"{args.model}, batch {args.batch_size}, fp32, CPU, {args.threads} threads: one training step")
    print(f"{'':24}{'off':>10}{'on':>10}{'on/off':>9}")
    print(f"{'peak RSS (MiB)':24}{off['peak_rss_mib']:>10.0f}{on['peak_rss_mib']:>10.0f}{ratios['peak_rss']:>9.2f}")
    print(f"{'  of it the step (MiB)':24}{step_off:>10.0f}{step_on:>10.0f}{ratios['step_memory']:>9.2f}")
    print(f"{'step time (s)':24}{off['step_s']:>10.1f}{on['step_s']:>10.1f}{ratios['step_time']:>9.2f}")
    result = {"model": args.model, "batch_size": args.batch_size, "precision": "fp32", "device": "cpu",
              "threads": args.threads, "off": off, "on": on, "ratios_on_over_off": ratios,
              "torch": torch.__version__, "machine": platform.machine(), "processor": platform.processor()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS, json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
