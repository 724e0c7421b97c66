#!/usr/bin/env python3
"""Measures where HF transformers' greedy decoding parts from the golden fp32 continuation.

  python3 tests/gpu/hf_greedy_partings.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
      [--golden tests/data/generation_golden.json] [--device cpu|cuda] [--tokens 32]
      [--out FILE.json]

HF transformers loads the same GGUF (it dequantizes Q4_1 itself, through the `gguf` package)
three times: in float32; in float32 with every weight rounded to bf16 and back (the weights our
CUDA backend holds, computed in fp32: what the weight rounding alone does); and in bfloat16
(bf16 weights and activations, as our CUDA backend).
For every golden run it feeds `prompt_ids` as they are (the golden has add_bos=false and its
prompt_ids carry no added BOS) and greedy-decodes --tokens tokens with no EOS stop: plain argmax
over the last position's logits at each step, KV cache on, every token fed back (EOG included),
like the golden's `greedy_ids_no_stop`. The reference is that list: llama.cpp's greedy tokens on
the all-F32 dequantized model, which equal our fp32 CPU backend's token for token.

Per precision and prompt it prints whether the first 16 and all --tokens tokens equal the
reference, and at the first differing step i:
- ref margin: the reference's top1-top2 logit gap at step i (greedy_top2_margins_no_stop[i]),
  i.e. how close to a tie the reference itself was there;
- from this precision's own logits at step i (same prefix as the reference, since it is the
  first parting): the rank of the reference token (1 + the number of tokens with a strictly
  higher logit, so 1 at an exact tie, which is then flagged; np.argmax takes the lowest id) and
  the logit gap between its own pick and the reference token. In bf16 the logits themselves
  are bf16 (8 significant bits), so exact ties occur.
Ends with "HF <dtype> vs reference: first 16 tokens equal in N of R, all T in M of R".
Writes --out JSON (per step: own ids and own top1-top2 margins) when given.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

FIRST = 16


def field(run, key):
    v = run[key]
    return json.loads(v) if isinstance(v, str) else v


@torch.inference_mode()
def greedy(model, prompt_ids, n, device):
    """Greedy ids, their logits rows (fp64 numpy), n steps, no stop."""
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=device)[None]
    out = model(input_ids=ids, use_cache=True)
    past, toks, rows = out.past_key_values, [], []
    for step in range(n):
        row = out.logits[0, -1].float().cpu().numpy().astype(np.float64)
        tok = int(np.argmax(row))
        toks.append(tok)
        rows.append(row)
        if step + 1 == n:
            break
        out = model(input_ids=torch.tensor([[tok]], dtype=torch.long, device=device),
                    past_key_values=past, use_cache=True)
        past = out.past_key_values
    return toks, rows


def load(gguf, dtype, device, round_weights_to_bf16=False):
    kw = {"gguf_file": gguf.name}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=dtype, **kw)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), torch_dtype=dtype, **kw)
    assert next(model.parameters()).dtype == dtype, next(model.parameters()).dtype
    if round_weights_to_bf16:
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(torch.bfloat16).to(dtype))
    return model.to(device).eval()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--golden", default="tests/data/generation_golden.json")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    torch.set_float32_matmul_precision("highest")  # a true fp32 run: no TF32
    t0 = time.time()

    golden = json.loads(Path(a.golden).read_text())
    add_bos = golden.get("add_bos", False)
    if isinstance(add_bos, str):
        add_bos = json.loads(add_bos)
    if add_bos:
        sys.exit("golden add_bos=true: this script feeds prompt_ids as they are; add a BOS first")
    runs = golden["runs"]
    if isinstance(runs, str):
        runs = json.loads(runs)
    gguf = Path(a.model).resolve()
    first = min(FIRST, a.tokens)
    print(f"model {gguf.name}  golden {a.golden} (add_bos={add_bos})  device {a.device}  "
          f"tokens {a.tokens}  torch {torch.__version__}  transformers {transformers.__version__}",
          flush=True)

    report = {"model": gguf.name, "golden": a.golden, "device": a.device, "tokens": a.tokens,
              "torch": torch.__version__, "transformers": transformers.__version__,
              "precisions": {}}
    summaries = []
    for label, dtype, rounded in (("float32", torch.float32, False),
                                  ("float32, bf16-rounded weights", torch.float32, True),
                                  ("bfloat16", torch.bfloat16, False)):
        model = load(gguf, dtype, a.device, round_weights_to_bf16=rounded)
        rows_dtype = model.lm_head.weight.dtype  # the logits come out in this dtype
        print(f"--- HF {label}", flush=True)
        n16 = nall = 0
        results = []
        for r in runs:
            name = f"{r['name']}/{r['mode']}"
            prompt = field(r, "prompt_ids")
            ref = field(r, "greedy_ids_no_stop")[:a.tokens]
            margins = field(r, "greedy_top2_margins_no_stop")
            if len(ref) < a.tokens:
                sys.exit(f"{name}: golden has only {len(ref)} tokens, --tokens {a.tokens}")
            got, rows = greedy(model, prompt, a.tokens, a.device)
            part = next((i for i, (x, y) in enumerate(zip(got, ref)) if x != y), None)
            eq16 = part is None or part >= first
            eqall = part is None
            n16 += eq16
            nall += eqall
            own_margins = [float(np.sort(row)[-1] - np.sort(row)[-2]) for row in rows]
            res = {"prompt": name, "first16_equal": eq16, "all_equal": eqall,
                   "first_parting": part, "ids": got, "ref_ids": ref,
                   "own_top2_margins": own_margins}
            if part is None:
                line = "="
            else:
                row, rt, mine = rows[part], ref[part], got[part]
                rank = int(np.sum(row > row[rt])) + 1
                ties = int(np.sum(row == row[rt])) - 1
                gap = float(row[mine] - row[rt])
                res.update({"ref_margin": float(margins[part]), "ref_token": rt,
                            "own_token": mine, "ref_token_rank": rank, "ref_token_ties": ties,
                            "own_gap": gap, "own_logit_dtype": str(rows_dtype)})
                tie = f" (exact tie with {ties} other, argmax took the lowest id)" if ties else ""
                line = (f"parts at {part}: ref token {rt} (ref margin {margins[part]!r}), own pick "
                        f"{mine}, ref token rank {rank}{tie}, own gap {gap!r}")
            print(f"{name:<24} first {first} equal: {'yes' if eq16 else 'no ':<3}  all "
                  f"{a.tokens} equal: {'yes' if eqall else 'no ':<3}  {line}", flush=True)
            results.append(res)
        s = (f"HF {label} vs reference: first {first} tokens equal in {n16} of {len(runs)}, "
             f"all {a.tokens} in {nall} of {len(runs)}")
        summaries.append(s)
        report["precisions"][label] = {"prompts": results, "first16_equal": n16,
                                       "all_equal": nall, "summary": s}
        del model
    for s in summaries:
        print(s)
    wall = time.time() - t0
    print(f"wall {wall:.1f} s")
    report["wall_s"] = wall
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
