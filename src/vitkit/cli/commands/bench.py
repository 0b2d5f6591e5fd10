"""`vitkit bench MODEL|CKPT`: images/s, latency, peak memory, FLOPs and MFU, per batch size and dtype."""

from __future__ import annotations

from . import image_size


def _csv(kind):
    def parse(s: str):
        import argparse

        try:
            return [kind(v) for v in s.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {s!r}") from None

    return parse

def register(p):
    p.add_argument("model", help="a model name (see `vitkit list`; random weights), a checkpoint or a run directory")
    p.add_argument("--batch-sizes", type=_csv(int), default=[1, 32], help="comma-separated (default 1,32)")
    p.add_argument("--img-size", type=image_size, default=None, help="N or HxW (default: the model's own)")
    p.add_argument("--dtype", type=_csv(str), default=["fp32"],
                   help="comma-separated of fp32, bf16, int8, auto (the precision the tools and training pick "
                        "for this model here) (default fp32)")
    p.add_argument("--mode", type=_csv(str), default=["infer"], help="comma-separated of infer, train (default infer)")
    p.add_argument("--repeats", type=int, default=10, help="timed steps per configuration (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model first")
    p.add_argument("--device", default="auto",
                   help="auto, cpu, cuda, cuda:N or mps (default auto: a CUDA GPU if present, else MPS, else the CPU)")
    p.add_argument("--json", action="store_true", help="print a JSON object as the last line")


def run(args) -> int:
    from ...tools.bench import bench, format_table
    from . import json_line

    res = bench(args.model, batch_sizes=args.batch_sizes, img_size=args.img_size, dtypes=args.dtype,
                modes=args.mode, repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                compile=args.compile, device=args.device)
    print(format_table(res))
    if args.json:
        print(json_line(res))
    return 0
