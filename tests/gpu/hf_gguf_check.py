#!/usr/bin/env python3
"""Checks our first-step logits on the real SmolLM2 GGUF against HF transformers.

  python3 tests/gpu/hf_gguf_check.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf
      --logits-tool PATH [--golden tests/data/generation_golden.json] [--device cuda]

HF transformers loads the same GGUF (it dequantizes Q4_1 itself, through the `gguf` package)
and runs every golden prompt's token ids in fp32 (the reference) and in bf16 (its own noise
floor: bf16 weights and activations, as our CUDA backend). Our logits come from
  LOGITS_TOOL --model GGUF --backend cpu|cuda --tokens 1,2,... --out FILE
A prompt passes when
- our CPU backend (fp32) is within 0.01 std of HF fp32 at every logit (two fp32 implementations);
- our CUDA backend's max |error| / std is at most twice HF bf16's on the same prompt, or under
  0.15 (the bound tests/gpu/hf_logits_check.py uses for deep models);
- its top-1 token is HF fp32's, or, at a near-tie, among HF fp32's top 5 and behind its top-1
  by less than our max |error| (vLLM's rule for comparing two precisions, check_logprobs_close).
Prints one line per prompt and PASS/FAIL; writes --out JSON.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_logits_check import compare  # noqa: E402

CPU_MAX_ERR_OVER_STD = 0.01
CUDA_MAX_ERR_OVER_STD = 0.15


@torch.inference_mode()
def last_logits(model, ids, device):
    out = model(input_ids=torch.tensor(ids, dtype=torch.long, device=device)[None], use_cache=False)
    return out.logits[0, -1].float().cpu().numpy().astype(np.float64)


def ours(tool, model, backend, ids, workdir):
    out = Path(workdir) / f"ours-{backend}.f32"
    cmd = [tool, "--model", model, "--backend", backend, "--tokens", ",".join(map(str, ids)),
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise RuntimeError(f"{tool} --backend {backend} failed ({proc.returncode})")
    return np.fromfile(out, dtype="<f4").astype(np.float64)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--logits-tool", required=True)
    p.add_argument("--golden", default="tests/data/generation_golden.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="hf_gguf_check.json")
    a = p.parse_args()
    torch.set_float32_matmul_precision("highest")  # a true fp32 reference: no TF32
    runs = json.loads(Path(a.golden).read_text())["runs"]
    gguf = Path(a.model).resolve()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 torch_dtype=torch.float32)
    model = model.to(a.device).eval()
    fp32 = [last_logits(model, r["prompt_ids"], a.device) for r in runs]
    model.to(torch.bfloat16)
    bf16 = [last_logits(model, r["prompt_ids"], a.device) for r in runs]
    del model

    results, ok_all = [], True
    with tempfile.TemporaryDirectory() as work:
        for r, ref, hb in zip(runs, fp32, bf16):
            name = f"{r['name']}/{r['mode']}"
            cpu = compare(ref, ours(a.logits_tool, str(gguf), "cpu", r["prompt_ids"], work))
            got = ours(a.logits_tool, str(gguf), "cuda", r["prompt_ids"], work)
            cuda, floor = compare(ref, got), compare(ref, hb)
            max_abs = float(np.abs(ref - got).max())
            top5 = np.argsort(-ref)[:5].tolist()
            gap = float(ref.max() - ref[cuda["top1_got"]])
            top1_ok = cuda["top1_equal"] or (cuda["top1_got"] in top5 and gap < max_abs)
            err_ok = (cuda["max_abs_err_over_std"] <= CUDA_MAX_ERR_OVER_STD or
                      cuda["max_abs_err_over_std"] <= 2 * floor["max_abs_err_over_std"])
            cpu_ok = cpu["max_abs_err_over_std"] <= CPU_MAX_ERR_OVER_STD and cpu["top1_equal"]
            ok = cpu_ok and err_ok and top1_ok
            ok_all &= ok
            print(f"{name:<24} cpu {cpu['max_abs_err_over_std']:.4f}  cuda "
                  f"{cuda['max_abs_err_over_std']:.4f} (cos {cuda['cosine']:.5f})  hf-bf16 "
                  f"{floor['max_abs_err_over_std']:.4f} (cos {floor['cosine']:.5f})  top1 "
                  f"{'=' if cuda['top1_equal'] else f'differs by {gap:.3g}'}"
                  f"{'' if floor['top1_equal'] else ' (hf-bf16 differs too)'}  "
                  f"{'ok' if ok else 'FAIL'}", flush=True)
            results.append({"prompt": name, "cpu_vs_hf_fp32": cpu, "cuda_vs_hf_fp32": cuda,
                            "hf_bf16_vs_hf_fp32": floor, "cuda_top1_gap": gap, "pass": ok})
    Path(a.out).write_text(json.dumps({"model": gguf.name, "prompts": results,
                                       "torch": torch.__version__, "pass": ok_all}, indent=2))
    print("PASS" if ok_all else "FAIL")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
