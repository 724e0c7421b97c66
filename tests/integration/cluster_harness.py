"""A local cluster for integration tests: real lazyattn-kvdir, lazyattn-worker and lazyattn-router
processes on 127.0.0.1 (ports chosen by the OS, every process serving /metrics on an OS-chosen port),
requests through `lazyattn client`, and the checks' bookkeeping ("[PASS] ..." lines, then
"N passed, M failed").

Process start, logging and stop come from tools/cluster (the launcher users run), so a test sees the
processes exactly as a user of that launcher does.
"""
import importlib.machinery
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
cluster = importlib.machinery.SourceFileLoader("cluster", os.path.join(REPO, "tools", "cluster")).load_module()

MODEL = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf"
# The engine settings cluster_test.py has always used: room for every scenario's documents.
DEFAULT_ENGINE = {"kv_budget_bytes": 16777216, "max_batch_tokens": 256}
results = []


def add_model_args(ap):
    """--model and --backend: what every worker of a test serves, unless the scenario names its own
    model. The defaults are the tiny model on the best backend built in (the CPU one on a machine
    without a GPU); tests/gpu/cluster_tests.sh (`tests/gpu/device.sh clustertests`) runs scenarios
    on CUDA workers with random weights and `--backend cuda` (a backend that cannot start fails the
    test)."""
    ap.add_argument("--model", default=MODEL,
                    help=f"the workers' model.path (default {MODEL}; random:SHAPE for random weights)")
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"),
                    help="the workers' backend (default auto)")


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)


