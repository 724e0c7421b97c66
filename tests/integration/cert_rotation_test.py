#!/usr/bin/env python3
"""Certificate rotation without a restart, on real processes: a secured cluster as tools/cluster
runs it (mutual TLS, API keys; certificates from tools/gen-certs, files re-read every second).

  python3 tests/integration/cert_rotation_test.py [--bin-dir build/bin]

A worker's certificate is replaced on disk the way docs/operations.md ("Rotating") says: a new one
from the same CA is written elsewhere (`tools/gen-certs cert ... --ca`) and its key and
certificate are moved over the old files. The worker is not restarted. kvdir is then restarted,
which forces the worker's next connection to it; kvdir logs the serial of the certificate each
worker said hello with, and the test checks that:
  - before the rotation the worker registered with the old serial;
  - after it, the worker registers with the new serial (its kvdir channel presents the replaced
    file) and never again with the old one;
  - the worker answers requests before, during and after, as the same process;
  - the router (its channels to kvdir and the worker watch their files the same way) routes to
    the worker again through the restarted kvdir.
Prints one line per check and "N passed, M failed" last; exits non-zero on any failure.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_harness import REPO, Cluster, check, finish  # noqa: E402

GEN_CERTS = os.path.join(REPO, "tools", "gen-certs")
HELLO = re.compile(r"hello from worker.*")
SERIAL = re.compile(r"certificate_serial=\"?([0-9A-Fa-f]+|none)")


class FastRefreshCluster(Cluster):
    """The harness's secured cluster with every process re-reading its TLS files each second
    (server.tls.refresh_interval_s: 1; a worker's kvdir channel follows it)."""

    def _security(self, cert, *sections):
        text = super()._security(cert, *sections)
        return text.replace("server:\n  tls:\n", "server:\n  tls:\n    refresh_interval_s: 1\n")


def serial_of(path):
    out = subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", path], check=True,
                         capture_output=True, text=True).stdout
    return int(out.strip().split("=", 1)[1], 16)


def hello_serials(log_path, worker):
    """The certificate serials (ints; None for "none") of every hello `worker` said in this log."""
    serials = []
    with open(log_path, errors="replace") as f:
        for line in f:
            if "hello from worker" not in line or f"worker={worker}" not in line:
                continue
            m = SERIAL.search(line)
            if m:
                serials.append(None if m.group(1) == "none" else int(m.group(1), 16))
    return serials


def fmt(serials):
    return [f"{s:X}" if s is not None else "none" for s in serials]


def wait_for(cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(REPO, "build", "bin"))
    args = ap.parse_args()
    os.chdir(REPO)
    with tempfile.TemporaryDirectory() as tmp:
        certs = os.path.join(tmp, "certs")
        subprocess.run([GEN_CERTS, "--out", certs, "--workers", "1"], check=True,
                       capture_output=True)
        doc = os.path.join(tmp, "doc.txt")
        with open(doc, "w") as f:
            f.write("The Seine flows through Paris.\n")
        c = FastRefreshCluster(args, tempfile.mkdtemp(dir=tmp), 1, "cache_aware", certs=certs)
        try:
            run_checks(c, certs, doc)
        finally:
            c.stop()
    finish()


def served(c, doc, question):
    r = c.request([doc], question)
    return r.get("ok") and r.get("worker") == "worker-0", str(r)[:300]


def run_checks(c, certs, doc):
    worker = c.procs["worker-0"].proc
    old = serial_of(f"{certs}/worker-0.crt")
    ok = wait_for(lambda: old in hello_serials(c.procs["kvdir"].log_path, "worker-0"), 10)
    check("before: kvdir logs worker-0's hello with its certificate's serial", ok,
          f"expected {old:X}, hellos with {fmt(hello_serials(c.procs['kvdir'].log_path, 'worker-0'))}")
    check("before: worker-0 answers through the router", *served(c, doc, "Which river?"))

    # Rotate: a new certificate from the same CA, written elsewhere, moved over the old files
    # (key first, the certificate right after).
    staging = os.path.join(certs, "next")
    subprocess.run([GEN_CERTS, "cert", "worker", "worker-0", "--ca", certs, "--out", staging],
                   check=True, capture_output=True)
    os.replace(f"{staging}/worker-0.key", f"{certs}/worker-0.key")
    os.replace(f"{staging}/worker-0.crt", f"{certs}/worker-0.crt")
    new = serial_of(f"{certs}/worker-0.crt")
    check("the new certificate has another serial", new != old, f"{old:X} / {new:X}")
    time.sleep(2.5)  # past the 1 s refresh of every watcher
    check("after the files moved: worker-0 still answers (open connections kept)",
          *served(c, doc, "Which river flows?"))

    # Force the worker's next connection to kvdir: restart kvdir on the same port.
    first_log = c.procs["kvdir"].log_path + ".before-restart"
    c.procs["kvdir"].stop(5)
    shutil.copy(c.procs["kvdir"].log_path, first_log)
    c.start_kvdir()
    log = c.procs["kvdir"].log_path
    ok = wait_for(lambda: new in hello_serials(log, "worker-0"), 20)
    check("after kvdir's restart: worker-0 registers with the new certificate's serial", ok,
          f"expected {new:X}, hellos with {fmt(hello_serials(log, 'worker-0'))}")
    check("no hello with the old certificate after the rotation",
          old not in hello_serials(log, "worker-0"),
          f"hellos with {fmt(hello_serials(log, 'worker-0'))}")
    check("worker-0 was not restarted", worker.poll() is None and c.procs["worker-0"].proc is worker)
    # The router refreshes its worker list from the new kvdir (its own channel reconnects with
    # the router's watched certificate) and the worker keeps serving.
    ok = wait_for(lambda: served(c, doc, "Which river flows through Paris?")[0], 20)
    check("after kvdir's restart: worker-0 answers through the router", ok,
          served(c, doc, "Is Paris on the Seine?")[1])


if __name__ == "__main__":
    main()
