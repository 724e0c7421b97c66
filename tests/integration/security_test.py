#!/usr/bin/env python3
"""Security integration tests: a cluster secured as tools/cluster runs it (mutual TLS between kvdir,
workers and router, API keys at the router; certificates from tools/gen-certs), real processes on
127.0.0.1, requests through `lazyattn client` and `lazyattn prefetch`.

  python3 tests/integration/security_test.py [--bin-dir build/bin]

Checks:
  - the secured cluster answers a RAG request (router -> kvdir and router -> worker over mTLS),
    and the README's demo requests (tools/cluster-demo: TLS and the demo key, as under
    tools/cluster) with document hits;
  - impostor workers, each a real lazyattn-worker pointed at kvdir, get nothing: one without a
    client certificate (UNAUTHENTICATED), one whose valid certificate names another id and that
    claims worker-0 (PERMISSION_DENIED, hello refused and counted), one advertising a host its
    valid certificate does not name (PERMISSION_DENIED, counted), one with the router's
    certificate (PERMISSION_DENIED), one with a certificate from another CA (handshake refused),
    one with worker-0's own certificate while worker-0 runs (ALREADY_EXISTS, logged as an error
    naming worker-0's address, counted); kvdir still counts two workers and every request is
    served by worker-0 or worker-1;
  - a kvdir given a worker's certificate does not start (exit 2): it is not lazyattn://kvdir/;
  - a worker refuses a caller whose certificate is not a router's; its gRPC health stays open;
  - raw gRPC calls with chosen client certificates: a router's certificate reads kvdir
    (ListWorkers) and a worker's Status (the controls); a worker's certificate is refused both
    (PERMISSION_DENIED); a router certificate signed by another CA is refused by kvdir and by a
    worker at the handshake (UNAVAILABLE), and gets nothing from the router without a key;
  - clients: no key, wrong key and a revoked key (removed from the key file, reloaded without a
    restart) get UNAUTHENTICATED (code 16); Prefetch with a key lacking `admin` gets
    PERMISSION_DENIED (code 7) and works with the admin key; the key name is a metrics label;
  - no process logs an API key, a question or a document's text;
  - tools/gen-certs --worker-host gives each worker's certificate its own host only (so kvdir's
    address check keeps one worker's certificate off another's address), --host still going to
    kvdir and the router; a host that is not a name or address is refused;
  - tools/gen-certs lifetimes: the CA lasts 10 years and its certificates 30 days, none is issued
    past the CA's end, a set run again makes its expiring certificates anew, and one whose CA ends
    is refused.
Prints one line per check and "N passed, M failed" last; exits non-zero on any failure.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_harness import (MODEL, REPO, Cluster, check, cluster, finish, metric_sum,  # noqa: E402
                             parse_metrics)

GEN_CERTS = os.path.join(REPO, "tools", "gen-certs")


def gen(*argv):
    return subprocess.run([GEN_CERTS, *argv], check=True, capture_output=True, text=True).stdout


def client(args, router, *extra, docs=(), prompt="Which river?"):
    argv = [f"{args.bin_dir}/lazyattn", "client", "--router", router, "--prompt", prompt,
            "--max-tokens", "2", "--json", "--timeout", "30", *extra]
    for d in docs:
        argv += ["--doc", d]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("LAZYATTN_")})


def start_impostor(c, name, worker_id, tls_lines, advertise=None):
    """A real lazyattn-worker that tries to publish to the cluster's kvdir as `worker_id`
    (advertising `advertise` when given, else its listening address)."""
    path = os.path.join(c.tmp, f"{name}.yaml")
    with open(path, "w") as f:
        f.write(f"insecure: true\nmodel:\n  path: {MODEL}\nbackend: auto\n"
                f"engine:\n  kv_budget_bytes: 16777216\n  max_batch_tokens: 256\n"
                f"metrics:\n  listen: ''\n" +
                (f"worker:\n  advertise_address: {advertise}\n" if advertise else "") +
                f"kvdir:\n  tls:\n{tls_lines}")
    p = cluster.Process(name, [f"{c.args.bin_dir}/lazyattn-worker", "--config", path,
                               "--listen", "127.0.0.1:0", "--kvdir", c.kvdir_addr,
                               "--worker-id", worker_id], c.tmp)
    c.procs[name] = p
    p.wait_ready(60)
    return p


def run_kvdir_as(c, name, certs, cert):
    """Starts a real lazyattn-kvdir serving with certs/<cert>.* (mutual TLS, the cluster's CA) and
    returns its completed process, for a certificate it refuses at start."""
    path = os.path.join(c.tmp, f"{name}.yaml")
    with open(path, "w") as f:
        f.write(f"server:\n  tls:\n    cert_file: {certs}/{cert}.crt\n    key_file: {certs}/{cert}.key\n"
                f"    ca_file: {certs}/ca.crt\nmetrics:\n  listen: ''\n")
    return subprocess.run([f"{c.args.bin_dir}/lazyattn-kvdir", "--config", path, "--listen",
                           "127.0.0.1:0"], capture_output=True, text=True, timeout=60)


def raw_call(addr, method, ca, cert=None, key=None):
    """One unary call of `method` with an empty request (valid for every message type) over TLS
    that trusts `ca`, presenting `cert`/`key` when given. Returns (status code name, details)."""
    import grpc  # python3-grpcio (tools/setup-deps)

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    creds = grpc.ssl_channel_credentials(read(ca), read(key) if key else None,
                                         read(cert) if cert else None)
    with grpc.secure_channel(addr, creds) as channel:
        try:
            channel.unary_unary(method)(b"", timeout=15)
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""


def wait_log(c, name, needles, timeout=10):
    """Waits until one line of the process's log holds every string of `needles` (the status
    code and message are fields of a structured line, whose quoting is the logger's)."""
    if isinstance(needles, str):
        needles = (needles,)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(c.procs[name].log_path, errors="replace") as f:
            text = f.read()
        if any(all(n in line for n in needles) for line in text.splitlines()):
            return True, ""
        time.sleep(0.1)
    return False, text[-400:]


def san_names(path):
    out = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", path],
                         check=True, capture_output=True, text=True).stdout
    return {n.strip() for n in out.splitlines()[-1].split(",")}


