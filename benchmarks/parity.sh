#!/usr/bin/env bash
# Every parity test (timm's included) and the parity table, in one command:
#
#     bash benchmarks/parity.sh
#
# Creates .venv-ref in the repository (torch 2.14.1, torchvision, timm, transformers and vitkit with its
# test extras) unless it exists, then runs the conversion and parity tests and benchmarks/parity.py,
# which prints the table of max abs logit differences and writes benchmarks/results/parity.json.
# VENV=/path/to/env reuses another environment that has timm and transformers (vitkit is installed
# into it, editable, without dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-ref}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.14.1 torchvision==0.29.1 timm transformers -e ".[test]"
else
    "$VENV/bin/pip" install -q --no-deps -e .
fi
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_parity_timm.py tests/test_parity_hf.py \
    tests/test_convert_timm.py tests/test_convert_hf.py tests/test_convert_jax.py
"$VENV/bin/python" benchmarks/parity.py "$@"
