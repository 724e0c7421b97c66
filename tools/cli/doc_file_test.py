#!/usr/bin/env python3
"""`--doc PATH` of `lazyattn client`, `prefetch` and `generate` reads at most --max-doc-bytes
(default 1 MiB, the router's default limits.max_document_bytes): an endless device (/dev/zero), a
directory, a missing or an oversize file makes the command exit 2 with a message naming --doc and
the path, before any call. A file within the limit is read and sent (here to a router that is not
there: exit 1), also one that reports no size: a FIFO with a writer (what `--doc <(cmd)` passes)
and a /proc file.

Each child runs under an address-space limit and a timeout, so a regression that reads /dev/zero
dies (and fails the test) instead of exhausting the machine.

  doc_file_test.py --bin-dir BUILD/bin
"""
import os
import subprocess
import sys
import threading

from cli_exit_cases import finish, last_line, limit_memory, main_with_lazyattn, report

TINY_GGUF = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf"
DEFAULT_LIMIT = 1 << 20
# Nothing listens there: a request that gets past reading its documents fails to connect.
NO_ROUTER = "127.0.0.1:1"


def write_fifo(path):
    with open(path, "w") as f:
        f.write("A document from a pipe.\n")


def run_cases(lazyattn, tmp):
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    at_limit = os.path.join(tmp, "at-limit.txt")
    with open(at_limit, "wb") as f:
        f.write(b"a" * DEFAULT_LIMIT)
    over = os.path.join(tmp, "over.txt")
    with open(over, "wb") as f:
        f.write(b"a" * (DEFAULT_LIMIT + 1))
    small = os.path.join(tmp, "small.txt")
    with open(small, "w") as f:
        f.write("A small document.\n")
    missing = os.path.join(tmp, "missing.txt")

    client = [lazyattn, "client", "--router", NO_ROUTER, "--prompt", "hi", "--timeout", "10"]
    prefetch = [lazyattn, "prefetch", "--router", NO_ROUTER, "--timeout", "10"]
    generate = [lazyattn, "generate", "--model", TINY_GGUF, "--prompt", "hi", "--backend", "cpu",
                "--max-tokens", "1", "--kv-budget", str(16 << 20)]
    # (name, argv, expected exit, texts the last stderr line must contain, texts it must not)
    cases = []
    for command, argv in (("client", client), ("prefetch", prefetch), ("generate", generate)):
        for what, path, why in (("/dev/zero", "/dev/zero", f"more than {DEFAULT_LIMIT}"),
                                ("a directory", tmp, "a directory"),
                                ("a missing file", missing, "No such file"),
                                ("an oversize file", over, f"more than {DEFAULT_LIMIT}")):
            cases.append((f"{command} --doc {what}", argv + ["--doc", small, "--doc", path], 2,
                          ["--doc", path, why], []))
        cases.append((f"{command} --max-doc-bytes 0", argv + ["--doc", small,
                                                               "--max-doc-bytes", "0"],
                      2, ["--max-doc-bytes"], []))
    for command, argv in (("client", client), ("prefetch", prefetch)):
        # Read, then sent: the call fails (no router), not the argument.
        cases.append((f"{command} --doc at the limit", argv + ["--doc", at_limit], 1, [],
                      ["--doc"]))
        cases.append((f"{command} --doc a FIFO with a writer", argv + ["--doc", fifo], 1, [],
                      ["--doc"]))
        cases.append((f"{command} --doc /proc/self/status", argv + ["--doc", "/proc/self/status"],
                      1, [], ["--doc"]))
        cases.append((f"{command} --doc over the default with --max-doc-bytes",
                      argv + ["--doc", over, "--max-doc-bytes", str(DEFAULT_LIMIT + 1)], 1, [],
                      ["--doc"]))
    cases.append(("generate --doc a small file", generate + ["--doc", small], 0, [], []))

    failures = 0
    for name, argv, want_rc, texts, absent in cases:
        if "FIFO with a writer" in name:
            # The writer blocks until the command opens the FIFO, then closes it: one document.
            threading.Thread(target=write_fifo, args=(fifo,), daemon=True).start()
        try:
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, errors="replace", timeout=60,
                               preexec_fn=limit_memory)
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            rc, err = "timeout", ""
        last = last_line(err)
        ok = (rc == want_rc and all(t in last for t in texts) and
              not any(t in last for t in absent))
        failures += report(ok, f"{name:55}", rc, last, 200)
    return finish(failures)


if __name__ == "__main__":
    sys.exit(main_with_lazyattn("lazyattn-doc-file-", run_cases))
