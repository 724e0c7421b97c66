#!/usr/bin/env python3
"""Writes the seed corpora of the model fuzz targets (gguf, safetensors, tokenizer_json) from the
tiny models in tests/data/tiny, each seed under 64 KiB and most under the 4 KiB that run.sh's
-max_len keeps: a complete miniature llama (1 layer, hidden 8) in GGUF F32/F16 and in safetensors
F32/BF16, the tiny models' own headers with their tensor data cut off, and their tokenizer.json.

  tests/fuzz/make_model_seeds.py    (from the repository root; rewrites the three corpus folders)
"""
import json
import os
import struct

TINY = "tests/data/tiny/tiny-llama"
OUT = "tests/fuzz/corpus"

# The miniature model: every shape the loaders check, as small as the bounds allow.
H, I, L, HEADS, KV, HD, VOCAB, CTX = 8, 16, 1, 2, 1, 4, 8, 64


def shapes(gguf):
    """(name, row-major shape) of every tensor, in the file format's names."""
    out = [("token_embd.weight" if gguf else "model.embed_tokens.weight", [VOCAB, H]),
           ("output_norm.weight" if gguf else "model.norm.weight", [H])]
    parts = [("attn_norm", "input_layernorm", [H]), ("attn_q", "self_attn.q_proj", [HEADS * HD, H]),
             ("attn_k", "self_attn.k_proj", [KV * HD, H]), ("attn_v", "self_attn.v_proj", [KV * HD, H]),
             ("attn_output", "self_attn.o_proj", [H, HEADS * HD]),
             ("ffn_norm", "post_attention_layernorm", [H]), ("ffn_gate", "mlp.gate_proj", [I, H]),
             ("ffn_up", "mlp.up_proj", [I, H]), ("ffn_down", "mlp.down_proj", [H, I])]
    for layer in range(L):
        for g, hf, shape in parts:
            out.append((f"blk.{layer}.{g}.weight" if gguf else f"model.layers.{layer}.{hf}.weight",
                        shape))
    return out


def values(n, seed):
    return [((i * 7919 + seed * 104729) % 200 - 100) / 400.0 for i in range(n)]


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, kind, value):
    out = gguf_string(key)
    if kind == "u32":
        return out + struct.pack("<II", 4, value)
    if kind == "f32":
        return out + struct.pack("<If", 6, value)
    if kind == "str":
        return out + struct.pack("<I", 8) + gguf_string(value)
    if kind == "strs":
        return out + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(gguf_string(v) for v in value)
    if kind == "i32s":
        return out + struct.pack("<IIQ", 9, 5, len(value)) + b"".join(struct.pack("<i", v) for v in value)
    raise ValueError(kind)


def mini_gguf(f16, tokenizer):
    kvs = [("general.architecture", "str", "llama"), ("llama.block_count", "u32", L),
           ("llama.context_length", "u32", CTX), ("llama.embedding_length", "u32", H),
           ("llama.feed_forward_length", "u32", I), ("llama.attention.head_count", "u32", HEADS),
           ("llama.attention.head_count_kv", "u32", KV),
           ("llama.attention.layer_norm_rms_epsilon", "f32", 1e-5),
           ("llama.rope.freq_base", "f32", 10000.0), ("llama.vocab_size", "u32", VOCAB)]
    if tokenizer:
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "H", "e", "l", "o", "Ġ"]
        kvs += [("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", "smollm"),
                ("tokenizer.ggml.tokens", "strs", tokens),
                ("tokenizer.ggml.token_type", "i32s", [3, 3, 3, 1, 1, 1, 1, 1]),
                ("tokenizer.ggml.merges", "strs", ["l l", "H e"]),
                ("tokenizer.ggml.bos_token_id", "u32", 1), ("tokenizer.ggml.eos_token_id", "u32", 2)]
    tensors = shapes(gguf=True)
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    header += b"".join(gguf_kv(*kv) for kv in kvs)
    data = b""
    directory = b""
    for k, (name, shape) in enumerate(tensors):
        n = 1
        for d in shape:
            n *= d
        f16_here = f16 and len(shape) == 2
        blob = (struct.pack(f"<{n}e", *values(n, k)) if f16_here
                else struct.pack(f"<{n}f", *([1.0] * n if len(shape) == 1 else values(n, k))))
        directory += gguf_string(name) + struct.pack("<I", len(shape))
        directory += b"".join(struct.pack("<Q", d) for d in reversed(shape))
        directory += struct.pack("<IQ", 1 if f16_here else 0, len(data))
        data += blob + b"\0" * (-len(blob) % 32)
    head = header + directory
    return head + b"\0" * (-len(head) % 32) + data


