#!/usr/bin/env python3
"""PyTorch SDPA baselines for the paged prefill benchmark (lazyattn-bench-prefill).

Same shapes, same device, contiguous KV: GQA 32/8, head_dim 128, bf16.
  q64 / q512 / q4096  that many queries over 20,480 cached keys plus their own keys
  encode4096          4,096 tokens, causal (square)
Backends: cuDNN (wgmma/TMA class) and FLASH (FlashAttention-2, mma.sync class).

What SDPA computes for the q* shapes: our kernel's queries see all cached keys and their own keys
causally (a lower-right causal mask over 20,480 + q keys). SDPA's is_causal is top-left aligned,
so the q* rows run NON-causal over all 20,480 + q keys and count all q * (20,480 + q) pairs; the
rate (TFLOP/s) is the comparable number, not the time. encode4096 is causal in both, counting
visible pairs only (4 * d * heads * q(q+1)/2).
Timing: CUDA events around each call, warm-up first, median of --reps. One JSON object per line.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, DIM, CACHED = 32, 8, 128, 20480
SHAPES = [("q64", 64, False), ("q512", 512, False), ("q4096", 4096, False),
          ("encode4096", 4096, True)]
BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]


def time_ms(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default="", help="comma list of shapes (default: all)")
    ap.add_argument("--backends", default="", help="comma list of cudnn, flash (default: both)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    backends = set(filter(None, args.backends.split(",")))
    for name_set, known, what in ((only, [x[0] for x in SHAPES], "shape"),
                                  (backends, [x[0] for x in BACKENDS], "backend")):
        if name_set - set(known):
            ap.error(f"unknown {what}: {', '.join(sorted(name_set - set(known)))}")
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    print(f"device: {name}, torch {torch.__version__}, cudnn {torch.backends.cudnn.version()}")
    print("\n| shape | backend | queries | keys | counted pairs | ms (run 1 / run 2) | TFLOP/s | note |")
    print("|---|---|---|---|---|---|---|---|")
    lines = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for shape, nq, causal in SHAPES:
        if only and shape not in only:
            continue
        nk = nq if causal else CACHED + nq
        q = torch.rand(1, HEADS, nq, DIM, device=dev, generator=gen, dtype=torch.float32)
        k = torch.rand(1, KV_HEADS, nk, DIM, device=dev, generator=gen, dtype=torch.float32)
        v = torch.rand(1, KV_HEADS, nk, DIM, device=dev, generator=gen, dtype=torch.float32)
        q, k, v = [(x * 4 - 2).to(torch.bfloat16) for x in (q, k, v)]
        pairs = nq * (nq + 1) / 2 if causal else nq * nk
        flops = 4.0 * DIM * HEADS * pairs
        for backend_name, backend in BACKENDS:
            if backends and backend_name not in backends:
                continue
            note = "enable_gqa"
            kk, vv = k, v

            def call():
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal,
                                                      enable_gqa=(kk.shape[1] != HEADS))
            try:
                with sdpa_kernel([backend]):
                    call()
                    torch.cuda.synchronize()
            except Exception:  # backend refuses GQA: expand K/V to all heads
                kk = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
                vv = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
                note = "K/V expanded to 32 heads"
                try:
                    with sdpa_kernel([backend]):
                        call()
                        torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    print(f"| {shape} | {backend_name} | {nq} | {nk} | - | - | - | "
                          f"unavailable: {type(e).__name__} |")
                    continue
            with sdpa_kernel([backend]):
                ms = [time_ms(call, args.reps, args.warmup) for _ in range(2)]
            best = min(ms)
            tflops = flops / (best * 1e-3) / 1e12
            mode = "causal" if causal else "non-causal"
            print(f"| {shape} | {backend_name} | {nq} | {nk} | {pairs:.4g} | "
                  f"{ms[0]:.4f} / {ms[1]:.4f} | {tflops:.1f} | {mode}, {note} |")
            lines.append(json.dumps({
                "bench": "sdpa_prefill_baseline", "shape": shape, "backend": backend_name,
                "queries": nq, "keys": nk, "causal": causal, "heads": HEADS,
                "kv_heads": KV_HEADS, "head_dim": DIM, "counted_pairs": pairs, "ms": ms[0],
                "ms_run2": ms[1], "tflops": round(tflops, 2), "note": note, "device": name,
                "torch": torch.__version__}))
    print()
    for line in lines:
        print("JSON " + line)


if __name__ == "__main__":
    main()
