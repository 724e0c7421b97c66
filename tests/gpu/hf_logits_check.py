#!/usr/bin/env python3
"""Checks our engine's last-position logits against HF transformers on a random Llama model.

  python3 tests/gpu/hf_logits_check.py --shape small|llama3-8b|llama3-8b-2l --workdir DIR
      --logits-tool PATH [--device cuda] [--backend cuda] [--seed 0] [--tokens 200]

HF transformers is an independent implementation, so agreement checks our loader, RoPE, GQA,
norms and matmuls end to end. Steps: build a random bf16 model, save it as an HF checkpoint
(DIR/model), run HF in bf16 and fp32 on a random prompt, run
  LOGITS_TOOL --model DIR/model --backend B --tokens 1,2,... --out DIR/ours.f32
(raw little-endian float32 [vocab]) and compare against the fp32 reference. The HF-bf16 vs
HF-fp32 line is the noise floor: both sides hold the same bf16 weights, so any difference is
activation rounding. Writes DIR/hf_logits_check.json; exit 1 on FAIL.
"""
import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 rope_theta=500000.0, max_position_embeddings=131072,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192})
SHAPES = {
    "small": dict(vocab_size=1024, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, rope_theta=10000.0,
                  max_position_embeddings=4096),
    "llama3-8b": LLAMA3_8B,
    # Full layer shapes at a fraction of the cost: catches shape-specific kernel paths quickly.
    "llama3-8b-2l": dict(LLAMA3_8B, num_hidden_layers=2),
    # SmolLM2-135M's architecture: 30 layers, GQA group 3, tied embeddings.
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    rope_theta=100000.0, max_position_embeddings=8192,
                    tie_word_embeddings=True),
}

# Thresholds against the fp32 reference (see module docstring for why bf16 noise is the scale).
MIN_COSINE, MAX_ERR_OVER_STD = 0.999, 0.1


def make_config(shape):
    # Deep copy: LlamaConfig edits the rope_scaling dict it is given in place.
    spec = copy.deepcopy(SHAPES[shape])
    tie = spec.pop("tie_word_embeddings", False)
    return LlamaConfig(**spec, rms_norm_eps=1e-5, tie_word_embeddings=tie,
                       attn_implementation="sdpa")


def build_model(config, device, seed):
    torch.manual_seed(seed)
    # Allocating and initialising in bf16 on the device keeps the 8B model at 16 GB and fast.
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    # HF initialises RMSNorm weights to exactly 1, which would hide a missing or misapplied
    # norm weight; perturb them so the norms are exercised.
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.copy_(1 + 0.1 * torch.randn_like(m.weight, dtype=torch.float32))
    return model.eval()


def save_checkpoint(model, shape, path):
    model.save_pretrained(path)  # safetensors is the default (and only) format in recent HF
    # transformers >= 5 writes RoPE settings only as "rope_parameters"; older readers (ours
    # included) look for rope_theta / rope_scaling, so write those too. Harmless for HF 4.x.
    cfg_path = Path(path) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    spec = SHAPES[shape]
    cfg["rope_theta"] = spec["rope_theta"]
    if "rope_scaling" in spec:
        cfg["rope_scaling"] = spec["rope_scaling"]
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


@torch.inference_mode()
def last_logits(model, ids):
    out = model(input_ids=ids, use_cache=False)
    return out.logits[0, -1].float().cpu().numpy().astype(np.float64)


def compare(ref, got):
    diff = np.abs(ref - got)
    top10_ref, top10_got = np.argsort(-ref)[:10], np.argsort(-got)[:10]
    return {
        "max_abs_err_over_std": float(diff.max() / ref.std()),
        "cosine": float(ref @ got / (np.linalg.norm(ref) * np.linalg.norm(got))),
        "top1_ref": int(top10_ref[0]), "top1_got": int(top10_got[0]),
        "top1_equal": bool(top10_ref[0] == top10_got[0]),
        # How far below the reference max our top-1 sits, in reference std units (0 if equal).
        "top1_gap_over_std": float((ref.max() - ref[top10_got[0]]) / ref.std()),
        "top10_overlap": len(set(top10_ref.tolist()) & set(top10_got.tolist())) / 10,
    }