def safetensors(dtype):
    header, data = {}, b""
    for k, (name, shape) in enumerate(shapes(gguf=False)):
        n = 1
        for d in shape:
            n *= d
        v = [1.0] * n if len(shape) == 1 else values(n, k)
        if dtype == "F32":
            blob = struct.pack(f"<{n}f", *v)
        else:  # BF16: the high half of each float
            blob = b"".join(struct.pack("<f", x)[2:] for x in v)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


def mini_config():
    c = json.load(open(f"{TINY}/hf-f32/config.json"))
    c.update(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=HEADS,
             num_key_value_heads=KV, head_dim=HD, vocab_size=VOCAB, max_position_embeddings=CTX)
    return json.dumps(c, separators=(",", ":")).encode()


def framed(config, shard):
    return struct.pack("<H", len(config)) + config + shard


def header_only_gguf(path):
    """The file up to the end of its tensor directory: metadata and shapes, no tensor data."""
    b = open(path, "rb").read()
    p = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", b, p)
    p += 16
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_string(p):
        return p + 8 + struct.unpack_from("<Q", b, p)[0]

    for _ in range(n_kv):
        p = skip_string(p)
        t, = struct.unpack_from("<I", b, p)
        p += 4
        if t == 8:
            p = skip_string(p)
        elif t == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            for _ in range(n):
                p = skip_string(p) if et == 8 else p + size[et]
        else:
            p += size[t]
    for _ in range(n_tensors):
        p = skip_string(p)
        nd, = struct.unpack_from("<I", b, p)
        p += 4 + 8 * nd + 4 + 8
    return b[:p]


def write(target, name, blob):
    os.makedirs(f"{OUT}/{target}", exist_ok=True)
    assert len(blob) < 64 << 10, (target, name, len(blob))
    with open(f"{OUT}/{target}/{name}", "wb") as f:
        f.write(blob)


def main():
    write("gguf", "mini-f32-no-tokenizer.gguf", mini_gguf(f16=False, tokenizer=False))
    write("gguf", "mini-f16-tokenizer.gguf", mini_gguf(f16=True, tokenizer=True))
    write("gguf", "tiny-llama-q4_0-header.gguf", header_only_gguf(f"{TINY}/tiny-llama-q4_0.gguf"))
    write("safetensors", "mini-f32", framed(mini_config(), safetensors("F32")))
    write("safetensors", "mini-bf16", framed(mini_config(), safetensors("BF16")))
    tiny = open(f"{TINY}/hf-f32/model.safetensors", "rb").read()
    n, = struct.unpack_from("<Q", tiny)
    write("safetensors", "tiny-llama-header",
          framed(open(f"{TINY}/hf-f32/config.json", "rb").read(), tiny[:8 + n]))
    tokenizer = open(f"{TINY}/hf-f32/tokenizer.json", "rb").read()
    config = open(f"{TINY}/hf-f32/tokenizer_config.json", "rb").read()
    write("tokenizer_json", "tiny-llama", tokenizer)
    write("tokenizer_json", "tiny-llama-with-config", tokenizer + b"\0" + config)
    llama3 = open("tests/data/tiny/tiny-llama3-rope/hf-f32/tokenizer.json", "rb").read()
    if llama3 != tokenizer:
        write("tokenizer_json", "tiny-llama3", llama3)
    mini = json.loads(tokenizer)
    mini["model"]["vocab"] = {k: v for k, v in mini["model"]["vocab"].items() if v < 3} | {
        "H": 3, "e": 4, "l": 5, "o": 6, "Ġ": 7, "ll": 8, "He": 9}
    mini["model"]["merges"] = ["l l", "H e"]
    write("tokenizer_json", "mini", json.dumps(mini, ensure_ascii=False).encode())


if __name__ == "__main__":
    main()