def check_worker_hosts(tmp):
    d = os.path.join(tmp, "per-worker-hosts")
    gen("--out", d, "--host", "kvdir.lazyattn.test", "--worker-host", "w0.lazyattn.test",
        "--worker-host", "10.1.2.3")
    names = {f: san_names(os.path.join(d, f + ".crt")) for f in ("kvdir", "router-0", "worker-0",
                                                                 "worker-1")}
    local = {"DNS:localhost", "IP Address:127.0.0.1"}
    check("gen-certs --worker-host: each worker's certificate names its own host, not the others'",
          names["worker-0"] == local | {"URI:lazyattn://worker/worker-0", "DNS:w0.lazyattn.test"} and
          names["worker-1"] == local | {"URI:lazyattn://worker/worker-1", "IP Address:10.1.2.3"},
          str(names))
    check("gen-certs --worker-host: --host still names kvdir and the router",
          "DNS:kvdir.lazyattn.test" in names["kvdir"] and
          "DNS:kvdir.lazyattn.test" in names["router-0"], str(names))
    for host in ("w0,DNS:w1.lazyattn.test", "w0.lazyattn.test:7200", "*.lazyattn.test", "999.1.2.3"):
        bad = subprocess.run([GEN_CERTS, "--out", d + "-bad", "--worker-host", host],
                             capture_output=True, text=True)
        check(f"gen-certs: --worker-host {host} (openssl syntax, a port, a wildcard, no address) is "
              "refused, nothing made",
              bad.returncode == 2 and "not a host name" in bad.stderr and
              not os.path.exists(d + "-bad"), bad.stderr)
    again = subprocess.run([GEN_CERTS, "--out", d, "--worker-host", "w9.lazyattn.test"],
                           capture_output=True, text=True)
    check("gen-certs --worker-host on a folder that holds a CA: refused (it would make nothing)",
          again.returncode == 2 and "--force" in again.stderr and
          san_names(os.path.join(d, "worker-0.crt")) == names["worker-0"], again.stderr)