def fmt(name, m):
    return (f"{name:<22} max_abs_err_over_std={m['max_abs_err_over_std']:.4g} "
            f"cosine={m['cosine']:.6f} top1_equal={m['top1_equal']} "
            f"top10_overlap={m['top10_overlap']:.1f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--logits-tool", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", type=int, default=200)
    a = p.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    # A true fp32 reference: no TF32 in the fp32 matmuls.
    torch.set_float32_matmul_precision("highest")

    config = make_config(a.shape)
    t0 = time.time()
    model = build_model(config, a.device, a.seed)
    save_checkpoint(model, a.shape, work / "model")
    print(f"model {a.shape}: saved {work / 'model'} in {time.time() - t0:.1f}s "
          f"(attn={model.config._attn_implementation})", flush=True)

    prompt = np.random.default_rng(a.seed).integers(0, config.vocab_size, size=a.tokens)
    ids = torch.tensor(prompt, dtype=torch.long, device=a.device)[None]
    hf_bf16 = last_logits(model, ids)
    model.float()  # in place: the 8B model peaks at 16 + 32 GB, well within an H200
    hf_fp32 = last_logits(model, ids)
    # Free the device before our engine loads the same model onto it.
    del model
    if a.device.startswith("cuda"):
        torch.cuda.empty_cache()

    out_path = work / "ours.f32"
    cmd = [a.logits_tool, "--model", str(work / "model"), "--backend", a.backend,
           "--tokens", ",".join(map(str, prompt.tolist())), "--out", str(out_path)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(f"logits tool: exit {proc.returncode} in {time.time() - t0:.1f}s", flush=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        print("FAIL: logits tool failed")
        return 1
    ours = np.fromfile(out_path, dtype="<f4").astype(np.float64)
    if ours.size != config.vocab_size or not np.isfinite(ours).all():
        print(f"FAIL: {out_path} holds {ours.size} values (want {config.vocab_size}), "
              f"finite={bool(np.isfinite(ours).all())}")
        return 1

    floor = compare(hf_fp32, hf_bf16)
    mine = compare(hf_fp32, ours)
    print(fmt("noise hf-bf16 vs fp32", floor))
    print(fmt("ours vs hf-fp32", mine))
    for k in ("max_abs_err_over_std", "cosine", "top1_equal", "top10_overlap"):
        print(f"{k}: ours={mine[k]} hf_bf16={floor[k]}")
    within_2x = mine["max_abs_err_over_std"] <= 2 * floor["max_abs_err_over_std"]
    if within_2x:
        print("ours is within 2x the HF-bf16 noise floor on max_abs_err_over_std")
    if not mine["top1_equal"]:
        print(f"top-1 differs: ref {mine['top1_ref']} vs ours {mine['top1_got']}, "
              f"ours sits {mine['top1_gap_over_std']:.3g} std below the reference max")
    # The fixed thresholds suit shallow models; a deep model's own bf16 noise (HF bf16 vs HF
    # fp32) can exceed them, and then matching that noise within 2x is what bf16 can promise.
    near_floor = within_2x and (1 - mine["cosine"]) <= 2 * (1 - floor["cosine"])
    ok = mine["top1_equal"] and (near_floor or (mine["cosine"] >= MIN_COSINE and
                                                mine["max_abs_err_over_std"] <= MAX_ERR_OVER_STD))
    result = {"shape": a.shape, "backend": a.backend, "device": a.device, "seed": a.seed,
              "tokens": a.tokens, "torch_version": torch.__version__,
              "transformers_version": transformers.__version__,
              "thresholds": {"min_cosine": MIN_COSINE, "max_err_over_std": MAX_ERR_OVER_STD,
                             "top1_equal": True},
              "ours_vs_hf_fp32": mine, "hf_bf16_vs_hf_fp32": floor,
              "ours_within_2x_noise": within_2x, "ref_std": float(hf_fp32.std()),
              "pass": ok}
    (work / "hf_logits_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
