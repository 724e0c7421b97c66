"""Tiny random Llama models (HF safetensors + GGUF) and their llama.cpp golden data.

Writes tests/data/tiny/:
  <model>/hf-f32/     config.json, model.safetensors (F32), tokenizer.json, tokenizer_config.json, generation_config.json
  <model>/hf-bf16/    same, model.safetensors in BF16 (written by hand: header JSON + raw uint16)
  <model>/<model>-{f32,f16,q8_0,q4_0,q4_1}.gguf
  golden.json         llama.cpp logits + greedy continuations for a fixed token sequence

Weights are drawn from a fixed seed and then rounded so that every value is exactly
representable in bf16 AND f16 (round to bf16, flush |w| < 2^-17 to 0). So the F32, BF16
and F16 variants hold identical numbers and share one golden (the F32 GGUF run).
Quantized GGUF variants get their own golden: llama.cpp run on an all-F32 copy made by
dequantizing the quantized file with gguf-py (an fp32 reference for an engine that
dequantizes), plus, for information, llama.cpp run on the quantized file itself.

The models themselves (configs, tokenizer, weights, the HF and GGUF writers; HF -> GGUF after
llama.cpp's convert_hf_to_gguf.py) are tiny_models.py; this script writes them and their golden.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np

import refcommon as rc
import llamacpp_run as lr
from gguf_f32 import dequantize_to_f32
from tiny_models import (BASE_CFG, GGUF_TYPES, MODELS, N_MERGES, SPECIALS, hf_to_gguf_tensors,
                         hf_tokenizer_files, llama3_rope_factors, make_hf_weights, train_bpe,
                         write_gguf, write_hf)

OUT_DIR = rc.DATA_DIR / "tiny"

SEQ_LEN = 40
N_GREEDY = 16
SEQ_SEED = 777


# ----------------------------------------------------------------------------- numpy self-check (not a golden)

def numpy_hf_forward(cfg: dict, wts: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Float64 HF-convention Llama forward (rotate_half RoPE on *unpermuted* HF weights).

    Only a consistency check of the files we write (HF layout vs the permuted GGUF layout,
    llama3 inv_freq as transformers computes it); the goldens are llama.cpp's numbers.
    """
    W = {k: v.astype(np.float64) for k, v in wts.items()}
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nq, nkv, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    T = len(ids)
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type") == "llama3":  # transformers _compute_llama3_parameters
        f, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        wl = 2 * np.pi / inv
        inv_l = np.where(wl > old / lo, inv / f, inv)
        sm = (old / wl - lo) / (hi - lo)
        smoothed = (1 - sm) * inv_l / f + sm * inv_l
        med = ~(wl < old / hi) & ~(wl > old / lo)
        inv = np.where(med, smoothed, inv_l)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)

    def rot_half(x):
        return np.concatenate([-x[..., hd // 2:], x[..., : hd // 2]], axis=-1)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    x = W["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nq, hd).transpose(1, 0, 2)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
        q = q * cos + rot_half(q) * sin
        k = k * cos + rot_half(k) * sin
        k = np.repeat(k, nq // nkv, axis=0)
        v = np.repeat(v, nq // nkv, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(T, nq * hd)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T


# ----------------------------------------------------------------------------- main

def run_llamacpp(path: Path, ids: list[int], n_greedy: int) -> tuple[np.ndarray, list[int]]:
    llm = lr.load(str(path), n_ctx=128, n_threads=2, logits_all=True)
    logits = lr.all_logits(llm, ids)
    greedy, _, _, _ = lr.greedy(llm, ids, n_greedy, stop_at_eog=False)
    del llm
    return logits, greedy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(OUT_DIR))
    args = ap.parse_args()
    out_dir = Path(args.out_dir)

    import llama_cpp

    vocab, merges = train_bpe(N_MERGES)
    tok_files = hf_tokenizer_files(vocab, merges)
    V = len(vocab)
    ids = [int(x) for x in np.random.default_rng(SEQ_SEED).integers(len(SPECIALS), V, SEQ_LEN)]

    golden_models = {}
    settings = None
    tokenizer_cases = None
    for mname, spec in MODELS.items():
        cfg = dict(BASE_CFG, vocab_size=V, **spec["overrides"])
        mdir = out_dir / mname
        if mdir.exists():
            shutil.rmtree(mdir)
        weights = make_hf_weights(cfg, spec["tied"], spec["seed"])
        files = {}
        for dt in spec["hf"]:
            d = mdir / f"hf-{dt}"
            write_hf(d, cfg, spec["tied"], weights, dt, tok_files)
            files[f"hf-{dt}"] = {"path": str(d.relative_to(rc.REPO_ROOT)),
                                 "model_safetensors_sha256": rc.sha256_file(d / "model.safetensors")}
        gt = hf_to_gguf_tensors(cfg, weights)
        for ot in spec["gguf"]:
            p = mdir / f"{mname}-{ot}.gguf"
            write_gguf(p, mname, cfg, gt, ot, vocab, merges)
            files[f"gguf-{ot}"] = {"path": str(p.relative_to(rc.REPO_ROOT)), "sha256": rc.sha256_file(p),
                                   "bytes": p.stat().st_size,
                                   "tensor_types": {"2d_weights": GGUF_TYPES[ot][0], "token_embd": GGUF_TYPES[ot][1],
                                                    "1d": "F32"}}

        # golden: llama.cpp on the F32 GGUF (== values of hf-f32, hf-bf16, gguf-f16)
        f32_path = mdir / f"{mname}-f32.gguf"
        llm = lr.load(str(f32_path), n_ctx=128, n_threads=2, logits_all=True)
        if settings is None:
            settings = lr.settings_of(llm)
        if tokenizer_cases is None:
            tokenizer_cases = []
            for text in ["Hello world", "the end of the story", " 12345 digits", "<|im_start|>user\nhi<|im_end|>\n",
                         "caf\u00e9 \u4e2d\u6587 \U0001F600", "  spaces\tand\nnewlines  ", ""]:
                b = text.encode("utf-8")
                tokenizer_cases.append({"text": text,
                                        "ids_special": llm.tokenize(b, add_bos=False, special=True),
                                        "ids_plain": llm.tokenize(b, add_bos=False, special=False)})
        logits = lr.all_logits(llm, ids)
        greedy, _, margins, _ = lr.greedy(llm, ids, N_GREEDY, stop_at_eog=False)
        del llm

        ref = numpy_hf_forward(cfg, weights, ids)
        selfcheck = float(np.abs(ref - logits).max())
        rc.log(f"{mname}: llama.cpp F32 vs numpy-HF max |dlogit| = {selfcheck:.3g}; greedy {greedy}")
        assert selfcheck < 1e-3, f"{mname}: HF layout and GGUF layout disagree ({selfcheck})"

        # the f16 GGUF must hold exactly the same values (weights were rounded to be f16/bf16-exact)
        variants = {}
        with tempfile.TemporaryDirectory() as td:
            for ot in spec["gguf"]:
                if ot == "f32":
                    continue
                src = mdir / f"{mname}-{ot}.gguf"
                deq = Path(td) / f"{mname}-{ot}.dequant-f32.gguf"
                dequantize_to_f32(src, deq)
                dl, dg = run_llamacpp(deq, ids, N_GREEDY)
                if ot == "f16":
                    assert np.array_equal(dl, logits), "f16 variant should be value-identical to f32"
                    variants[ot] = {"identical_to_f32_golden": True}
                    continue
                nat = lr.load(str(src), n_ctx=128, n_threads=2, logits_all=True)
                nl = lr.all_logits(nat, ids)
                ng, _, _, _ = lr.greedy(nat, ids, N_GREEDY, stop_at_eog=False)
                del nat
                variants[ot] = {
                    "reference": "llama.cpp on an all-F32 copy of this file dequantized with gguf.quants.dequantize",
                    "logits_positions": list(range(SEQ_LEN - 8, SEQ_LEN)),
                    "logits": [rc.f32_list(r) for r in dl[-8:]],
                    "greedy_ids": dg,
                    "max_abs_logit_diff_vs_f32_golden": rc.f32(np.abs(dl - logits).max()),
                    "llama_cpp_native_info": {
                        "note": "llama.cpp run directly on the quantized file (activations quantized to 8 bit in matmuls); information only",
                        "greedy_ids": ng,
                        "last_logits": rc.f32_list(nl[-1]),
                        "max_abs_logit_diff_vs_dequant_ref": rc.f32(np.abs(nl - dl).max()),
                    },
                }
                rc.log(f"{mname}/{ot}: dequant-ref greedy {dg}; native greedy {ng}; "
                       f"max|d| native-vs-ref {np.abs(nl - dl).max():.3g}")

        golden_models[mname] = {
            "config": {k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "num_key_value_heads", "head_dim",
                                           "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size")}
                      | {"rope_scaling": cfg.get("rope_scaling"), "tie_word_embeddings": spec["tied"]},
            "weight_seed": spec["seed"],
            "files": files,
            "rope_freqs": rc.f32_list(llama3_rope_factors(cfg)) if cfg.get("rope_scaling") else None,
            "golden_source": f"llama.cpp on {mname}-f32.gguf; valid for hf-f32, hf-bf16 and gguf-f16 too (identical values)",
            "logits_positions": list(range(SEQ_LEN)),
            "logits": [rc.f32_list(r) for r in logits],
            "greedy_ids": greedy,
            "greedy_top2_margins": [rc.f32(m) for m in margins],
            "selfcheck_numpy_hf_forward_max_abs_diff": rc.f32(selfcheck),
            "quantized_variants": variants,
        }

    out = rc.header(
        None,
        reference=("llama.cpp (llama-cpp-python) on the F32 GGUF of each tiny model; logits via logits_all=True after one "
                   "llama_decode of the whole sequence; greedy = our argmax, one token per decode, no EOS stop"),
        llama_cpp_settings=settings,
        token_ids=ids,
        token_ids_note=f"{SEQ_LEN} ids drawn with numpy default_rng({SEQ_SEED}).integers({len(SPECIALS)}, vocab_size); positions 0..{SEQ_LEN - 1}",
        n_greedy=N_GREEDY,
        greedy_note="greedy_ids continue after token_ids (positions 40..55): argmax of the logits at the last position, fed back one at a time",
        logits_note="logits[p] = llama.cpp logits (all vocab_size entries) after token_ids[0..p]",
        tokenizer={"n_vocab": V, "n_merges": len(merges), "specials": SPECIALS, "pre": "smollm", "model": "gpt2",
                   "note": "toy byte-level BPE trained by gen_tiny_models.py; ids by llama.cpp (vocab of tiny-llama-f32.gguf)",
                   "cases": tokenizer_cases},
        weights_note=("random normal weights (embed/lm_head std 0.05, q/k 0.15, v/o/mlp 0.1, layer norms 1+0.1N, final norm 2(1+0.1N)) rounded to bf16 and "
                      "|w|<2^-17 flushed to 0, so f32 == bf16 == f16 exactly"),
        models=golden_models,
    )
    rc.write_json(out_dir / "golden.json", out)
    rc.log(f"wrote {out_dir / 'golden.json'}")


if __name__ == "__main__":
    main()
