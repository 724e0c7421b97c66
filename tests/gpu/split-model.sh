#!/usr/bin/env bash
# Cuts models/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, fetched by tools/fetch-model) into two
# git-ignored folders small enough for one device call each, beside the 13 MB test bundle:
#   .device-carry-model-a/part-aa  (54 MiB)    carry it with any short first call
#   .device-carry-model-b/part-ab  (the rest)  carry it with .device-carry in the next call
# tests/gpu/device.sh joins and checksums them on the GPU machine.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || tools/fetch-model
rm -rf .device-carry-model-a .device-carry-model-b
mkdir -p .device-carry-model-a .device-carry-model-b
split -b 54M -a 2 "$model" .device-carry-model-a/part-
mv .device-carry-model-a/part-ab .device-carry-model-b/
du -sh .device-carry-model-a .device-carry-model-b
