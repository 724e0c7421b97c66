#!/usr/bin/env python3
"""The three services' command lines: a flag given twice (a second --config would otherwise
silently replace the first), an unknown flag and a flag without its value make lazyattn-router,
lazyattn-worker and lazyattn-kvdir exit 2 with a message naming the flag, before any file is read.

  command_line_test.py --bin-dir BUILD/bin
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "cli"))
from cli_exit_cases import finish, programs, report  # noqa: E402

SERVICES = ["lazyattn-router", "lazyattn-worker", "lazyattn-kvdir"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    found = programs(args.bin_dir, SERVICES)
    if found is None:
        return 1
    missing = "/nonexistent/lazyattn-command-line-test.yaml"
    # (name, arguments, the text stderr must contain)
    cases = [
        ("--config twice", ["--config", missing, "--config", missing + "2"], "--config: given twice"),
        ("--config= then --config", [f"--config={missing}", "--config", missing],
         "--config: given twice"),
        ("--listen twice", ["--config", missing, "--listen", "127.0.0.1:1", "--listen=127.0.0.1:2"],
         "--listen: given twice"),
        ("--metrics twice", ["--metrics=", "--metrics", "", "--config", missing],
         "--metrics: given twice"),
        ("unknown flag", ["--config", missing, "--bogus", "1"], "--bogus"),
        ("--config without value", ["--config"], "--config"),
        # Once each, the flags pass and the missing file is what is refused.
        ("each once", ["--config", missing, "--listen", "127.0.0.1:0"], missing),
    ]
    failures = 0
    for path, service in zip(found, SERVICES):
        for name, argv, text in cases:
            p = subprocess.run([path, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, errors="replace", timeout=60)
            first = p.stderr.strip().splitlines()[0] if p.stderr.strip() else ""
            ok = p.returncode == 2 and text in first
            failures += report(ok, f"{service} {name:28}", p.returncode, first)
    return finish(failures)


if __name__ == "__main__":
    sys.exit(main())