def check_gen_certs_arguments(tmp):
    """gen-certs refuses what would only fail later: --days openssl cannot use, and an API key
    scope the router refuses (a misspelt scope made the whole key file unreadable to a router
    at its next restart, every client locked out)."""
    for days in ("0", "-5", "abc", "36501"):
        d = os.path.join(tmp, f"days-{days}")
        p = subprocess.run([GEN_CERTS, "--out", d, "--days", days], capture_output=True, text=True)
        check(f"gen-certs --days {days}: refused naming --days, nothing made",
              p.returncode == 2 and "--days: expected whole days from 1 to 36500" in p.stderr and
              not os.path.exists(d), p.stderr)
    d = os.path.join(tmp, "scopes")
    gen("--out", d)
    with open(os.path.join(d, "api-keys.yaml")) as f:
        before = f.read()
    for scopes in ("generat", "generate,", "generate admin", "read"):
        p = subprocess.run([GEN_CERTS, "api-key", "x", scopes, "--out", d], capture_output=True,
                           text=True)
        with open(os.path.join(d, "api-keys.yaml")) as f:
            after = f.read()
        check(f"gen-certs api-key with scopes {scopes!r}: refused, the key file unchanged",
              p.returncode == 2 and "scopes: a comma-separated list of generate and admin" in
              p.stderr and after == before, p.stderr)
    ok = subprocess.run([GEN_CERTS, "api-key", "y", "generate,admin", "--out", d],
                        capture_output=True, text=True)
    check("gen-certs api-key with scopes generate,admin: made", ok.returncode == 0, ok.stderr)


def utc_now():
    """Now, naive UTC, as not_after's."""
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


def not_after(path):
    """The certificate's end, as openssl prints it parsed to a UTC datetime."""
    out = subprocess.run(["openssl", "x509", "-enddate", "-noout", "-in", path],
                         capture_output=True, text=True, check=True).stdout
    return datetime.datetime.strptime(out.strip().split("=", 1)[1], "%b %d %H:%M:%S %Y %Z")


def check_gen_certs_lifetimes(tmp):
    """The CA outlives the certificates rotated from it (it made them all stop on its 30th day,
    rotated or not); no certificate is issued past the CA's end; a set run again makes its
    expiring certificates anew from the same CA, and refuses once the CA itself ends."""
    d = os.path.join(tmp, "lifetimes")
    gen("--out", d, "--workers", "1")
    ca_days = (not_after(f"{d}/ca.crt") - utc_now()).days
    leaf_days = (not_after(f"{d}/worker-0.crt") - utc_now()).days
    check("gen-certs: the CA lasts 10 years, its certificates 30 days",
          3640 <= ca_days <= 3650 and 29 <= leaf_days <= 30, f"{ca_days} / {leaf_days} days")
    long = subprocess.run([GEN_CERTS, "cert", "worker", "w-long", "--out", d, "--days", "5000"],
                          capture_output=True, text=True)
    check("gen-certs cert --days past the CA's end: cut to the CA's end, and said",
          long.returncode == 0 and not_after(f"{d}/w-long.crt") <= not_after(f"{d}/ca.crt") and
          "lasts" in long.stderr, long.stderr)
    gen("cert", "worker", "w-short", "--out", d, "--days", "1", "--host", "w-short.example")
    again = subprocess.run([GEN_CERTS, "--out", d], capture_output=True, text=True)
    renewed_days = (not_after(f"{d}/w-short.crt") - utc_now()).days
    check("gen-certs run again: a certificate expiring within a day is made again, same names",
          again.returncode == 0 and renewed_days >= 29 and
          "w-short.example" in "".join(san_names(f"{d}/w-short.crt")),
          f"{again.stderr} {renewed_days} days {san_names(f'{d}/w-short.crt')}")
    ending = os.path.join(tmp, "ending-ca")
    subprocess.run([GEN_CERTS, "--out", ending, "--workers", "0", "--ca-days", "1"],
                   capture_output=True, text=True)
    refused = subprocess.run([GEN_CERTS, "--out", ending], capture_output=True, text=True)
    check("gen-certs run again on a set whose CA ends within a day: refused, naming --force",
          refused.returncode == 1 and "--force" in refused.stderr, refused.stderr)


