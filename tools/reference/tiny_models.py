"""The tiny random Llama models themselves, without llama.cpp: what they are and how their files
are written. gen_tiny_models.py writes them under tests/data/tiny/ and runs llama.cpp for their
golden data; this module holds the part that is fully determined by the code and its seeds:

  - the models' configs and their tokenizer, a toy byte-level BPE trained here on a fixed text;
  - seeded weights, rounded to be exact in bf16 and f16 (so F32, BF16 and F16 files agree);
  - the writers of the HF form (config, safetensors, tokenizer files; BF16 safetensors by hand)
    and of the GGUF form, following llama.cpp's convert_hf_to_gguf.py (conversion/llama.py,
    LlamaModel): tensor names, Q/K `permute`, rope_freqs for llama3 rope scaling, metadata keys.
"""
from __future__ import annotations

import json
import math
import re
import struct
from collections import Counter
from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
N_MERGES = 61  # vocab = 3 specials + 256 bytes + 61 merges = 320
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

BASE_CFG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=4096,
)

MODELS = {
    # name: (config overrides, tie_word_embeddings, weight seed, variants)
    "tiny-llama": dict(overrides={}, tied=True, seed=1234,
                       hf=["f32", "bf16"], gguf=["f32", "f16", "q8_0", "q4_0", "q4_1"]),
    "tiny-llama3-rope": dict(overrides=dict(rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}), tied=True, seed=2345,
                             hf=["f32", "bf16"], gguf=["f32", "f16"]),
    "tiny-llama-untied": dict(overrides={}, tied=False, seed=3456,
                              hf=["f32", "bf16"], gguf=["f32", "f16", "q8_0"]),
}

# gguf outtype -> (2D weight type, token_embd type, general.file_type)
GGUF_TYPES = {
    "f32": ("F32", "F32", 0),
    "f16": ("F16", "F16", 1),
    "q8_0": ("Q8_0", "Q8_0", 7),
    "q4_0": ("Q4_0", "Q4_0", 2),
    "q4_1": ("Q4_1", "Q8_0", 3),  # like SmolLM2-135M-Instruct.Q4_1.gguf: Q4_1 weights, Q8_0 token_embd
}


# ----------------------------------------------------------------------------- tokenizer

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode char map (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_TRAIN_PRETOK = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")

TRAIN_TEXT = """
The quick brown fox jumps over the lazy dog. Once upon a time there was a little model that
wanted to learn how to talk. It read the text again and again, and it learned that the words
"the", "and", "to" and "of" are everywhere. def main(): return 0  # the end of the story
Hello world! Hello there, the world is the world. int main() { return 0; } for i in range(10): print(i)
"""


def train_bpe(n_merges: int) -> tuple[list[str], list[str]]:
    """Deterministic toy byte-level BPE training: returns (vocab tokens, merges 'a b')."""
    b2u = bytes_to_unicode()
    words = Counter()
    for m in _TRAIN_PRETOK.findall(TRAIN_TEXT):
        words[tuple(b2u[b] for b in m.encode("utf-8"))] += 1
    vocab = list(SPECIALS) + [b2u[b] for b in range(256)]
    known = set(vocab)
    merges: list[str] = []
    while len(merges) < n_merges:
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                if a + b not in known:
                    pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append(f"{a} {b}")
        vocab.append(a + b)
        known.add(a + b)
        new_words = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] += c
        words = new_words
    assert len(merges) == n_merges, len(merges)
    return vocab, merges


def hf_tokenizer_files(vocab: list[str], merges: list[str]) -> dict[str, dict]:
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIALS)]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(vocab)}, "merges": merges},
    }
    cfg = {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": BASE_CFG["max_position_embeddings"],
        "tokenizer_class": "GPT2Tokenizer",
        "vocab_size": len(vocab),
    }
    return {"tokenizer.json": tok, "tokenizer_config.json": cfg}


# ----------------------------------------------------------------------------- weights

