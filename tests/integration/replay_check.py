#!/usr/bin/env python3
"""`lazyattn replay` on the CUDA backend beside the CPU one, on the same requests.

Four RAG requests over three documents (reordered, so lazy mode reuses each document's cache
wherever it sits) go through `lazyattn replay --json` once per backend. Passes when both runs
answer every request, and the CUDA run hits the document cache on exactly the documents the
CPU run hits (the engine's caching is the same code over either runner; the tokens may differ
after a few steps, bf16 against fp32, and are only printed).

  replay_check.py --lazyattn BIN --model GGUF --workdir DIR [--backends cuda,cpu] [--no-chat]
CI runs it as `cpu,cpu` on the tiny test model (the command and the check itself); the GPU
machine runs `cuda,cpu` on SmolLM2 (tests/gpu/device.sh cli).
"""
import argparse
import json
import os
import subprocess
import sys

DOCS = [
    "The Amstel river flows through Amsterdam and gave the city its name.",
    "Amsterdam has more than 1,500 bridges over its canals.",
    "The Rijksmuseum holds Rembrandt's Night Watch.",
]
ORDERS = [(0, 1, 2), (2, 0, 1), (1, 2, 0), (0, 2)]
QUESTION = "Which river gave Amsterdam its name?"


def run(binary, model, requests_path, backend, chat):
    cmd = [binary, "replay", "--model", model, "--requests", requests_path, "--backend",
           backend, "--max-tokens", "16", "--json"] + (["--chat"] if chat else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    per_request = sorted((l for l in lines if "index" in l), key=lambda l: l["index"])
    summary = next((l for l in lines if l.get("summary")), None)
    return proc.returncode, per_request, summary, proc.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lazyattn", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--backends", default="cuda,cpu")
    ap.add_argument("--no-chat", action="store_true", help="models without a chat template")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    path = os.path.join(a.workdir, "requests.jsonl")
    with open(path, "w") as f:
        for order in ORDERS:
            docs = [{"id": f"d{i}", "text": DOCS[i]} for i in order]
            f.write(json.dumps({"documents": docs, "question": QUESTION, "mode": "lazy"}) + "\n")
    backends = a.backends.split(",")
    runs = {}
    ok = True
    for backend in backends:
        rc, per_request, summary, stderr = run(a.lazyattn, a.model, path, backend, not a.no_chat)
        runs[backend] = per_request
        print(f"{backend}: exit {rc}, summary {json.dumps(summary)}")
        for r in per_request:
            print(f"  #{r['index']} {r['status']} docs hit {r['documents_hit']}/{r['documents']}"
                  f" cached {r['cached_tokens']}/{r['prompt_tokens']} ttft {r['ttft_ms']:.1f} ms:"
                  f" {r['text']!r}")
        if rc != 0 or summary is None or summary["failures"] != 0 or len(per_request) != len(ORDERS):
            print(f"{backend}: the replay failed\n{stderr[-2000:]}")
            ok = False
    if ok and len(backends) == 2:
        hits = {b: [r["documents_hit"] for r in runs[b]] for b in backends}
        if hits[backends[0]] != hits[backends[1]]:
            print(f"documents hit differ: {hits}")
            ok = False
        if sum(hits[backends[0]]) == 0:
            print("no request hit the document cache: the check would prove nothing")
            ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
