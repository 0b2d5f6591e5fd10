#!/usr/bin/env bash
# The small-data recipe, part by part, on CIFAR-10 (the 50,000 training images; 10% carved out as the
# validation split, seed 0) at an equal CPU budget: each run gets MINUTES of training on one thread,
# two runs side by side on a 2-core machine. A narrow model (width 64, 4 blocks) stands in for
# vit_hybrid_tiny_patch4_32 so that the budget covers a few epochs. Writes one JSON summary per run
# (with its command and wall time) to benchmarks/results/train_small_data_ablation.jsonl.
# With a third argument `5k`, the runs use a small-data subset instead: the first 500 images of each
# class as train/ and the next 500 as val/ (5,000 + 5,000), so that the budget covers about 30 epochs
# and the regularisers have something to do; the summaries then go to ..._5k.jsonl.
# Usage: benchmarks/train_small_data_ablation.sh CIFAR_TRAIN_DIR [MINUTES] [5k]   (10 minutes a run)
set -euo pipefail
cd "$(dirname "$0")/.."
VITKIT=${VITKIT:-vitkit}
DATA=${1:?usage: $0 CIFAR_TRAIN_DIR [MINUTES]}
MIN=${2:-10}
OUT=${OUT:-/tmp/vitkit_small_data_ablation}
RES=benchmarks/results/train_small_data_ablation.jsonl
mkdir -p "$OUT"
EXTRA=""
if [ "${3:-}" = 5k ]; then
  RES=benchmarks/results/train_small_data_ablation_5k.jsonl
  SUB=$OUT/cifar5k
  if [ ! -d "$SUB/val" ]; then
    python3 - "$DATA" "$SUB" <<'PY'
import os, shutil, sys
src, dst = sys.argv[1:]
for c in sorted(os.listdir(src)):
    files = sorted(os.listdir(os.path.join(src, c)))
    for part, chosen in (("train", files[:500]), ("val", files[500:1000])):
        os.makedirs(os.path.join(dst, part, c), exist_ok=True)
        for f in chosen:
            a, b = os.path.join(src, c, f), os.path.join(dst, part, c, f)
            try:
                os.link(a, b)
            except OSError:
                shutil.copyfile(a, b)
PY
  fi
  DATA=$SUB
  OUT=$OUT/5k
  mkdir -p "$OUT"
fi

run() {  # run NAME ARGS...: one training run; its summary, command and wall time appended to $RES
  local name=$1; shift
  python3 benchmarks/record_run.py "$RES" "$name" $VITKIT train --config configs/small-data.toml --data $DATA --max-minutes $MIN --nproc 1 --threads 1 --quiet --json --out $OUT/$name $*
}

SMALL="--set model_args.embed_dim=64 --set model_args.depth=4 --set model_args.num_heads=4"
STRONG="--set augment.auto=randaugment --set augment.mixup_alpha=0.8 --set augment.cutmix_alpha=1.0 --set augment.erase_prob=0.25"
LIGHT="--set augment.auto=none --set augment.mixup_alpha=0 --set augment.cutmix_alpha=0 --set augment.erase_prob=0"
PLAIN="--set model_args.drop_path_rate=0 --set ema=none"
if [ "${3:-}" = 5k ]; then
  # the whole recipe (EMA decay warmed up) against the hybrid with light augmentation, then the recipe's
  # regularisers without its strong augmentation, and its strong augmentation without them
  run hybrid_recipe $SMALL $STRONG & run hybrid_light $SMALL $LIGHT $PLAIN & wait
  run hybrid_light_reg $SMALL $LIGHT & run hybrid_strong $SMALL $STRONG $PLAIN & wait
  exit 0
fi
# 1. a plain ViT (patch projection, learned positions, [cls] token) vs 2. the hybrid (conv stem, 2D
#    sin-cos, average pooling), both with light augmentation (pad-and-crop, flips, label smoothing)
run vit_light --model vit_mini_patch4_32 $LIGHT $PLAIN & \
  run hybrid_light $SMALL $LIGHT $PLAIN & wait
# 3. the hybrid with strong augmentation (RandAugment, mixup/cutmix, random erasing);
# 4. strong augmentation, drop path 0.1 and an EMA of the weights (the config's drop path and EMA)
run hybrid_strong $SMALL $STRONG $PLAIN & \
  run hybrid_recipe $SMALL $STRONG & wait
