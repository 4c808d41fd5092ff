#!/usr/bin/env bash
# Sets up and runs the demo: a model larger than its GPU budget, run and
# trained bit for bit as all on the GPU (examples/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo >/dev/null
python3 examples/demo.py
