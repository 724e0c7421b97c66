#!/usr/bin/env bash
# Cuts models/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, fetched by tools/fetch-model) into three
# git-ignored folders, each small enough for one device call (64 MiB with the working tree):
#   .device-carry-model-a/part-aa  (50 MiB)    carry it with any short first call
#   .device-carry-model-b/part-ab  (28 MiB)    carry it with a second call (.device-carry fits beside it)
#   .device-carry-model-c/part-ac  (the rest)  carry it with a third call
# tests/gpu/device.sh joins (in name order) and checksums them on the GPU machine, which keeps
# each call's carried folders while it stays warm. Two parts no longer fit: the second (40 MiB)
# beside the 15 MB test bundle and the tree came to more than 64 MiB (2026-12-01); with the tree at
# 11 MiB, the first part is 50 MiB (2026-12-02).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || tools/fetch-model
rm -rf .device-carry-model-a .device-carry-model-b .device-carry-model-c
mkdir -p .device-carry-model-a .device-carry-model-b .device-carry-model-c
split -b 50M -a 2 "$model" .device-carry-model-a/part-
split -b 28M -a 1 .device-carry-model-a/part-ab .device-carry-model-a/rest-
rm .device-carry-model-a/part-ab
mv .device-carry-model-a/rest-a .device-carry-model-b/part-ab
mv .device-carry-model-a/rest-b .device-carry-model-c/part-ac
du -sh .device-carry-model-a .device-carry-model-b .device-carry-model-c
