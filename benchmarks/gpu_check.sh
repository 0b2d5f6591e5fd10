#!/usr/bin/env bash
# The GPU check: vitkit's CUDA paths end to end, in one script that fits in a few minutes on one GPU.
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]        (default runs/gpu_check)
#
# Needs torch with CUDA, and timm for the last step; vitkit is imported from src/ when it is not
# installed. Each step runs under a time limit and is reported as ok or FAILED with its exit code, so
# one broken path does not hide the others; the log and the JSON results go to OUT_DIR:
#   1. the runtime choices on a CUDA machine (tests/test_runtime.py, tests/test_train_units.py);
#   2. the digits demo on one GPU, with its defaults (precision auto = bf16 where the GPU has it);
#   3. the same data under torchrun (NCCL process group, world size 1), and with --compile;
#   4. eval, predict and explain (gradient-weighted, for a chosen class) on the GPU;
#   5. bench ViT-B/16 in fp32 and bf16, inference and training, batch 64 and 256;
#   6. vitkit against timm on the GPU (bf16 autocast, ViT-B/16, batch 64 and 256), as ratios;
#   7. FSDP on one GPU (--strategy fsdp, a group of one): 250 steps of the digits in bf16 with EMA and
#      gradient accumulation, beside the same run under DDP; its loss must fall as DDP's does;
#   8. gradient checkpointing's memory: peak torch.cuda.max_memory_allocated of one ViT-B/16 training
#      step (bf16 autocast) with and without, at batch 32 and 64 (benchmarks/grad_ckpt_memory.py).
# Steps 1-6 took 6 minutes on one H200 (--compile 2 of them); 7 and 8 took 77 s there (results/gpu_check/run2_*).
# GPU_CHECK_SKIP="compile bench" leaves out the named steps (e.g. to fit a shorter lease).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/gpu_check}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
python3 -c "import vitkit" 2>/dev/null || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
LOG="$OUT/gpu_check.log"
: >"$LOG"
fails=0

step() {  # step NAME SECONDS CMD...
    local name=$1 limit=$2
    shift 2
    case " ${GPU_CHECK_SKIP:-} " in *" $name "*) echo "=== $name: skipped" | tee -a "$LOG"; return;; esac
    echo "=== $name: $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        echo "=== $name: ok ($((SECONDS - t0)) s)" | tee -a "$LOG"
    else
        echo "=== $name: FAILED rc=$rc ($((SECONDS - t0)) s)" | tee -a "$LOG"
        fails=$((fails + 1))
    fi
}

step env 60 "$PY" -c "import torch, vitkit; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'bf16', torch.cuda.is_bf16_supported())"
step units 120 "$PY" -m pytest -q -p no:cacheprovider tests/test_runtime.py tests/test_train_units.py
step demo 300 "$PY" -m vitkit train --out "$OUT/demo" --json
step torchrun 180 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m vitkit train --out "$OUT/ddp1" --epochs 3 --max-minutes 0 --json
step compile 240 "$PY" -m vitkit train --out "$OUT/compile" --epochs 3 --max-minutes 0 --compile --json
step eval 60 "$PY" -m vitkit eval "$OUT/demo" --json   # --device auto: the GPU
step digits 60 "$PY" -c "
import sys, numpy as np
from PIL import Image
from vitkit.data import open_dataset
test = open_dataset(None).test
for i in range(64):
    Image.fromarray(np.asarray(test.images[i, 0])).save(f'$OUT/digit_{i:02d}_{int(test.labels[i])}.png')
"
step predict 60 "$PY" -m vitkit predict "$OUT/demo" "$OUT/digit_*.png" --device cuda --top-k 1 --json
step explain 60 "$PY" -m vitkit explain "$OUT/demo" "$(ls "$OUT"/digit_00_*.png)" --class 8 --out "$OUT/explain.png"
step bench 240 "$PY" -m vitkit bench vit_base_patch16_224 --device cuda --dtype fp32,bf16 --mode infer,train \
    --batch-sizes 64,256 --repeats 10 --warmup 3 --json
for bs in 64 256; do
    step "vs_timm_b$bs" 240 "$PY" benchmarks/model_vs_timm.py --device cuda --dtypes bf16 --models vit_base_patch16_224 \
        --batch-size "$bs" --repeats 5 --iters 5 --out "$OUT/model_vs_timm_cuda_b$bs.json"
done
# the same short run under FSDP and DDP (one process: plain training); then: both completed, and FSDP's
# loss fell (by a quarter at least) as DDP's did, to within 10% of it, with the same test accuracy within a point
SHORT=(--epochs 2 --max-minutes 0 --precision bf16 --ema 0.99 --accum-steps 2 --ckpt-every 100 --json)
step fsdp 180 "$PY" -m vitkit train --out "$OUT/fsdp1" --strategy fsdp "${SHORT[@]}"
step ddp_bf16 180 "$PY" -m vitkit train --out "$OUT/ddp_bf16" --strategy ddp "${SHORT[@]}"
step fsdp_vs_ddp 30 "$PY" -c "
import json, sys
def run(name):
    rows = [json.loads(line) for line in open(f'$OUT/{name}/metrics.jsonl')]
    steps = [r['loss'] for r in rows if r['type'] == 'step']
    final = next(r for r in rows if r['type'] == 'final')
    return steps[0], sum(steps[-3:]) / 3, final
(a0, a1, fa), (b0, b1, fb) = run('fsdp1'), run('ddp_bf16')
print(f'fsdp : loss {a0:.4f} -> {a1:.4f} (last 3 records), test acc {fa[\"test_acc\"]:.4f}, {fa[\"train_seconds\"]} s')
print(f'ddp  : loss {b0:.4f} -> {b1:.4f} (last 3 records), test acc {fb[\"test_acc\"]:.4f}, {fb[\"train_seconds\"]} s')
ok = fa['status'] == fb['status'] == 'completed' and a1 < 0.75 * a0 and abs(a1 - b1) <= 0.1 * b1 + 0.02
ok = ok and abs(fa['test_acc'] - fb['test_acc']) <= 0.01
sys.exit(0 if ok else 1)
"
for bs in 32 64; do
    step "grad_ckpt_b$bs" 120 "$PY" benchmarks/grad_ckpt_memory.py --device cuda --precision bf16 --batch-size "$bs" \
        --out "$OUT/grad_ckpt_memory_cuda_b$bs.json"
done
echo "gpu check: $fails step(s) failed" | tee -a "$LOG"
exit $((fails > 0))
