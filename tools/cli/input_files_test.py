#!/usr/bin/env python3
"""The other files the `lazyattn` CLI reads: `--api-key-file` (client, prefetch, trace) and
`replay --requests`. An endless device (/dev/zero), a directory, an empty or a missing file is
refused with a message naming the flag and the path, before any call. /dev/zero as the key file
was read until memory ran out (abort); a directory or an empty key file sent the request with no
key; `replay --requests` of /dev/zero grew without bound and of a directory exited 0 with "0
requests".

Each child runs under an address-space limit and a timeout, so a regression that reads /dev/zero
dies (and fails the test) instead of exhausting the machine.

  input_files_test.py --bin-dir BUILD/bin
"""
import os
import subprocess
import sys

from cli_exit_cases import finish, last_line, limit_memory, main_with_lazyattn, report

TINY_GGUF = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf"
NO_ROUTER = "127.0.0.1:1"  # nothing listens: a command past its files fails to connect
CA = "tests/data/tiny/nonexistent-ca.pem"  # --api-key needs --ca; never read before the key file


def run_cases(lazyattn, tmp):
    empty = os.path.join(tmp, "empty")
    open(empty, "w").close()
    blank = os.path.join(tmp, "blank")
    with open(blank, "w") as f:
        f.write(" \n\t\n")
    missing = os.path.join(tmp, "missing")
    # (name, argv, expected exit, texts the last stderr line must contain)
    cases = []
    client = [lazyattn, "client", "--router", NO_ROUTER, "--prompt", "hi", "--ca", CA]
    for what, path in (("/dev/zero", "/dev/zero"), ("a directory", tmp), ("empty", empty),
                       ("whitespace only", blank), ("missing", missing)):
        cases.append((f"client --api-key-file {what}", client + ["--api-key-file", path], 1,
                      ["--api-key-file", path]))
    replay = [lazyattn, "replay", "--model", TINY_GGUF, "--backend", "cpu", "--requests"]
    for what, path, text in (("/dev/zero", "/dev/zero", "not a file or a pipe"),
                             ("a directory", tmp, "not a file or a pipe"),
                             ("empty", empty, "holds no requests"),
                             ("missing", missing, "cannot read")):
        cases.append((f"replay --requests {what}", replay + [path], 2,
                      ["--requests", path, text]))
    failures = 0
    for name, argv, want_rc, texts in cases:
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               errors="replace", timeout=120, preexec_fn=limit_memory)
            rc, last = p.returncode, last_line(p.stderr)
        except subprocess.TimeoutExpired:
            rc, last = "timeout", ""
        ok = rc == want_rc and all(t in last for t in texts)
        failures += report(ok, f"{name:40}", rc, last)
    return finish(failures)


if __name__ == "__main__":
    sys.exit(main_with_lazyattn("lazyattn-input-files-", run_cases))
