#!/usr/bin/env bash
# The router's own costs, measured on a quiet machine (the GPU machine's CPUs; the build machine is
# shared by compiles): mutual TLS + API keys against plaintext, with `lazyattn trace` through
# tools/cluster in alternated rounds (docs/operations.md "Cost"), and, when the Python packages are
# there, the HTTP API against the gRPC API (tools/bench/http_overhead.py). CPU workers on the tiny
# test model, so the router's work is a visible share of each request.
#   tests/gpu/overhead.sh CARRY_DIR [ROUNDS]     (device.sh part `overhead`)
# Each round's JSON lines go to $OUT/overhead-*.jsonl; a summary goes to stdout.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
carry="${1:-.device-carry}"
rounds="${2:-3}"
# shellcheck source=tests/gpu/carry_env.sh
source tests/gpu/carry_env.sh
use_carry "$repo" "$carry"
out="${OUT:-/tmp}"
work="$(mktemp -d)"
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
command -v openssl >/dev/null || echo "openssl missing: the secured rounds cannot make certificates"

sed -e "s|^  path: .*|  path: tests/data/tiny/tiny-llama/tiny-llama-f32.gguf|" \
    -e "s|^backend: .*|backend: cpu|" deploy/local/worker.yaml > "$work/worker.yaml"
cat > "$work/cluster.yaml" <<EOF
bin_dir: $carry/bin
log_dir: $work/logs
startup_timeout_s: 60
stop_grace_s: 10
kvdir:
  config: deploy/local/kvdir.yaml
router:
  config: deploy/local/router.yaml
workers:
  count: 2
  config: $work/worker.yaml
security:
  certs_dir: $work/certs
  insecure: false
EOF

trace_args=(trace --doc-tokens 32 --docs-per-request 2 --max-tokens 4 --pool 20 --seed 7)
status=0
for round in $(seq 1 "$rounds"); do
  for mode in secured insecure; do
    flag=()
    [ "$mode" = insecure ] && flag=(--insecure)
    # A warm-up trace (documents cached, connections up), then the measured one, in one cluster.
    # shellcheck disable=SC2016
    timeout 300 python3 tools/cluster --config "$work/cluster.yaml" "${flag[@]}" -- bash -c '
      "$LAZYATTN_BIN_DIR/lazyattn" "$@" --router "$LAZYATTN_ROUTER" --requests 100 --rate 20 --label warmup >/dev/null &&
      "$LAZYATTN_BIN_DIR/lazyattn" "$@" --router "$LAZYATTN_ROUTER" --requests 400 --rate 20 --label "'"$mode"'"' _ \
      "${trace_args[@]}" 2>&1 | tee -a "$out/overhead-tls.log" |
      grep '^{' >> "$out/overhead-tls-$mode.jsonl" || status=1
  done
done
# HTTP against gRPC: needs grpcio and httpx (the image has them) and grpc_tools (a carried wheel).
if python3 -c 'import grpc, httpx, grpc_tools' 2>/dev/null; then
  echo "=== HTTP API against gRPC API"
  # No GPU visible: the workers' `backend: auto` picks the CPU, as on the build machine.
  CUDA_VISIBLE_DEVICES= timeout 300 python3 tools/bench/http_overhead.py --bin-dir "$carry/bin" --n "${LAZYATTN_HTTP_N:-1000}" \
    --json-out "$out/overhead-http.json" 2>&1 | tail -n 30 || status=1
else
  echo "HTTP against gRPC not run: python3 lacks grpc, httpx or grpc_tools (carry .whl, device.sh installs it)"
fi
python3 - "$out" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
for mode in ("secured", "insecure"):
    try:
        rows = [json.loads(l) for l in open(f"{out}/overhead-tls-{mode}.jsonl")]
    except OSError:
        print(mode, "no results"); continue
    keys = [k for k in rows[0] if any(s in k for s in ("p50", "p99"))] if rows else []
    print(mode, len(rows), "rounds:", {k: [r.get(k) for r in rows] for k in keys})
EOF
exit $status
