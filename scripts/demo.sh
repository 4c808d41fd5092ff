#!/usr/bin/env bash
# Sets up and runs the demo: what the caching managed allocator does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
python3 examples/demo.py
