#!/usr/bin/env bash
# Train the demo model on the built-in digits and make the pictures and outputs of docs/tools.md:
#   docs/images/confusion_demo.png   confusion matrix of the demo model on the demo test split
#   docs/images/worst_demo.png       its most confidently wrong test digits
#   docs/images/explain_demo.png     attention rollout, [cls] attention and the grad map of the predicted
#                                    class over one test digit
#   docs/images/explain_class_demo.png   the grad map of another class (8) over the same digit
# Usage: benchmarks/make_readme_assets.sh [RUN_DIR]   (the demo run takes about 4 minutes on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/.."
VITKIT=${VITKIT:-vitkit}
RUN=${1:-runs/demo}
OUT=${OUT:-/tmp/vitkit_assets}
mkdir -p "$OUT" docs/images

if [ ! -f "$RUN/best/vitkit.json" ] && [ ! -f "$RUN/last/vitkit.json" ] \
    && [ ! -f "$RUN/best/config.json" ] && [ ! -f "$RUN/last/config.json" ]; then  # config.json: before vitkit.json
  $VITKIT train --out "$RUN"
fi

$VITKIT eval "$RUN" --out "$OUT/eval"
cp "$OUT/eval/confusion.png" docs/images/confusion_demo.png
cp "$OUT/eval/worst.png" docs/images/worst_demo.png

# one test digit of the demo set as a PNG file, then its attention maps
${PYTHON:-python} - "$OUT/digit.png" <<'PY'
import sys
from PIL import Image
from vitkit.data import open_dataset
img, label = open_dataset(None).test.get(0)
Image.fromarray(img[0].numpy()).save(sys.argv[1])
print(f"{sys.argv[1]}: a test digit labelled {label}")
PY
$VITKIT explain "$RUN" "$OUT/digit.png" --out docs/images/explain_demo.png
$VITKIT explain "$RUN" "$OUT/digit.png" --method grad --class 8 --out docs/images/explain_class_demo.png
$VITKIT predict "$RUN" "$OUT/digit.png" --top-k 3