def round_exact_bf16_f16(x: np.ndarray) -> np.ndarray:
    """Round float32 -> nearest-even bf16, flush |x| < 2^-17 to 0: exact in f32, bf16 and f16."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    y = u.astype(np.uint32).view(np.float32).copy()
    y[np.abs(y) < 2.0 ** -17] = 0.0
    assert np.array_equal(y.astype(np.float16).astype(np.float32), y)
    return y


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    assert np.all((u & 0xFFFF) == 0), "value not exactly representable in bf16"
    return (u >> 16).astype(np.uint16)


def make_hf_weights(cfg: dict, tied: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    H, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nq, nkv, hd, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"]

    def w(shape, std):
        return round_exact_bf16_f16(rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    def norm(n, scale=1.0):
        return round_exact_bf16_f16(scale * (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)))

    # Scales chosen so greedy continuations are not degenerate (a tied model with a large
    # embedding mostly predicts its input token) and logits are not flat.
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": w((V, H), 0.05)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "self_attn.q_proj.weight"] = w((nq * hd, H), 0.15)
        t[p + "self_attn.k_proj.weight"] = w((nkv * hd, H), 0.15)
        t[p + "self_attn.v_proj.weight"] = w((nkv * hd, H), 0.1)
        t[p + "self_attn.o_proj.weight"] = w((H, nq * hd), 0.1)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        t[p + "mlp.gate_proj.weight"] = w((I, H), 0.1)
        t[p + "mlp.up_proj.weight"] = w((I, H), 0.1)
        t[p + "mlp.down_proj.weight"] = w((H, I), 0.1)
    t["model.norm.weight"] = norm(H, 2.0)
    if not tied:
        t["lm_head.weight"] = w((V, H), 0.05)
    return t


def hf_config(cfg: dict, tied: bool, dtype: str) -> dict:
    c = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "head_dim": cfg["head_dim"],
        "hidden_act": "silu",
        "hidden_size": cfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "mlp_bias": False,
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "pretraining_tp": 1,
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_scaling": cfg.get("rope_scaling"),
        "rope_theta": cfg["rope_theta"],
        "tie_word_embeddings": tied,
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[dtype],
        "use_cache": True,
        "vocab_size": cfg["vocab_size"],
    }
    return c


def write_safetensors_manual(path: Path, tensors: dict[str, tuple[str, tuple, bytes]], metadata: dict) -> None:
    """safetensors format by hand: u64 LE header length, JSON header, raw little-endian data."""
    header: dict = {"__metadata__": metadata}
    off = 0
    blobs = []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def write_hf(dirpath: Path, cfg: dict, tied: bool, weights: dict[str, np.ndarray], dtype: str,
             tok_files: dict[str, dict]) -> None:
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / "config.json").write_text(json.dumps(hf_config(cfg, tied, dtype), indent=2) + "\n")
    (dirpath / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "do_sample": False}, indent=2) + "\n")
    for fn, obj in tok_files.items():
        (dirpath / fn).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    meta = {"format": "pt"}
    st = dirpath / "model.safetensors"
    if dtype == "f32":
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}, str(st), metadata=meta)
    else:
        write_safetensors_manual(st, {k: ("BF16", v.shape, to_bf16_bits(v).astype("<u2").tobytes())
                                      for k, v in weights.items()}, meta)
    # read back with the safetensors library (framework-agnostic deserialize handles BF16)
    import safetensors

    back = {name: d for name, d in safetensors.deserialize(st.read_bytes())}
    assert set(back) == set(weights)
    for name, d in back.items():
        if dtype == "f32":
            arr = np.frombuffer(bytes(d["data"]), dtype="<f4").reshape(d["shape"])
        else:
            assert d["dtype"].upper() in ("BF16", "BFLOAT16"), d["dtype"]
            arr = (np.frombuffer(bytes(d["data"]), dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(d["shape"])
        assert np.array_equal(arr, weights[name]), name


# ----------------------------------------------------------------------------- HF -> GGUF (convert_hf_to_gguf.py, LlamaModel)

def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    # verbatim from llama.cpp conversion/llama.py LlamaModel.permute (numpy instead of torch)
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    # verbatim formula from llama.cpp conversion/llama.py LlamaModel.generate_extra_tensors
    rope_params = dict(cfg["rope_scaling"], rope_theta=cfg["rope_theta"])
    base = rope_params.get("rope_theta", 10000.0)
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))

    factor = rope_params.get("factor", 8.0)
    low_freq_factor = rope_params.get("low_freq_factor", 1.0)
    high_freq_factor = rope_params.get("high_freq_factor", 4.0)
    old_context_len = rope_params.get("original_max_position_embeddings", 8192)

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(rope_factors, dtype=np.float32)


def hf_to_gguf_tensors(cfg: dict, weights: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out: list[tuple[str, np.ndarray]] = []
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", "").lower() == "llama3":
        out.append(("rope_freqs.weight", llama3_rope_factors(cfg)))  # extra tensors come first
    m = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }
    for name, data in weights.items():
        if name.endswith("q_proj.weight"):
            data = permute(data, n_head, n_head)
        if name.endswith("k_proj.weight"):
            data = permute(data, n_head, n_kv)
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            mm = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
            g = f"blk.{mm.group(1)}.{m[mm.group(2)]}.weight"
        out.append((g, np.ascontiguousarray(data)))
    return out


def write_gguf(path: Path, name: str, cfg: dict, tensors: list[tuple[str, np.ndarray]], outtype: str,
               vocab: list[str], merges: list[str]) -> None:
    import gguf

    wtype, etype, ftype = GGUF_TYPES[outtype]
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_file_type(ftype)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["head_dim"])
    # tokenizer (as convert_hf_to_gguf.py _set_vocab_gpt2 + SpecialVocab would write it)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab)
    w.add_token_types([int(gguf.TokenType.CONTROL) if t in SPECIALS else int(gguf.TokenType.NORMAL) for t in vocab])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHAT_TEMPLATE)
    if outtype not in ("f32", "f16"):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    for tname, data in tensors:
        data = np.asarray(data, dtype=np.float32)
        if data.ndim == 1 or tname == "rope_freqs.weight":
            qt = "F32"  # 1D tensors (norms, rope_freqs) stay F32, as in the converter / llama-quantize
        elif tname == "token_embd.weight":
            qt = etype
        else:
            qt = wtype
        qtype = gguf.GGMLQuantizationType[qt]
        if qt == "F32":
            w.add_tensor(tname, data)
        elif qt == "F16":
            w.add_tensor(tname, data.astype(np.float16))
        else:
            w.add_tensor(tname, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
