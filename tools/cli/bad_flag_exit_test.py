#!/usr/bin/env python3
"""Bad values of the CPU engine flags, and `lazyattn-logits` token lists that are not integers or
fall outside the vocabulary, make `lazyattn generate` and `lazyattn-logits` exit 2 with a message
naming the flag; every good combination runs (on the tiny test model).

  bad_flag_exit_test.py --bin-dir BUILD/bin
"""
import argparse
import os
import subprocess
import sys
import tempfile

from cli_exit_cases import finish, last_line, programs, report

TINY_GGUF = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    found = programs(args.bin_dir, ["lazyattn", "lazyattn-logits"])
    if found is None:
        return 1
    lazyattn, logits = found
    out = os.path.join(tempfile.mkdtemp(prefix="lazyattn-bad-flag-"), "logits.bin")
    generate = [lazyattn, "generate", "--model", TINY_GGUF, "--prompt", "hi", "--backend", "cpu",
                "--max-tokens", "1"]
    logits_cmd = [logits, "--model", TINY_GGUF, "--backend", "cpu", "--tokens", "1,2,3",
                  "--out", out]
    # (name, argv, expected exit, text the last stderr line must contain)
    cases = []
    for flag in ("--cpu-activations", "--cpu-kv-cache"):
        for value in ("", "bf16", "F16", "int8 ", "f16\x01", "x" * 4096):
            cases.append((f"generate {flag}={value[:8]!r}", generate + [flag, value], 2, flag))
            cases.append((f"logits {flag}={value[:8]!r}", logits_cmd + [flag, value], 2, flag))
    for tokens in ("1,x", "", "1,,2", "2147483648", "-1", "320", "999999999"):
        # The tiny model's vocabulary is [0, 320).
        cases.append((f"logits --tokens {tokens!r}",
                      logits_cmd[:-4] + ["--tokens", tokens, "--out", out], 2, "--tokens"))
    for acts in ("fp32", "int8"):
        for kv in ("f32", "f16"):
            cases.append((f"generate {acts}/{kv}",
                          generate + ["--cpu-activations", acts, "--cpu-kv-cache", kv], 0, ""))
            cases.append((f"logits {acts}/{kv}",
                          logits_cmd + ["--cpu-activations", acts, "--cpu-kv-cache", kv], 0, ""))
    failures = 0
    for name, argv, want_rc, text in cases:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           errors="replace", timeout=120)
        last = last_line(p.stderr)
        ok = p.returncode == want_rc and text in last
        if want_rc == 0 and "logits" in name:
            ok = ok and os.path.getsize(out) > 0
        failures += report(ok, f"{name:40}", p.returncode, last)
    return finish(failures)


if __name__ == "__main__":
    sys.exit(main())
