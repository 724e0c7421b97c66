"""Time llama.cpp (llama-cpp-python) on a GGUF: prefill and decode throughput.

prefill: one llama_decode of a P-token prompt (default 512) from an empty cache -> P / seconds
decode:  G single-token llama_decode calls (default 128) continuing after that prompt,
         greedy (argmax of the logits) -> G / seconds
Repeated R times (default 3); the median of each is reported. A warm-up decode runs first.
Prints a small table on stderr and one JSON line on stdout.
The 1-minute load average before and after is recorded: on a shared machine other
processes make these numbers meaningless (llama.cpp's threads spin-wait on each other).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import refcommon as rc
import llamacpp_run as lr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(rc.DEFAULT_MODEL))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--flash-attn", action="store_true", help="enable llama.cpp flash attention (default off)")
    ap.add_argument("--f32-kv", action="store_true", help="F32 KV cache (default: llama.cpp's default F16)")
    ap.add_argument("--extra-bufts", action="store_true",
                    help="allow llama.cpp CPU extra buffer types (repack/AMX). Off by default: the AMX path "
                         "segfaults on Q4_1 prompt batches on this machine")
    args = ap.parse_args()

    import llama_cpp

    P, G = args.prompt_tokens, args.gen_tokens
    llm = lr.load(args.model, n_ctx=P + G + 16, n_threads=args.threads, n_batch=P,
                  f32_kv=args.f32_kv, extra_bufts=args.extra_bufts, flash_attn=args.flash_attn)
    n_vocab = llm.n_vocab()
    vocab = llm._model.vocab
    # fixed pseudo-random prompt of ordinary tokens (like llama-bench), no control tokens
    rng = np.random.default_rng(0)
    prompt = []
    while len(prompt) < P:
        t = int(rng.integers(0, n_vocab))
        if not llama_cpp.llama_vocab_is_control(vocab, t):
            prompt.append(t)

    load_before = os.getloadavg()[0]
    if load_before > 0.5:
        print(f"warning: load average {load_before:.2f} before the benchmark - other processes compete for the cores",
              file=sys.stderr)

    # warm-up (page in weights, build graphs)
    lr.clear(llm)
    llm.eval(prompt[:32])
    llm.eval([prompt[32]])

    pre, dec = [], []
    for r in range(args.repeats):
        lr.clear(llm)
        t0 = time.perf_counter()
        llm.eval(prompt)
        logits = lr.last_logits(llm)
        t1 = time.perf_counter()
        for _ in range(G):
            tok = int(np.argmax(logits))
            llm.eval([tok])
            logits = lr.last_logits(llm)
        t2 = time.perf_counter()
        pre.append(P / (t1 - t0))
        dec.append(G / (t2 - t1))
        print(f"  run {r + 1}: prefill {pre[-1]:8.1f} tok/s   decode {dec[-1]:7.1f} tok/s", file=sys.stderr)

    res = {
        "bench": "llama.cpp",
        "model": os.path.basename(args.model),
        "model_sha256": rc.sha256_file(args.model),
        "threads": args.threads,
        "prompt_tokens": P,
        "gen_tokens": G,
        "repeats": args.repeats,
        "prefill_tok_s": round(statistics.median(pre), 2),
        "decode_tok_s": round(statistics.median(dec), 2),
        "prefill_tok_s_runs": [round(x, 2) for x in pre],
        "decode_tok_s_runs": [round(x, 2) for x in dec],
        "settings": lr.settings_of(llm),
        "loadavg_1min_before": round(load_before, 2),
        "loadavg_1min_after": round(os.getloadavg()[0], 2),
        "llama_cpp_python": rc.versions().get("llama-cpp-python"),
        "system_info": rc.versions().get("llama_cpp_system_info", "").strip(),
    }
    w = 34
    print(f"{'llama.cpp ' + res['model']:<{w}} threads={args.threads}", file=sys.stderr)
    print(f"{'metric':<{w}}{'median':>12}  runs", file=sys.stderr)
    print(f"{f'prefill {P} tok (tok/s)':<{w}}{res['prefill_tok_s']:>12.1f}  {res['prefill_tok_s_runs']}", file=sys.stderr)
    print(f"{f'decode {G} tok (tok/s)':<{w}}{res['decode_tok_s']:>12.1f}  {res['decode_tok_s_runs']}", file=sys.stderr)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
