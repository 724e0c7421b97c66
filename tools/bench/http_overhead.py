#!/usr/bin/env python3
"""Router overhead of the HTTP API against the gRPC API for the same request, from one Python
client: the same greedy streamed chat request (a system message, two documents, a question) sent
through gRPC `Inference.Generate` (grpcio) and HTTP `POST /v1/chat/completions` with `stream: true`
(httpx, one keep-alive connection, SSE parsed by hand). Prints, per arm, p50/p99 of the time to the
first token and of the whole request, and of the gaps between consecutive tokens as the client
receives them (SSE token delivery), then HTTP - gRPC at p50 and p99 (the HTTP path's added latency:
the worker's work is the same), with the command and the machine that produced them.

Unattended, on a quiet machine, against a binaries folder (starts kvdir, one worker and a router
with the HTTP API, plaintext, on OS-chosen ports; stops them at the end):

  build/test-venv/bin/python tools/bench/http_overhead.py --bin-dir build/bin [--n 1000]

Or against a running cluster (tools/cluster --insecure -- ... sets LAZYATTN_ROUTER, LAZYATTN_HTTP):

  tools/cluster --insecure -- build/test-venv/bin/python tools/bench/http_overhead.py

The requests run in rounds of --round-size per arm, the arms' order alternating from round to
round (gRPC first, then HTTP first, ...), so a drift of the machine (another process, frequency,
cache growth) falls on both arms alike. At least 1000 requests per arm (--n); fewer only with
--smoke, whose numbers are marked as not a measurement. Needs grpcio, grpcio-tools and httpx
(tools/setup-test-venv). Plaintext: TLS costs are not part of the comparison.
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time

import grpc
import httpx
from grpc_tools import protoc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_MODEL = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf"
SYSTEM = "Answer in one sentence using the documents."
DOCS = ["The Seine flows through Paris and reaches the English Channel at Le Havre.",
        "The Loire is the longest river in France; its valley is known for its castles."]
QUESTION = "Which river flows through Paris?"
HTTP_RE = re.compile(r"lazyattn-router http on (https?://\S+)")
MIN_N = 1000
WARMUP = 20  # per arm: documents cached, connections open, allocators warm


def load_stubs():
    out = tempfile.mkdtemp(prefix="lazyattn_stubs_")
    proto_dir = os.path.join(REPO, "proto")
    for name in ("inference",):
        if protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}",
                        f"--grpc_python_out={out}",
                        os.path.join(proto_dir, "lazyattn", "v1", f"{name}.proto")]) != 0:
            sys.exit(f"protoc failed on {name}.proto")
    sys.path.insert(0, out)
    from lazyattn.v1 import inference_pb2, inference_pb2_grpc  # noqa: E402
    return inference_pb2, inference_pb2_grpc


def pct(values, p):
    """The p-th percentile in ms (nearest rank); nan for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] * 1000.0


def grpc_once(stub, pb, max_tokens):
    request = pb.GenerateRequest(
        messages=[pb.ChatMessage(role=b"system", content=SYSTEM.encode()),
                  pb.ChatMessage(role=b"user", content=QUESTION.encode())],
        documents=[pb.Document(id=f"d{i}".encode(), text=t.encode()) for i, t in enumerate(DOCS)],
        chat=True, sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0))
    start = time.perf_counter()
    first, times, text = None, [], ""
    for r in stub.Generate(request, timeout=60):
        if r.HasField("token"):
            now = time.perf_counter()
            first = first or now
            times.append(now)
            text += r.token.text
    end = time.perf_counter()
    return (first or end) - start, end - start, times, text


def http_once(client, url, max_tokens):
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
            "documents": [{"id": f"d{i}", "text": t} for i, t in enumerate(DOCS)],
            "temperature": 0, "max_tokens": max_tokens, "stream": True}
    start = time.perf_counter()
    first, times, text = None, [], ""
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                delta = c.get("delta", {}).get("content")
                if delta:
                    now = time.perf_counter()
                    first = first or now
                    times.append(now)
                    text += delta
    end = time.perf_counter()
    return (first or end) - start, end - start, times, text