def finish():
    """Prints the tally and exits non-zero when any check failed (or none ran)."""
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed", flush=True)
    sys.exit(0 if results and passed == len(results) else 1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


REFERENCED = ("lazyattn_worker_kv_blocks", '{state="referenced"}')
FREE = ("lazyattn_worker_kv_blocks", '{state="free"}')
CACHED = ("lazyattn_worker_kv_blocks", '{state="cached"}')
QUEUE = ("lazyattn_worker_queue_length", "")
RUNNING = ("lazyattn_worker_running_requests", "")
POOL_ERRORS = "lazyattn_worker_kv_pool_errors_total"


def parse_metrics(text):
    """Prometheus text format -> {(name, labels_text): value}; labels_text is '' or '{k="v",...}'
    exactly as the exposition writes it."""
    out = {}
    for line in text.splitlines():
        m = METRIC_LINE.match(line.strip())
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_sum(metrics, name, labels=""):
    """The sum of `name`'s series in parse_metrics' output whose labels include each of `labels`
    ('' or '{k="v",...}'), or None when none does; so a label added to a family (the router's
    `model`) leaves a selection by the others as it was."""
    want = set(LABEL_PAIR.findall(labels))
    values = [v for (n, l), v in metrics.items()
              if n == name and want <= set(LABEL_PAIR.findall(l))]
    return sum(values) if values else None


class Cluster:
    """kvdir, `workers` workers and a router. `args.bin_dir` holds the four binaries; `engine` is
    the workers' `engine:` section and `router_limits` the router's `limits:` (keys of
    docs/worker.md, docs/router.md); `track_blocks` records each worker's KV block total at start
    for check_workers_sound. `certs`: a tools/gen-certs folder, to run with mutual TLS and API keys
    (requests then use its demo key, or `api_key_file`); None: every process with insecure: true.
    `router_extra`: YAML appended to the router's config (sections no other argument writes)."""

    def __init__(self, args, tmp, workers, policy, kvdir_port=None, lease_ms=600, model=None,
                 engine=None, router_limits=None, track_blocks=False, certs=None, router_extra=""):
        self.args, self.tmp, self.procs, self.addrs = args, tmp, {}, {}
        self.certs = certs
        self.api_key_file = f"{certs}/demo.key" if certs else None
        self.kvdir_port = kvdir_port or free_port()
        self.lease_ms = lease_ms
        engine = dict(DEFAULT_ENGINE if engine is None else engine)
        # Every process serves /metrics on an OS-chosen port, as in a real deployment: a metrics
        # endpoint that cannot start must fail these tests.
        self._write("kvdir.yaml", self._security("kvdir", "server") +
                    f"lease_ms: {lease_ms}\nmetrics:\n  listen: 127.0.0.1:0\n")
        model = model or getattr(args, "model", MODEL)
        backend = getattr(args, "backend", "auto")
        self._write("worker.yaml", f"model:\n  path: {model}\nbackend: {backend}\nengine:\n" +
                    "".join(f"  {k}: {v}\n" for k, v in engine.items()) +
                    "metrics:\n  listen: 127.0.0.1:0\n")
        router = f"routing:\n  policy: {policy}\nkvdir:\n  refresh_interval_ms: 100\n" \
                 "metrics:\n  listen: 127.0.0.1:0\n"
        if certs:
            router += (f"server:\n  tls:\n    cert_file: {certs}/router-0.crt\n"
                       f"    key_file: {certs}/router-0.key\n"
                       f"client_tls:\n  cert_file: {certs}/router-0.crt\n"
                       f"  key_file: {certs}/router-0.key\n  ca_file: {certs}/ca.crt\n"
                       f"auth:\n  api_keys_file: {certs}/api-keys.yaml\n  reload_interval_ms: 100\n")
        else:
            router += "insecure: true\n"
        if router_limits:
            router += "limits:\n" + "".join(f"  {k}: {v}\n" for k, v in router_limits.items())
        router += router_extra  # more top-level sections (e.g. http:)
        self._write("router.yaml", router)
        self.start_kvdir()
        self.workers = [f"worker-{i}" for i in range(workers)]
        for i in range(workers):
            self.start_worker(i)
        self.procs["router"] = cluster.Process("router", [
            f"{args.bin_dir}/lazyattn-router", "--config", f"{tmp}/router.yaml",
            "--listen", "127.0.0.1:0", "--kvdir", self.kvdir_addr], tmp)
        self.router = self.addrs["router"] = self.procs["router"].wait_ready(60)
        self.wait_workers(workers)
        # check_workers_sound compares the block counts at the end with these.
        self.total_blocks = ({name: self.wait_total_blocks(name) for name in self.workers}
                             if track_blocks else {})

    def _security(self, cert, *sections):
        """YAML for mutual TLS with certs/<cert>.* under each of `sections` (worker: server and
        kvdir), or insecure: true without certs."""
        if not self.certs:
            return "insecure: true\n"
        c = self.certs
        return "".join(f"{s}:\n  tls:\n    cert_file: {c}/{cert}.crt\n    key_file: {c}/{cert}.key\n"
                       f"    ca_file: {c}/ca.crt\n" for s in sections)

    def _write(self, name, text):
        with open(os.path.join(self.tmp, name), "w") as f:
            f.write(text)

    @property
    def kvdir_addr(self):
        return f"127.0.0.1:{self.kvdir_port}"

    def start_kvdir(self):
        self.procs["kvdir"] = cluster.Process("kvdir", [
            f"{self.args.bin_dir}/lazyattn-kvdir", "--config", f"{self.tmp}/kvdir.yaml",
            "--listen", self.kvdir_addr], self.tmp)
        self.addrs["kvdir"] = self.procs["kvdir"].wait_ready(60)

    def start_worker(self, i):
        name = f"worker-{i}"
        with open(f"{self.tmp}/worker.yaml") as f:
            base = f.read()
        # worker.yaml has no kvdir: section, so the TLS one is the only one.
        self._write(f"{name}.yaml", self._security(name, "server", "kvdir") + base)
        self.procs[name] = cluster.Process(name, [
            f"{self.args.bin_dir}/lazyattn-worker", "--config", f"{self.tmp}/{name}.yaml",
            "--listen", "127.0.0.1:0", "--kvdir", self.kvdir_addr, "--worker-id", name], self.tmp)
        self.addrs[name] = self.procs[name].wait_ready(60)

    def wait_workers(self, n, timeout=20):
        # The router learns workers from kvdir; a request succeeds once any is known.
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.request([], "hello", max_tokens=1)
            if r.get("ok"):
                return
            time.sleep(0.2)
        raise RuntimeError("router never saw a worker")

    def wait_total_blocks(self, name, timeout=10):
        """free + referenced + cached KV blocks as the worker's /metrics first reports them (the
        engine copies its gauges there every second; 0 until then)."""
        deadline = time.monotonic() + timeout
        while True:
            v = parse_metrics(self.scrape(name))
            total = v.get(FREE, 0) + v.get(REFERENCED, 0) + v.get(CACHED, 0)
            if total > 0 or time.monotonic() > deadline:
                return total
            time.sleep(0.1)

    def request(self, docs, question, max_tokens=4, extra=(), timeout=30):
        """One `lazyattn client --json` call. Returns the Final message's fields plus ok=True, or
        ok=False with the exit status and stderr; `elapsed` (seconds) either way."""
        argv = [f"{self.args.bin_dir}/lazyattn", "client", "--router", self.router, "--prompt", question,
                "--max-tokens", str(max_tokens), "--json", "--timeout", str(timeout), *extra]
        for d in docs:
            argv += ["--doc", d]
        if self.certs:
            argv += ["--ca", f"{self.certs}/ca.crt"]
            if self.api_key_file:
                argv += ["--api-key-file", self.api_key_file]
        start = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=float(timeout) + 30)
        elapsed = time.monotonic() - start
        if p.returncode != 0:
            return {"ok": False, "rc": p.returncode, "error": p.stderr.strip(), "elapsed": elapsed}
        out = json.loads(p.stdout)
        out["ok"] = True
        out["elapsed"] = elapsed
        return out

    def alive(self, name):
        return self.procs[name].proc.poll() is None

    def exit_status(self, name):
        return self.procs[name].proc.poll()

    def log_tail(self, name, chars=400):
        with open(self.procs[name].log_path, errors="replace") as f:
            return f.read()[-chars:]

    def metrics_url(self, name):
        """The /metrics URL the process printed at start ("metrics on http://..."), or None."""
        url = self.procs[name].metrics_url
        if url is None:
            with open(self.procs[name].log_path, errors="replace") as f:
                m = re.search(r"metrics on (http://\S+)", f.read())
            url = m.group(1) if m else None
        if url is not None and not url.endswith("/metrics"):
            url = url.rstrip("/") + "/metrics"
        return url

    def scrape(self, name):
        """The process's /metrics text ("" when it printed no URL)."""
        url = self.metrics_url(name)
        if url is None:
            return ""
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()

    def stop(self):
        for p in reversed(list(self.procs.values())):
            p.stop(5)




