#!/usr/bin/env bash
# The sampled-decoding measurement on the GPU machine: 32 requests in flight, each a 2,000-token
# document and a question, 256 generated tokens each, random llama3-8b weights, CUDA backend;
# `lazyattn replay` greedy, then with --temperature 0.8 --top-p 0.95 --seed 7 (LAZYATTN_REPLAY_ROUNDS
# rounds of the pair, default 1).
# Prints each run's wall time and output tokens/s.   tests/gpu/sampled_replay.sh [CARRY_DIR]
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
carry="${1:-.device-carry}"
# shellcheck source=tests/gpu/carry_env.sh
source tests/gpu/carry_env.sh
use_carry "$repo" "$carry"
requests=/tmp/sampled-replay.jsonl
python3 - "$requests" <<'PY'
import json, random, sys
rng = random.Random(7)
words = ["river", "bridge", "canal", "city", "name", "water", "house", "boat", "street", "light"]
with open(sys.argv[1], "w") as f:
    for i in range(32):
        text = ""
        while len(text) < 2000:
            text += rng.choice(words) + " "
        f.write(json.dumps({"documents": [text[:2000]], "question": f"Question {i}: what is it?",
                            "max_tokens": 256, "mode": "lazy"}) + "\n")
PY
common=(replay --model random:llama3-8b --backend cuda --requests "$requests" --concurrency 32
        --kv-budget 17179869184 --ignore-eos --max-tokens 256)
status=0
for round in $(seq "${LAZYATTN_REPLAY_ROUNDS:-1}"); do
  for kind in greedy sampled; do
    extra=()
    [ "$kind" = sampled ] && extra=(--temperature 0.8 --top-p 0.95 --seed 7)
    start=$(date +%s.%N)
    if ! timeout 250 "$carry/bin/lazyattn" "${common[@]}" "${extra[@]}" --json > "/tmp/replay-$kind-$round.json" 2>&1; then
      status=1
      tail -n 5 "/tmp/replay-$kind-$round.json"
    fi
    end=$(date +%s.%N)
    python3 - "$kind" "$round" "$start" "$end" "/tmp/replay-$kind-$round.json" <<'PY'
import json, sys
kind, rnd, start, end, path = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
summary = {}
for line in open(path):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if j.get("summary"):
        summary = j
seconds = summary.get("seconds", 0) or float("nan")
tokens = (summary.get("requests", 0) - summary.get("failures", 0)) * 256  # --ignore-eos
print(f"replay {kind} round {rnd}: {seconds:.2f} s replay wall ({end - start:.1f} s with model "
      f"creation), {tokens} output tokens, {tokens / seconds:.0f} tok/s")
PY
    tail -n 1 "/tmp/replay-$kind-$round.json"
  done
done
exit $status
