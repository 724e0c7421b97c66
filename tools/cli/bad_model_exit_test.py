#!/usr/bin/env python3
"""No model file, however malformed, aborts `lazyattn generate`, `lazyattn replay` or
`lazyattn-worker`: each exits 2 with a message naming the file and the field.

The malformed files are made here from the tiny models in tests/data/tiny: header values of the
GGUF rewritten in place (the known aborts: llama.context_length = 0xFFFFFFFF, 2^31 dimensions),
keys of the HF config.json and tokenizer.json replaced, files truncated. Each child runs under an
address-space limit, so a regression that allocates from a bad header dies (and fails the test)
instead of exhausting the machine.

  bad_model_exit_test.py --bin-dir BUILD/bin [--only SUBSTRING] [--rlimit-gb N (0: none)]
"""
import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile

from cli_exit_cases import finish, last_line, programs, report

TINY_GGUF = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf"
TINY_HF = "tests/data/tiny/tiny-llama/hf-f32"


def gguf_value_offsets(b):
    """key -> offset of its value, for the scalar metadata of a GGUF v3 file."""
    p = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", b, p)
    p += 16
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    out = {}

    def string(p):
        n, = struct.unpack_from("<Q", b, p)
        return b[p + 8:p + 8 + n].decode(), p + 8 + n

    for _ in range(n_kv):
        key, p = string(p)
        t, = struct.unpack_from("<I", b, p)
        p += 4
        out[key] = p
        if t == 8:
            _, p = string(p)
        elif t == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            for _ in range(n):
                p = string(p)[1] if et == 8 else p + size[et]
        else:
            p += size[t]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--rlimit-gb", type=int, default=8)
    args = ap.parse_args()

    if programs(args.bin_dir, ["lazyattn", "lazyattn-worker"]) is None:
        return 1
    tmp = tempfile.mkdtemp(prefix="lazyattn-bad-model-")
    gguf = open(TINY_GGUF, "rb").read()
    offsets = gguf_value_offsets(gguf)
    cases = []  # (name, model path, text the message must contain)

    def patched_gguf(name, key, fmt, value):
        b = bytearray(gguf)
        struct.pack_into(fmt, b, offsets[key], value)
        path = os.path.join(tmp, name + ".gguf")
        open(path, "wb").write(b)
        cases.append((name, path, key))

    patched_gguf("context-ffffffff", "llama.context_length", "<I", 0xFFFFFFFF)
    patched_gguf("embedding-2^31", "llama.embedding_length", "<I", 1 << 31)
    patched_gguf("ffn-2^31", "llama.feed_forward_length", "<I", 1 << 31)
    patched_gguf("vocab-2^31", "llama.vocab_size", "<I", 1 << 31)
    patched_gguf("eps-nan", "llama.attention.layer_norm_rms_epsilon", "<f", float("nan"))
    truncated = os.path.join(tmp, "truncated.gguf")
    open(truncated, "wb").write(gguf[:len(gguf) // 2])
    cases.append(("truncated", truncated, truncated))

    def hf(name, file, key, value):
        d = os.path.join(tmp, name)
        shutil.copytree(TINY_HF, d)
        j = json.load(open(os.path.join(d, file)))
        if file == "config.json":
            j[key] = value
        else:
            j["model"]["vocab"][key] = value
        json.dump(j, open(os.path.join(d, file), "w"))
        cases.append((name, d, key if file == "config.json" else "model.vocab"))

    hf("hidden-2^40", "config.json", "hidden_size", 1 << 40)
    hf("hf-vocab-2^31", "config.json", "vocab_size", 1 << 31)
    hf("layers-1e9", "config.json", "num_hidden_layers", 1000000000)
    hf("hf-eps-negative", "config.json", "rms_norm_eps", -1e-5)
    hf("token-id-2^30", "tokenizer.json", "hello", 1 << 30)

    requests = os.path.join(tmp, "requests.jsonl")
    open(requests, "w").write(json.dumps({"question": "hi", "max_tokens": 1}) + "\n")

    def limit():
        if args.rlimit_gb > 0:
            n = args.rlimit_gb << 30
            resource.setrlimit(resource.RLIMIT_AS, (n, n))

    def run(argv):
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           errors="replace", timeout=120, preexec_fn=limit)
        return p.returncode, p.stderr

    failures = 0
    for name, path, field in cases:
        if args.only not in name:
            continue
        worker_yaml = os.path.join(tmp, name + ".yaml")
        open(worker_yaml, "w").write(f"insecure: true\nmodel:\n  path: {path}\nbackend: cpu\n")
        commands = {
            "generate": [f"{args.bin_dir}/lazyattn", "generate", "--model", path, "--prompt", "hi",
                         "--backend", "cpu", "--max-tokens", "1"],
            "replay": [f"{args.bin_dir}/lazyattn", "replay", "--model", path, "--requests",
                       requests, "--backend", "cpu"],
            "worker": [f"{args.bin_dir}/lazyattn-worker", "--config", worker_yaml, "--listen",
                       "127.0.0.1:0", "--metrics", "", "--kvdir", ""],
        }
        for what, argv in commands.items():
            rc, err = run(argv)
            last = last_line(err)
            ok = rc == 2 and field in last and path in last
            failures += report(ok, f"{name:18} {what:8}", rc, last, 200)
    shutil.rmtree(tmp)
    return finish(failures)


if __name__ == "__main__":
    sys.exit(main())