def start_cluster(args):
    """kvdir, one worker and a router with the HTTP API from args.bin_dir, plaintext, on
    OS-chosen ports (tests/integration/cluster_harness.py, as the integration tests start them).
    Returns (cluster, gRPC address, HTTP URL)."""
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    from cluster_harness import Cluster  # noqa: E402
    for name in ("lazyattn-kvdir", "lazyattn-worker", "lazyattn-router", "lazyattn"):
        if not os.access(os.path.join(args.bin_dir, name), os.X_OK):
            sys.exit(f"--bin-dir {args.bin_dir}: no executable {name}")
    tmp = tempfile.mkdtemp(prefix="lazyattn-http-overhead-")
    c = Cluster(args, tmp, 1, "cache_aware", model=args.model,
                router_extra="http:\n  listen: 127.0.0.1:0\n")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(c.procs["router"].log_path, errors="replace") as f:
            m = HTTP_RE.search(f.read())
        if m:
            return c, c.router, m.group(1), tmp
        time.sleep(0.1)
    c.stop()
    sys.exit(f"the router printed no HTTP address (logs in {tmp})")


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
            cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, load average "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", help="start a cluster from these binaries (else use --router/--http)")
    ap.add_argument("--model", default=TINY_MODEL,
                    help="the worker's model with --bin-dir (default: the tiny test model, whose "
                         "short steps leave the router's share of the latency visible)")
    ap.add_argument("--router", default=os.environ.get("LAZYATTN_ROUTER", "127.0.0.1:7000"))
    ap.add_argument("--http", default=os.environ.get("LAZYATTN_HTTP", "http://127.0.0.1:8000"))
    ap.add_argument("--n", type=int, default=MIN_N, help=f"measured requests per arm (>= {MIN_N})")
    ap.add_argument("--round-size", type=int, default=50, help="requests per arm in one round")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--smoke", action="store_true",
                    help=f"allow --n below {MIN_N} (to check the script runs; not a measurement)")
    ap.add_argument("--json-out", help="also write the numbers to this file")
    args = ap.parse_args()
    if args.n < 1 or (args.n < MIN_N and not args.smoke):
        ap.error(f"--n {args.n}: at least {MIN_N} requests per arm give a p99 of 10 samples above "
                 f"it (--smoke for a quick check)")
    if args.round_size < 1:
        ap.error("--round-size: at least 1")
    os.chdir(REPO)  # the model path and the harness's files are relative to the repository

    cluster, tmp = None, None
    if args.bin_dir:
        args.bin_dir = os.path.abspath(args.bin_dir)
        cluster, args.router, args.http, tmp = start_cluster(args)
    try:
        pb, pb_grpc = load_stubs()
        channel = grpc.insecure_channel(args.router)
        stub = pb_grpc.InferenceStub(channel)
        client = httpx.Client(timeout=60)
        arms = {
            "grpc": lambda: grpc_once(stub, pb, args.max_tokens),
            "http": lambda: http_once(client, args.http, args.max_tokens),
        }
        texts = {}
        for _ in range(WARMUP):
            for api, once in arms.items():
                texts.setdefault(api, once()[3])
        results = {api: ([], [], []) for api in arms}
        done, rnd = 0, 0
        started = time.monotonic()
        while done < args.n:
            size = min(args.round_size, args.n - done)
            order = ["grpc", "http"] if rnd % 2 == 0 else ["http", "grpc"]
            for api in order:
                ttfts, totals, gaps = results[api]
                for _ in range(size):
                    ttft, total, times, _text = arms[api]()
                    ttfts.append(ttft)
                    totals.append(total)
                    gaps.extend(b - a for a, b in zip(times, times[1:]))
            done += size
            rnd += 1
        elapsed = time.monotonic() - started
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"machine: {machine()}")
    print(f"{args.n} requests per arm in {rnd} alternated rounds of {args.round_size} "
          f"({WARMUP} warm-up each), max_tokens {args.max_tokens}, {elapsed:.0f} s; same text: "
          f"{texts['grpc'] == texts['http']}" + ("; SMOKE RUN, not a measurement" if args.n < MIN_N else ""))
    print(f"{'arm':6} {'TTFT p50':>9} {'TTFT p99':>9} {'total p50':>10} {'total p99':>10} "
          f"{'gap p50':>8} {'gap p99':>8}  (ms)")
    summary = {}
    for api, (ttft, total, gaps) in results.items():
        summary[api] = {"ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
                        "total_p50_ms": pct(total, 50), "total_p99_ms": pct(total, 99),
                        "gap_p50_ms": pct(gaps, 50), "gap_p99_ms": pct(gaps, 99),
                        "total_mean_ms": statistics.mean(total) * 1000.0, "n": len(total)}
        s = summary[api]
        print(f"{api:6} {s['ttft_p50_ms']:9.2f} {s['ttft_p99_ms']:9.2f} {s['total_p50_ms']:10.2f} "
              f"{s['total_p99_ms']:10.2f} {s['gap_p50_ms']:8.3f} {s['gap_p99_ms']:8.3f}")
    g, h = summary["grpc"], summary["http"]
    print(f"HTTP - gRPC: TTFT p50 {h['ttft_p50_ms'] - g['ttft_p50_ms']:+.2f} ms, p99 "
          f"{h['ttft_p99_ms'] - g['ttft_p99_ms']:+.2f} ms; total p50 "
          f"{h['total_p50_ms'] - g['total_p50_ms']:+.2f} ms, p99 "
          f"{h['total_p99_ms'] - g['total_p99_ms']:+.2f} ms; mean total "
          f"{h['total_mean_ms'] - g['total_mean_ms']:+.2f} ms")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": sys.argv, "machine": machine(), "n": args.n,
                       "round_size": args.round_size, "max_tokens": args.max_tokens,
                       "same_text": texts["grpc"] == texts["http"], "arms": summary}, f, indent=2)
    if texts["grpc"] != texts["http"]:
        print("the two APIs answered differently: the comparison is not of the same request",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
