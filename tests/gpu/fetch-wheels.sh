#!/usr/bin/env bash
# Downloads the Python wheels the GPU machine lacks into .whl/ (git-ignored), to be carried
# with a device call: `gguf`, which HF transformers needs to read the SmolLM2 GGUF in
# tests/gpu/hf_gguf_check.py (its other needs, numpy, pyyaml, requests and tqdm, are there).
# tests/gpu/device.sh installs whatever .whl/ holds.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp -d .whl gguf==0.19.0
ls -la .whl
