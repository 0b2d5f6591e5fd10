#!/usr/bin/env bash
# The budget rule on a GPU: what `vitkit train --data DIR --max-minutes M` measures, expects and chooses on a
# CUDA device, and the accuracy larger candidates reach there in epochs (the table's kind of point).
#
#     bash benchmarks/gpu_budget.sh CIFAR_TGZ [PHOTOS_TGZ] [OUT_DIR]      (default OUT_DIR runs/gpu_budget)
#
# CIFAR_TGZ: a tar.gz of CIFAR-10's training split as class folders (train/<class>/*.jpg), PHOTOS_TGZ one of a
# photo set's (catsdogs/train/<class>/*.jpg), e.g. `tar czf cifar10.tgz -C DIR train` (16 MB for CIFAR-10's
# 50,000 JPEGs, 24 MB for catsdogs). Both are unpacked under /tmp and decoded into a fresh cache.
#   1. the rule alone: `vitkit train --data train --max-minutes $GPU_RULE_MINUTES` (default 2: where the table trains
#      wide-b512 if this GPU measures it at 8,500 images/s or more; 1 read 85.26% with long-lr-3x on an H200);
#   2. then side by side on the one GPU, each bounded by $GPU_CAND_MINUTES (default 3.5), the CIFAR-10
#      candidates below that $GPU_CANDIDATES names (their whole settings given, so the rule's own choice is
#      overridden), the rule on the photos and photo candidates. Sharing the GPU slows each run, so they
#      reach fewer epochs than alone; what each records is its epochs and its carve accuracy there (seed 0's
#      carve of 10% of the images), which do not depend on the speed: the table's points.
# Logs and one row per run (summary.jsonl, benchmarks/gpu_budget_rows.py) go to OUT_DIR. The runs on one H200,
# logs in results/gpu_budget/, rows in results/gpu_budget.jsonl:
#   run1_*: GPU_RULE_MINUTES=1 GPU_CAND_MINUTES=4 bash benchmarks/gpu_budget.sh cifar10.tgz catsdogs.tgz
#   run2_*: GPU_RULE_MINUTES=0 GPU_CAND_MINUTES=5 GPU_CANDIDATES="wide-4x192-b512 wide-6x256-b512
#           wide-4x192-b1024 photos-128px-6-blocks" bash benchmarks/gpu_budget.sh cifar10.tgz catsdogs.tgz
set -uo pipefail
cd "$(dirname "$0")/.."
CIFAR=${1:?a tar.gz of CIFAR-10 train/<class>/*.jpg}
PHOTOS=${2:-}
OUT="${3:-runs/gpu_budget}"
PY="${PYTHON:-python3}"
RULE_MIN=${GPU_RULE_MINUTES:-2}
CAND_MIN=${GPU_CAND_MINUTES:-3.5}
WORK=${GPU_WORK:-/tmp/gpu_budget}
mkdir -p "$OUT" "$WORK/data"
rm -f "$OUT"/*.log "$OUT/summary.jsonl"
python3 -c "import vitkit" 2>/dev/null || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME="$WORK/cache"
rm -rf "$WORK/cache" "$WORK/runs"
LOG="$OUT/rule.log"
{
    "$PY" -c "import torch, vitkit, os; print('torch', torch.__version__, 'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu', 'cpus', os.cpu_count())"
    t0=$SECONDS
    tar xzf "$CIFAR" -C "$WORK/data" && echo "unpacked $CIFAR ($((SECONDS - t0)) s)"
    [ -n "$PHOTOS" ] && tar xzf "$PHOTOS" -C "$WORK/data" && echo "unpacked $PHOTOS"
} >"$LOG" 2>&1
D="$WORK/data/train"

run() {  # run NAME LOGFILE ARGS...: one clock-bounded training run, its last line the JSON summary
    local name=$1 log=$2
    shift 2
    echo "=== $name: vitkit train $*" >>"$log"
    "$PY" -m vitkit train --json --progress-every 60 --out "$WORK/runs/$name" "$@" >>"$log" 2>&1
    echo "=== $name: exit $?" >>"$log"
}

# 1. the rule alone, as a user runs it (GPU_RULE_MINUTES=0: not run)
if [ "$RULE_MIN" != 0 ]; then
    run rule "$LOG" --data "$D" --max-minutes "$RULE_MIN"
    sed -n '/^=== rule:/,$p' "$LOG"
fi

# 2. candidates side by side (GPU_CANDIDATES: their names, default the first five). Each gives every setting
#    the rule's candidates differ in; the photos' own rule where a photo set was given.
P="$WORK/data/catsdogs/train"
LONG="--ema 0.999 --set model_args.stem_convs=2 --set model_args.stem_early_convs=2"
W4="--set model_args.depth=4 --set model_args.embed_dim=192 --set model_args.num_heads=3"
W6="--set model_args.depth=6 --set model_args.embed_dim=256 --set model_args.num_heads=4"
declare -A CAND=(
    [long]="--data $D $LONG --lr 0.002"
    [wide-4x192]="--data $D $LONG --lr 0.002 $W4"
    [wide-6x256]="--data $D $LONG --lr 0.002 $W6"
    [long-b512]="--data $D $LONG --lr 0.004 --batch-size 512"
    [wide-4x192-b512]="--data $D $LONG --lr 0.004 --batch-size 512 $W4"
    [wide-6x256-b512]="--data $D $LONG --lr 0.004 --batch-size 512 $W6"
    [wide-4x192-b1024]="--data $D $LONG --lr 0.006 --batch-size 1024 $W4"
    [photos-rule]="--data $P"
    [photos-128px-6-blocks]="--data $P --img-size 128 --set model_args.depth=6"
)
n=0
for name in ${GPU_CANDIDATES:-long wide-4x192 wide-6x256 long-b512 wide-4x192-b512 photos-rule}; do
    case "$name" in photos-*) [ -n "$PHOTOS" ] || continue;; esac
    # shellcheck disable=SC2086
    run "$name" "$OUT/$name.log" --max-minutes "$CAND_MIN" --threads 2 ${CAND[$name]} &
    n=$((n + 1))
done
wait

# one row per run (benchmarks/gpu_budget_rows.py): its name, flags, recipe line and JSON summary
"$PY" benchmarks/gpu_budget_rows.py "$OUT"/*.log --side-by-side "$n" --out "$OUT/summary.jsonl"