def check_tenants(args, c, certs, ca):
    """A document one key's request cached is no hit for another key's, nor for another salt;
    keys that name one cache_namespace share it (docs/operations.md, "Tenants")."""
    doc = os.path.join(c.tmp, "tenant-doc.txt")
    with open(doc, "w") as f:
        f.write("zq-tenant-marker-5521: the quarterly numbers of the Seine shipping office.\n")
    other_key = gen("api-key", "tenant-b", "generate", "--out", certs).strip()
    twin_key = gen("api-key", "demo-twin", "generate", "--out", certs).strip()
    with open(f"{certs}/api-keys.yaml") as f:
        text = f.read()
    # demo-twin joins demo's namespace (each key's own by default: its name).
    text = text.replace("  - name: demo-twin\n", "  - name: demo-twin\n    cache_namespace: demo\n")
    with open(f"{certs}/api-keys.yaml", "w") as f:
        f.write(text)
    time.sleep(0.5)  # reloaded within 100 ms

    def hits(*key_args, salt=None):
        extra = ["--cache-salt", salt] if salt else []
        p = client(args, c.router, *ca, *key_args, *extra, docs=[doc])
        time.sleep(0.5)  # what it cached reaches kvdir before the next request is routed
        if p.returncode != 0:
            return f"failed: {p.stderr[-200:]}"
        return json.loads(p.stdout)["documents_hit"]

    demo = ["--api-key-file", f"{certs}/demo.key"]
    first = hits(*demo)
    seen = {"other key": hits("--api-key", other_key),
            "same key, another salt": hits(*demo, salt="user-1"),
            "same key again": hits(*demo),
            "a key of the same namespace": hits("--api-key", twin_key),
            "other key again": hits("--api-key", other_key)}
    check("tenants: another key's request does not hit a cached document, nor does another "
          "salt; the same key and a key of its namespace do",
          first == 0 and seen == {"other key": 0, "same key, another salt": 0, "same key again": 1,
                                  "a key of the same namespace": 1, "other key again": 1},
          f"first {first}, then {seen}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(REPO, "build", "bin"))
    args = ap.parse_args()
    os.chdir(REPO)
    with tempfile.TemporaryDirectory() as tmp:
        certs, other = os.path.join(tmp, "certs"), os.path.join(tmp, "other-ca")
        check_gen_certs_arguments(tmp)
        check_gen_certs_lifetimes(tmp)
        check_worker_hosts(tmp)
        gen("--out", certs, "--workers", "2")
        gen("cert", "worker", "worker-evil", "--out", certs)
        gen("--out", other, "--workers", "1")  # a second CA: its worker-0 certificate is foreign
        docs = []
        for i, text in enumerate(["The Seine flows through Paris.", "The Loire is long.",
                                  "The Rhine rises in the Alps."]):
            docs.append(os.path.join(tmp, f"doc{i}.txt"))
            with open(docs[-1], "w") as f:
                f.write(text + "\n")
        c = Cluster(args, tempfile.mkdtemp(dir=tmp), 2, "cache_aware", certs=certs)
        try:
            run_checks(args, c, certs, other, docs)
        finally:
            c.stop()
    finish()


def run_checks(args, c, certs, other, docs):
    r = c.request(docs, "Which river flows through Paris?")
    check("secured cluster answers a RAG request (mTLS router->kvdir, router->worker)",
          r.get("ok") and r.get("worker") in ("worker-0", "worker-1"), str(r)[:300])
    demo = subprocess.run([os.path.join(REPO, "tools", "cluster-demo")], capture_output=True,
                          text=True, timeout=120, env=dict(
                              os.environ, LAZYATTN_ROUTER=c.router, LAZYATTN_BIN_DIR=args.bin_dir,
                              LAZYATTN_CA=f"{certs}/ca.crt",
                              LAZYATTN_API_KEY_FILE=f"{certs}/demo.key"))
    hits = re.search(r"cluster document hit ratio: (\d+)/(\d+)", demo.stdout)
    check("the README's demo requests (tools/cluster-demo) are answered, with document hits",
          demo.returncode == 0 and demo.stdout.count("Q: ") == 4 and hits is not None and
          int(hits.group(1)) > 0, (demo.stdout + demo.stderr)[-300:])

    # Impostor workers.
    start_impostor(c, "no-cert", "worker-9", f"    ca_file: {certs}/ca.crt\n")
    ok, tail = wait_log(c, "no-cert", ("16", "/lazyattn.v1.KvDirectory/Publish: needs a client certificate"))
    check("worker without a certificate: UNAUTHENTICATED from kvdir", ok, tail)
    start_impostor(c, "id-thief", "worker-0",
                   f"    ca_file: {certs}/ca.crt\n    cert_file: {certs}/worker-evil.crt\n"
                   f"    key_file: {certs}/worker-evil.key\n")
    ok, tail = wait_log(c, "id-thief", ("7", "hello.status.worker_id", "worker-0", "is not this caller's id"))
    check("certificate worker-evil claiming worker-0: PERMISSION_DENIED", ok, tail)
    # A valid worker certificate advertising a host it does not name (here a made-up name for
    # worker-0's place): routers could not verify it there, so kvdir refuses the address.
    start_impostor(c, "address-thief", "worker-evil",
                   f"    ca_file: {certs}/ca.crt\n    cert_file: {certs}/worker-evil.crt\n"
                   f"    key_file: {certs}/worker-evil.key\n", advertise="worker-0.lazyattn.test:7200")
    ok, tail = wait_log(c, "address-thief", ("7", "hello.status.address", "worker-0.lazyattn.test",
                                             "is not named by this worker's certificate"))
    check("certificate worker-evil advertising a host it does not name: PERMISSION_DENIED", ok, tail)
    start_impostor(c, "router-cert", "worker-8",
                   f"    ca_file: {certs}/ca.crt\n    cert_file: {certs}/router-0.crt\n"
                   f"    key_file: {certs}/router-0.key\n")
    ok, tail = wait_log(c, "router-cert", ("7", "/lazyattn.v1.KvDirectory/Publish: only worker identities"))
    check("router certificate cannot publish: PERMISSION_DENIED", ok, tail)
    start_impostor(c, "other-ca", "worker-7",
                   f"    ca_file: {certs}/ca.crt\n    cert_file: {other}/worker-0.crt\n"
                   f"    key_file: {other}/worker-0.key\n")
    ok, tail = wait_log(c, "other-ca", "cannot reach kvdir")
    check("certificate from another CA: refused at the handshake", ok, tail)
    # worker-0's own certificate on a second process (one Secret mounted by two pods): the id is
    # the certificate's, but a live worker-0 holds it at another address.
    start_impostor(c, "twin", "worker-0",
                   f"    ca_file: {certs}/ca.crt\n    cert_file: {certs}/worker-0.crt\n"
                   f"    key_file: {certs}/worker-0.key\n")
    ok, tail = wait_log(c, "twin", ("ERROR", "6: hello.status.worker_id",
                                    f"another live worker holds worker id worker-0 at {c.addrs['worker-0']}"))
    check("a second worker-0 with worker-0's certificate: ALREADY_EXISTS, an error naming the holder",
          ok, tail)

    # A directory with a worker's certificate, which names kvdir's hosts too, would serve nobody:
    # workers and routers accept only a lazyattn://kvdir/ certificate (so such a certificate
    # cannot collect the cluster's document announcements either). lazyattn-kvdir refuses it at
    # start, exit status 2. The clients' side, for a server that is not lazyattn-kvdir:
    # service_common_test's AClientReachesOnlyTheCertificateItAsksFor and router_server_test's
    # TheRouterAsksOnlyADirectoryWithKvdirsCertificate.
    p = run_kvdir_as(c, "fake-kvdir", certs, "worker-evil")
    check("a kvdir with a worker's certificate does not start (exit 2, naming file and roles)",
          p.returncode == 2 and all(n in p.stderr for n in (
              f"{certs}/worker-evil.crt", "lazyattn://worker/worker-evil (role worker)",
              "serves as role kvdir")), f"exit {p.returncode}: {p.stderr[-300:]}")

    kvdir = parse_metrics(c.scrape("kvdir"))
    check("kvdir counts only the two real workers",
          kvdir.get(("lazyattn_kvdir_workers_alive", "")) == 2, str(kvdir.get(("lazyattn_kvdir_workers_alive", ""))))
    check("the refused hellos are counted by reason",
          (metric_sum(kvdir, "lazyattn_kvdir_hellos_refused_total", '{reason="not_certificate_id"}') or 0) >= 1 and
          (metric_sum(kvdir, "lazyattn_kvdir_hellos_refused_total", '{reason="worker_id_in_use"}') or 0) >= 1 and
          (metric_sum(kvdir, "lazyattn_kvdir_hellos_refused_total",
                      '{reason="address_not_in_certificate"}') or 0) >= 1)
    served = [c.request(docs[i % 3:] + docs[:i % 3], f"Question {i}?") for i in range(8)]
    check("every request is served by a real worker",
          all(s.get("ok") and s.get("worker") in ("worker-0", "worker-1") for s in served),
          str([s.get("worker", s.get("error", ""))[:80] for s in served]))

    # A worker answers only routers; its health stays open to probes.
    worker0 = c.addrs["worker-0"]
    p = client(args, worker0, "--ca", f"{certs}/ca.crt")
    check("worker refuses a caller without a router certificate (UNAUTHENTICATED)",
          p.returncode != 0 and "code 16" in p.stderr, p.stderr[-200:])
    h = subprocess.run([f"{args.bin_dir}/lazyattn", "health", "--addr", worker0, "--ca",
                        f"{certs}/ca.crt"], capture_output=True, text=True, timeout=30)
    check("worker health is open to a probe without a certificate",
          h.returncode == 0 and "SERVING" in h.stdout, h.stdout + h.stderr)

    # Who may call what, by the certificate presented (raw calls: the CLI presents none).
    kvdir, ca_file = c.addrs["kvdir"], f"{certs}/ca.crt"
    list_workers, status = "/lazyattn.v1.KvDirectory/ListWorkers", "/lazyattn.v1.Worker/Status"
    router_cert = (f"{certs}/router-0.crt", f"{certs}/router-0.key")
    worker_cert = (f"{certs}/worker-1.crt", f"{certs}/worker-1.key")
    foreign_router = (f"{other}/router-0.crt", f"{other}/router-0.key")
    for what, addr, method in (("kvdir ListWorkers", kvdir, list_workers),
                               ("worker-0 Status", worker0, status)):
        code, detail = raw_call(addr, method, ca_file, *router_cert)
        check(f"{what} with the router's certificate: OK (the control)", code == "OK", f"{code} {detail}")
        code, detail = raw_call(addr, method, ca_file, *worker_cert)
        check(f"{what} with a worker's certificate: PERMISSION_DENIED",
              code == "PERMISSION_DENIED" and "router" in detail, f"{code} {detail}")
        code, detail = raw_call(addr, method, ca_file, *foreign_router)
        check(f"{what} with a router certificate from another CA: refused at the handshake "
              "(UNAVAILABLE)", code == "UNAVAILABLE", f"{code} {detail}")
    # Lookup has its own rule; its request's content is the handler's business, so only the
    # refusal (decided before any handler) is checked here.
    code, detail = raw_call(kvdir, "/lazyattn.v1.KvDirectory/Lookup", ca_file, *worker_cert)
    check("kvdir Lookup with a worker's certificate: PERMISSION_DENIED",
          code == "PERMISSION_DENIED" and "only router identities" in detail, f"{code} {detail}")
    code, detail = raw_call(c.router, "/lazyattn.v1.Inference/GetModelInfo", ca_file, *foreign_router)
    check("router: a client certificate (another CA's router certificate) is no key: UNAUTHENTICATED",
          code == "UNAUTHENTICATED", f"{code} {detail}")

    # API keys.
    ca = ["--ca", f"{certs}/ca.crt"]
    p = client(args, c.router, *ca)
    check("client without a key: UNAUTHENTICATED", p.returncode == 1 and "code 16" in p.stderr,
          p.stderr[-200:])
    p = client(args, c.router, *ca, "--api-key", "lzk_not-a-real-key")
    check("client with a wrong key: UNAUTHENTICATED", p.returncode == 1 and "code 16" in p.stderr,
          p.stderr[-200:])
    p = client(args, c.router, "--api-key", "lzk_not-a-real-key")
    check("a key without --ca is refused by the client (never sent in plaintext)",
          p.returncode != 0 and "needs --ca" in p.stderr, p.stderr[-200:])
    temp_key = gen("api-key", "temp", "generate", "--out", certs).strip()
    time.sleep(0.5)  # the router checks the file's mtime every 100 ms
    p = client(args, c.router, *ca, "--api-key", temp_key)
    check("a key added to the file works without a restart", p.returncode == 0, p.stderr[-200:])
    with open(f"{certs}/api-keys.yaml") as f:
        lines = f.read().split("\n")
    i = lines.index("  - name: temp")
    with open(f"{certs}/api-keys.yaml", "w") as f:
        f.write("\n".join(lines[:i] + lines[i + 3:]))
    time.sleep(0.5)
    p = client(args, c.router, *ca, "--api-key", temp_key)
    check("revoked key (removed, reloaded): UNAUTHENTICATED",
          p.returncode == 1 and "code 16" in p.stderr and "revoked" in p.stderr, p.stderr[-200:])
    check_tenants(args, c, certs, ca)
    prefetch = [f"{args.bin_dir}/lazyattn", "prefetch", "--router", c.router, *ca, "--doc", docs[0]]
    p = subprocess.run(prefetch + ["--api-key-file", f"{certs}/demo.key"], capture_output=True,
                       text=True, timeout=60)
    check("Prefetch with a key lacking admin: PERMISSION_DENIED",
          p.returncode == 1 and "code 7" in p.stderr and "admin" in p.stderr, p.stderr[-200:])
    p = subprocess.run(prefetch + ["--api-key-file", f"{certs}/admin.key"], capture_output=True,
                       text=True, timeout=120)
    check("Prefetch with the admin key works", p.returncode == 0 and "workers" in p.stdout,
          (p.stdout + p.stderr)[-200:])
    router = parse_metrics(c.scrape("router"))
    check("the key name is a metrics label",
          router.get(("lazyattn_router_api_key_requests_total", '{key="demo"}'), 0) >= 9 and
          router.get(("lazyattn_router_auth_refused_total", '{reason="unknown_key"}'), 0) >= 2,
          str({k: v for k, v in router.items() if "auth" in k[0] or "api_key" in k[0]}))

    keys = [open(f"{certs}/{n}.key").read().strip() for n in ("demo", "admin")] + [temp_key]
    leaked = [name for name, p in c.procs.items()
              if any(k in open(p.log_path, errors="replace").read() for k in keys)]
    check("no process logs an API key", not leaked, str(leaked))
    # A request whose question and document carry markers, answered; then no log holds either.
    question, doc_text = "Which river? zq-question-marker-4817", "zq-document-marker-9203 The Seine."
    marked_doc = os.path.join(c.tmp, "marked-doc.txt")
    with open(marked_doc, "w") as f:
        f.write(doc_text + "\n")
    r = c.request([marked_doc], question)
    check("a request with a marked question and document is answered", r.get("ok"), str(r)[:200])
    leaked = [name for name, p in c.procs.items()
              if any(m in open(p.log_path, errors="replace").read()
                     for m in ("zq-question-marker", "zq-document-marker"))]
    check("no process logs a question or a document's text", not leaked, str(leaked))


if __name__ == "__main__":
    main()
