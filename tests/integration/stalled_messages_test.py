#!/usr/bin/env python3
"""Messages that are started and never finished cannot pin a server's memory.

A gRPC message is buffered by the transport until its last byte arrives, whatever the method, and
grpc.health.v1 is open to any peer (no certificate, no API key). 20 calls to Health/Check, each
announcing a 31 MiB message, sending 30 MiB of it and stalling, held 650 MB of a router. Every
server now runs under a gRPC resource quota of kTransportMemoryPerMessage (8) times its
max_message_bytes (common/grpc_util.h).

This starts lazyattn-kvdir (plaintext, limits.max_message_bytes 1 MiB: an 8 MiB quota), opens
STREAMS such calls with curl over HTTP/2, each sending 0.95 MiB of a 1 MiB message, and checks
that the process grew by less than the calls sent, and that a health check still answers
meanwhile. A control run with 64 MiB messages (a 512 MiB quota) first shows them all held.

  stalled_messages_test.py --bin-dir BUILD/bin
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

STREAMS = 40
SENT_BYTES = 972 << 10  # of a 1 MiB message
GROWTH_LIMIT_MB = 24  # the quota (8 MiB) plus the process's own growth
CONTROL_MIN_MB = 30  # 40 x 0.95 MiB held whole (measured +39.9)


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_ok(port):
    """grpc.health.v1 Check over HTTP/2 with curl: an empty request, SERVING (08 01) back."""
    p = subprocess.run(
        ["curl", "-s", "--http2-prior-knowledge", "--max-time", "20", "-H",
         "content-type: application/grpc", "-H", "te: trailers", "--data-binary", "@-",
         "-o", "-", f"http://127.0.0.1:{port}/grpc.health.v1.Health/Check"],
        input=b"\x00\x00\x00\x00\x00", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        timeout=30)
    return p.stdout.endswith(b"\x08\x01")


def stall(bin_dir, tmp, max_message_bytes):
    """Starts kvdir with this limits.max_message_bytes, stalls STREAMS partial messages at it;
    returns (RSS growth in MB, whether health still answered), or None if it did not start."""
    port = free_port()
    config = os.path.join(tmp, "kvdir.yaml")
    with open(config, "w") as f:
        # No metrics endpoint: its default port may be taken by a test running beside this one.
        f.write(f"insecure: true\nserver: {{listen: 127.0.0.1:{port}}}\nmetrics: {{listen: \"\"}}\n"
                f"limits: {{max_message_bytes: {max_message_bytes}}}\n")
    kvdir = subprocess.Popen([os.path.join(bin_dir, "lazyattn-kvdir"), "--config", config],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    curls = []
    try:
        deadline = time.time() + 30
        while not health_ok(port):
            if time.time() > deadline or kvdir.poll() is not None:
                return None
            time.sleep(0.2)
        before = rss_mb(kvdir.pid)
        body = os.path.join(tmp, "partial.bin")
        with open(body, "wb") as f:
            f.write(b"\x00" + (1 << 20).to_bytes(4, "big"))  # uncompressed, 1 MiB announced
            f.write(b"\x00" * SENT_BYTES)
        for _ in range(STREAMS):
            # `cat` then `sleep`: the body is sent and the request stays open, unfinished.
            curls.append(subprocess.Popen(
                f"(cat '{body}'; sleep 60) | curl -s --http2-prior-knowledge --max-time 60 "
                f"-H 'content-type: application/grpc' -H 'te: trailers' -X POST -T - "
                f"http://127.0.0.1:{port}/grpc.health.v1.Health/Check -o /dev/null",
                shell=True, start_new_session=True))
        time.sleep(8)  # every body sent (40 MB over loopback)
        peak = 0.0
        for _ in range(5):
            peak = max(peak, rss_mb(kvdir.pid))
            time.sleep(0.2)
        return peak - before, health_ok(port)
    finally:
        for c in curls:
            try:
                os.killpg(c.pid, 9)
            except ProcessLookupError:
                pass
        kvdir.terminate()
        kvdir.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    if shutil.which("curl") is None:
        print("FAIL: curl not found (tools/setup-deps installs it)", file=sys.stderr)
        return 1
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        # The control: with 64 MiB messages the quota (512 MiB) is far away, so the stalled
        # messages are all held; this shows the attack works here. Then the bound.
        for max_message_bytes, want in [(64 << 20, "held"), (1 << 20, "bounded")]:
            result = stall(args.bin_dir, tmp, max_message_bytes)
            if result is None:
                print("FAIL: lazyattn-kvdir did not start", file=sys.stderr)
                return 1
            growth, serving = result
            ok = serving and (growth > CONTROL_MIN_MB if want == "held"
                              else growth < GROWTH_LIMIT_MB)
            print(f"{'ok  ' if ok else 'FAIL'} max_message_bytes {max_message_bytes >> 20} MiB, "
                  f"{STREAMS} stalled messages of {SENT_BYTES >> 10} KiB: +{growth:.1f} MB RSS "
                  f"(expected {want}: {'over ' + str(CONTROL_MIN_MB) if want == 'held' else 'under ' + str(GROWTH_LIMIT_MB)}); "
                  f"health {'answers' if serving else 'does not answer'}")
            failures += 0 if ok else 1
    if failures:
        print(f"FAIL: {failures} case(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