def check_workers_sound(c, label, idle_timeout=10.0):
    """The end-of-scenario checks on every worker of `c`, one line each:
      - the process is alive (no request may take a worker down);
      - once idle (no queued or running request), no KV block is referenced: everything a request
        pinned was given back. The engine copies its gauges into /metrics every second, so this
        polls for up to `idle_timeout` seconds;
      - lazyattn_worker_kv_pool_errors_total is exported and 0: the engine never found the block
        pool's invariant (free + cached + referenced = total, no block twice) broken. A worker
        that does not export it fails the check: an absent counter proves nothing."""
    for name in c.workers:
        if not c.alive(name):
            check(f"{label}: {name} is alive", False,
                  f"exited with status {c.exit_status(name)}; log ends: {c.log_tail(name)!r}")
            continue
        check(f"{label}: {name} is alive", True)
        deadline = time.monotonic() + idle_timeout
        values, error = {}, ""
        while True:
            try:
                values, error = parse_metrics(c.scrape(name)), ""
            except OSError as e:
                values, error = {}, str(e)
            idle = (values.get(QUEUE, -1) == 0 and values.get(RUNNING, -1) == 0 and
                    values.get(REFERENCED, -1) == 0)
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        counts = [values.get(k) for k in (FREE, REFERENCED, CACHED)]
        total = sum(counts) if None not in counts else None
        start = c.total_blocks.get(name, 0)
        check(f"{label}: {name} KV blocks free + referenced + cached = total",
              total is not None and total == start > 0, f"{counts} sum to {total}, {start:g} at start")
        check(f"{label}: {name} idle with 0 referenced KV blocks", idle,
              error or f"referenced {values.get(REFERENCED)}, queue {values.get(QUEUE)}, running "
              f"{values.get(RUNNING)}, free {values.get(FREE)}, cached {values.get(CACHED)}")
        errors = [v for (n, _), v in values.items() if n == POOL_ERRORS]
        check(f"{label}: {name} exports {POOL_ERRORS} and it is 0",
              bool(errors) and sum(errors) == 0,
              f"{sum(errors):g}" if errors else "metric absent from /metrics")
