#!/usr/bin/env python3
"""HF transformers baseline for the CUDA backend's RAG benchmark, run in the same device call.

  python3 tools/bench/hf_rag_baseline.py [--shape llama3-8b|small] [--device cuda]
      [--out FILE.json] [--repeats 3]

Random bf16 Llama weights (the timings do not depend on the values), SDPA attention, eager
PyTorch with HF's DynamicCache: what a user gets from plain `transformers` without a serving
engine. Measures, as median of --repeats after one warm-up, with device-synchronized wall time:
  prefill    one forward over the whole RAG request (5 documents x 4,096 + 64-token question =
             20,544 tokens), batch 1 -- HF's time to first token
  decode     one 1-token step with the cache holding that prefill (median of --decode-steps)
  batch      batch 32 x 2,048-token prompts prefilled, then 32 greedy decode steps timed
--shape small uses small sizes so it finishes on a CPU in seconds; the JSON records the sizes.
"""
import argparse
import datetime
import inspect
import json
import platform
import statistics
import time

import torch
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

SHAPES = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      rope_theta=500000.0, max_position_embeddings=131072,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}),
    "small": dict(vocab_size=1024, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, rope_theta=10000.0,
                  max_position_embeddings=4096),
}
# prefill tokens (docs x doc_len + question), batch, batch prompt length, batch decode steps
SIZES = {"llama3-8b": dict(prefill=5 * 4096 + 64, batch=32, batch_context=2048, batch_steps=32),
         "small": dict(prefill=4 * 48 + 64, batch=4, batch_context=64, batch_steps=8)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-steps", type=int, default=20)
    a = p.parse_args()
    dev, sz = a.device, SIZES[a.shape]
    cuda = dev.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(fn):
        sync()
        t0 = time.perf_counter()
        r = fn()
        sync()
        return (time.perf_counter() - t0) * 1e3, r

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[a.shape], rms_norm_eps=1e-5, tie_word_embeddings=False,
                         attn_implementation="sdpa")
    # Allocate and initialise directly in bf16 on the device (8B: 16 GB, seconds).
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = LlamaForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)
    # Only the last position's logits are needed; computing all of them would add a
    # [tokens x 128k] projection (and tens of GB for the batch prefill) that no server does.
    params = inspect.signature(model.forward).parameters
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    # Newer transformers renamed past_key_values to cache; use whichever this version takes.
    cache_arg = "cache" if "cache" in params else "past_key_values"

    def forward(ids, cache):
        return model(input_ids=ids, use_cache=True, **{cache_arg: cache}, **keep)

    def truncate(cache, n):
        # A negative crop removes tokens from the end in every transformers version that has
        # crop (a positive one means "keep n" in 4.x but is rejected by newer releases).
        if cache.get_seq_length() > n:
            cache.crop(n - cache.get_seq_length())

    def prefill(ids):
        cache = DynamicCache()
        return cache, forward(ids, cache)

    def median_of(fn):
        fn()  # warm-up: kernel selection, allocator growth
        return statistics.median(fn() for _ in range(a.repeats))

    with torch.inference_mode():
        # a. prefill of the whole RAG request, batch 1
        ids = torch.randint(0, config.vocab_size, (1, sz["prefill"]), device=dev)
        state = {}

        def run_prefill():
            ms, (state["cache"], _) = timed(lambda: prefill(ids))
            return ms
        prefill_ms = median_of(run_prefill)

        # b. one decode step over that cache; cropping back keeps the context fixed at `prefill`
        cache, tok = state["cache"], ids[:, -1:]

        def run_step():
            ms, _ = timed(lambda: forward(tok, cache))
            truncate(cache, sz["prefill"])
            return ms
        run_step()
        decode_step_ms = statistics.median(run_step() for _ in range(a.decode_steps))
        del state, cache
        if cuda:
            torch.cuda.empty_cache()

        # c. batch decode: prefill once, then time greedy steps, cropping back between repeats
        bids = torch.randint(0, config.vocab_size, (sz["batch"], sz["batch_context"]), device=dev)
        bcache, out = prefill(bids)
        first = out.logits[:, -1:].argmax(-1)

        def run_batch():
            def steps():
                t = first
                for _ in range(sz["batch_steps"]):
                    t = forward(t, bcache).logits[:, -1:].argmax(-1)
            ms, _ = timed(steps)
            truncate(bcache, sz["batch_context"])
            return ms
        batch_ms = median_of(run_batch)
        batch_tok_s = sz["batch"] * sz["batch_steps"] / (batch_ms / 1e3)

    result = {
        "shape": a.shape,
        "device_name": torch.cuda.get_device_name(dev) if cuda else platform.processor() or "cpu",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "attn_implementation": model.config._attn_implementation,
        "prefill_tokens": sz["prefill"], "prefill_ms": prefill_ms,
        "decode_context": sz["prefill"], "decode_step_ms": decode_step_ms,
        "batch": sz["batch"], "batch_context": sz["batch_context"],
        "batch_decode_steps": sz["batch_steps"], "batch_decode_tok_s": batch_tok_s,
        "repeats": a.repeats,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    print(f"HF transformers {transformers.__version__} baseline, {a.shape} bf16, "
          f"{result['device_name']}\n")
    print("| measurement | size | value |\n|---|---|---|")
    print(f"| prefill (TTFT) | {sz['prefill']} tokens | {prefill_ms:.1f} ms |")
    print(f"| decode step | {sz['prefill']}-token context | {decode_step_ms:.2f} ms |")
    print(f"| batch decode | {sz['batch']} x {sz['batch_context']} context, "
          f"{sz['batch_steps']} steps | {batch_tok_s:.1f} tok/s |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
