#!/usr/bin/env python3
"""The three services' command lines: a flag given twice (a second --config would otherwise
silently replace the first), an unknown flag and a flag without its value make lazyattn-router,
lazyattn-worker and lazyattn-kvdir exit 2 with a message naming the flag, before any file is read;
and a file named by the configuration that is missing or malformed exits 2, a busy port 1.

  command_line_test.py --bin-dir BUILD/bin
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "cli"))
from cli_exit_cases import finish, programs, report  # noqa: E402

SERVICES = ["lazyattn-router", "lazyattn-worker", "lazyattn-kvdir"]
GEN_CERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                         "gen-certs")


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
    failures += start_failures(dict(zip(SERVICES, found)))
    return finish(failures)


def start_failures(path_of):
    """A file a key names that is missing or malformed is configuration (exit 2), found when the
    server is created; an address that cannot be bound is not (exit 1). The key file and the
    metrics token used to exit 1 like a busy port."""
    failures = 0
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        keys = os.path.join(tmp, "keys.yaml")
        with open(keys, "w") as f:
            f.write("keys:\n  - name: a\n    sha256: zz\n")
        # API keys need TLS: a throwaway CA and the router's certificate.
        certs = os.path.join(tmp, "certs")
        subprocess.run([GEN_CERTS, "--out", certs, "--workers", "1"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        pair = "{cert_file: %s/router-0.crt, key_file: %s/router-0.key" % (certs, certs)
        # No metrics endpoint unless the case is about it: the defaults' fixed ports may be taken
        # by a test running beside this one.
        router = ("server: {listen: 127.0.0.1:0, tls: %s}}\nclient_tls: %s, ca_file: %s/ca.crt}\n"
                  "workers: [127.0.0.1:1]\nauth: {api_keys_file: %s}\nmetrics: {listen: \"\"}\n"
                  % (pair, pair, certs, keys))
        insecure = "insecure: true\nserver: {listen: 127.0.0.1:%d}\n"
        no_metrics = "metrics: {listen: \"\"}\n"
        # (service, name, config, exit status, the text the error line must contain)
        cases = [
            ("lazyattn-router", "malformed key file", router, 2,
             "auth.api_keys_file: %s: keys[0].sha256: expected 64 hex digits" % keys),
            ("lazyattn-kvdir", "missing metrics token",
             insecure % 0 + "metrics: {listen: 127.0.0.1:0, bearer_token_file: %s/none}\n" % tmp,
             2, "metrics.bearer_token_file: cannot read"),
            ("lazyattn-kvdir", "port in use", insecure % busy.getsockname()[1] + no_metrics, 1,
             "cannot listen on 127.0.0.1:%d" % busy.getsockname()[1]),
            # The worker's /metrics opens before its model loads (so a long load is not read as
            # a worker down): a busy metrics address ends it before the (missing) model is read.
            ("lazyattn-worker", "metrics port in use before the model",
             insecure % 0 + "model: {path: %s/none.gguf}\nmetrics: {listen: 127.0.0.1:%d}\n"
             % (tmp, busy.getsockname()[1]), 1,
             "cannot listen on 127.0.0.1:%d" % busy.getsockname()[1]),
            # A port past 65535 is configuration; the HTTP and metrics libraries would bind it
            # modulo 65536 (99999 as 34463) and print the configured one.
            ("lazyattn-worker", "metrics port out of range",
             insecure % 0 + "model: {path: %s/none.gguf}\nmetrics: {listen: 127.0.0.1:99999}\n"
             % tmp, 2, "the port must be a number from 0 to 65535"),
            ("lazyattn-kvdir", "metrics port out of range",
             insecure % 0 + "metrics: {listen: 127.0.0.1:99999}\n", 2,
             "the port must be a number from 0 to 65535"),
            # A server certificate of another role is refused before the (missing) model is
            # read: routers would refuse every handshake with it, and a GPU load takes minutes.
            ("lazyattn-worker", "another role's certificate",
             "server: {listen: 127.0.0.1:0, tls: {cert_file: %s/kvdir.crt, key_file: %s/kvdir.key,"
             " ca_file: %s/ca.crt}}\nmodel: {path: %s/none.gguf}\n" % (certs, certs, certs, tmp)
             + no_metrics, 2,
             "server.tls.cert_file: %s/kvdir.crt: the certificate is lazyattn://kvdir/kvdir "
             "(role kvdir), but this server serves as role worker" % certs),
            ("lazyattn-router", "http port out of range",
             insecure % 0 + no_metrics + "workers: [127.0.0.1:1]\nhttp: {listen: 127.0.0.1:99999}\n",
             2, "http.listen: 127.0.0.1:99999: the port must be a number from 0 to 65535"),
        ]
        for service, name, config, status, text in cases:
            path = os.path.join(tmp, "config.yaml")
            with open(path, "w") as f:
                f.write(config)
            p = subprocess.run([path_of[service], "--config", path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, errors="replace", timeout=60)
            errors = [line for line in p.stderr.splitlines() if " ERROR " in line]
            last = errors[-1] if errors else ""
            ok = p.returncode == status and text in last
            failures += report(ok, f"{service} {name:28}", p.returncode, last)
    return failures


if __name__ == "__main__":
    sys.exit(main())
