#!/usr/bin/env python3
"""Router overhead of the HTTP API against the gRPC API for the same request, from one Python
client: the same greedy streamed chat request (a system message, two documents, a question) sent
alternately through gRPC `Inference.Generate` (grpcio) and HTTP `POST /v1/chat/completions` with
`stream: true` (httpx, one keep-alive connection, SSE parsed by hand), N times each. Prints, per
API, p50/p99 of the time to the first token and of the whole request, and of the gaps between
consecutive tokens as the client receives them (SSE token delivery), and the differences HTTP -
gRPC at p50 and p99 (the HTTP path's added latency: the worker's work is the same).

  tools/cluster --insecure -- build/test-venv/bin/python tools/bench/http_overhead.py [--n 200]

Needs grpcio, grpcio-tools and httpx in that environment (build/test-venv/bin/python -m pip
install grpcio grpcio-tools). Reads LAZYATTN_ROUTER and LAZYATTN_HTTP as tools/cluster sets them;
with --insecure the cluster is plaintext, so TLS costs are not part of the comparison.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import grpc
import httpx
from grpc_tools import protoc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEM = "Answer in one sentence using the documents."
DOCS = ["The Seine flows through Paris and reaches the English Channel at Le Havre.",
        "The Loire is the longest river in France; its valley is known for its castles."]
QUESTION = "Which river flows through Paris?"


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
    return first - start, time.perf_counter() - start, times, text


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
    return first - start, time.perf_counter() - start, times, text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--router", default=os.environ.get("LAZYATTN_ROUTER", "127.0.0.1:7000"))
    ap.add_argument("--http", default=os.environ.get("LAZYATTN_HTTP", "http://127.0.0.1:8000"))
    ap.add_argument("--n", type=int, default=200, help="requests per API")
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    pb, pb_grpc = load_stubs()
    channel = grpc.insecure_channel(args.router)
    stub = pb_grpc.InferenceStub(channel)
    client = httpx.Client(timeout=60)
    results = {"grpc": ([], [], []), "http": ([], [], [])}
    texts = {}
    for i in range(args.n + 5):  # 5 warm-up rounds (documents cached, connections open)
        for api in ("grpc", "http"):
            ttft, total, times, text = (grpc_once(stub, pb, args.max_tokens) if api == "grpc"
                                        else http_once(client, args.http, args.max_tokens))
            texts.setdefault(api, text)
            if i < 5:
                continue
            results[api][0].append(ttft)
            results[api][1].append(total)
            results[api][2].extend(b - a for a, b in zip(times, times[1:]))
    print(f"{args.n} requests per API, max_tokens {args.max_tokens}, same text: "
          f"{texts['grpc'] == texts['http']}")
    print(f"{'api':6} {'TTFT p50':>9} {'TTFT p99':>9} {'total p50':>10} {'total p99':>10} "
          f"{'gap p50':>8} {'gap p99':>8}  (ms)")
    for api, (ttft, total, gaps) in results.items():
        print(f"{api:6} {pct(ttft, 50):9.2f} {pct(ttft, 99):9.2f} {pct(total, 50):10.2f} "
              f"{pct(total, 99):10.2f} {pct(gaps, 50):8.3f} {pct(gaps, 99):8.3f}")
    g, h = results["grpc"], results["http"]
    print(f"HTTP - gRPC: TTFT p50 {pct(h[0], 50) - pct(g[0], 50):+.2f} ms, p99 "
          f"{pct(h[0], 99) - pct(g[0], 99):+.2f} ms; total p50 {pct(h[1], 50) - pct(g[1], 50):+.2f} ms, "
          f"p99 {pct(h[1], 99) - pct(g[1], 99):+.2f} ms; mean total "
          f"{(statistics.mean(h[1]) - statistics.mean(g[1])) * 1000:+.2f} ms")


if __name__ == "__main__":
    main()
