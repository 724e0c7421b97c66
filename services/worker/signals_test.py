#!/usr/bin/env python3
"""What a stop signal does to a lazyattn-worker process that has not started serving yet.

A model that loads for minutes (a GPU worker) must not make SIGTERM, SIGINT or SIGHUP wait for the
end of the load: the process stops at once, says that it stopped before serving, exits 0 and never
prints its `listening` line. The load is held by fault injection (testing.hold_model_load_ms), as a
slow read would hold it. Once it serves (the tiny test
model), the same signals still drain it (SIGTERM, SIGHUP) or stop it at once (SIGINT), exit 0.

  signals_test.py --bin-dir BUILD/bin
"""
import argparse
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

# Generous for a loaded 2-core machine; the stop itself takes milliseconds.
STOP_TIMEOUT_S = 10
TINY_GGUF = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf"  # run from the repository root


def lines_of(stream, into):
    for line in iter(stream.readline, ""):
        into.put(line)
    into.put(None)


def stop_while_loading(worker, tmp, sig):
    """Starts a worker whose model load never ends, sends `sig` once it is loading, and returns
    a list of failures (empty: passed)."""
    # The load is held by fault injection (a FIFO as the model held it once; a FIFO is refused at
    # once now, which raced the signal). The model is never read: a stop must end the hold, else
    # the missing file ends the worker with exit 2.
    config = os.path.join(tmp, f"worker-{sig.name}.yaml")
    with open(config, "w") as f:
        f.write(f"model:\n  path: {tmp}/never-read.gguf\nbackend: cpu\ninsecure: true\n"
                "server:\n  listen: 127.0.0.1:0\nmetrics:\n  listen: \"\"\n"
                "testing:\n  hold_model_load_ms: 60000\n")
    proc = subprocess.Popen([worker, "--config", config], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    err_lines = queue.Queue()
    threading.Thread(target=lines_of, args=(proc.stderr, err_lines), daemon=True).start()
    stderr = []
    failures = []
    try:
        # Wait (bounded) until it logs that it loads the model; the hold then keeps it loading.
        until = time.monotonic() + 60
        while not any("loading the model" in line for line in stderr):
            left = until - time.monotonic()
            if left <= 0:
                return [f"no 'loading the model' line within 60 s: {''.join(stderr)[-400:]}"]
            try:
                line = err_lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                return [f"exited {proc.wait()} before loading: {''.join(stderr)[-400:]}"]
            stderr.append(line)
        sent = time.monotonic()
        proc.send_signal(sig)
        try:
            rc = proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return [f"still running {STOP_TIMEOUT_S} s after {sig.name} (waits for the load)"]
        took = time.monotonic() - sent
        stdout = proc.stdout.read()
        while (line := err_lines.get(timeout=5)) is not None:
            stderr.append(line)
        text = "".join(stderr)
        if rc != 0:
            failures.append(f"exit status {rc}, want 0: {text[-400:]}")
        if "stopped before serving" not in text:
            failures.append(f"no 'stopped before serving' log line: {text[-400:]}")
        if "listening" in stdout:
            failures.append(f"printed its listening line: {stdout!r}")
        print(f"  {sig.name}: exit {rc} after {took:.2f} s")
        return failures
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop_while_serving(worker, tmp, sig):
    """The same worker on a model that loads: once it listens, `sig` stops it as before (a drain
    for SIGTERM and SIGHUP, at once for SIGINT), exit status 0."""
    config = os.path.join(tmp, f"serving-{sig.name}.yaml")
    with open(config, "w") as f:
        f.write(f"model:\n  path: {os.path.abspath(TINY_GGUF)}\nbackend: cpu\ninsecure: true\n"
                "server:\n  listen: 127.0.0.1:0\nmetrics:\n  listen: \"\"\n")
    proc = subprocess.Popen([worker, "--config", config], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        line = proc.stdout.readline()  # the launcher's line; bounded by the test's TIMEOUT
        if "listening on" not in line:
            return [f"no listening line (got {line!r}, exit {proc.wait()}): "
                    f"{proc.stderr.read()[-400:]}"]
        proc.send_signal(sig)
        try:
            _, stderr = proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return [f"still running {STOP_TIMEOUT_S} s after {sig.name}"]
        failures = []
        if proc.returncode != 0:
            failures.append(f"exit status {proc.returncode}, want 0: {stderr[-400:]}")
        want = "shutting down" if sig == signal.SIGINT else "draining"
        for text in (want, "stopped"):
            if text not in stderr:
                failures.append(f"no '{text}' log line: {stderr[-400:]}")
        if "before serving" in stderr:
            failures.append(f"says it stopped before serving: {stderr[-400:]}")
        return failures
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    worker = os.path.join(args.bin_dir, "lazyattn-worker")
    if not os.access(worker, os.X_OK):
        print(f"{worker} is missing: build it first", file=sys.stderr)
        return 1
    failed = 0
    with tempfile.TemporaryDirectory(prefix="lazyattn-worker-signals-") as tmp:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            for when, case in (("while loading", stop_while_loading),
                               ("while serving", stop_while_serving)):
                failures = case(worker, tmp, sig)
                for f in failures:
                    print(f"FAIL {sig.name} {when}: {f}")
                if not failures:
                    print(f"ok   {sig.name} {when}")
                failed += bool(failures)
    if failed:
        print(f"{failed} failures", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
