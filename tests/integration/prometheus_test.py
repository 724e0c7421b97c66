#!/usr/bin/env python3
"""Debian's Prometheus scrapes a local cluster (kvdir, two CPU workers, a router: real processes on
127.0.0.1, started as tools/cluster starts them) while a short trace runs, and then:

  - every target is up, and every process exports process_* and lazyattn_build_info;
  - every expression of the Grafana dashboard (deploy/grafana/dashboards/*.json, Grafana's
    $__rate_interval / $__range / $__interval replaced by fixed windows) evaluates without error
    through the HTTP API and returns no +Inf or -Inf, before and after the traffic;
  - every rule of deploy/prometheus/rules/*.yml is loaded, evaluates with health "ok", and its
    expression evaluates without error through the HTTP API;
  - the document hit ratio from PromQL equals the client's own figure (sum of documents_hit /
    documents over the trace; the trace's documents all have the same token count, so the count
    ratio is the token ratio) within 0.01;
  - the TTFT median from PromQL (histogram_quantile over the trace's bucket increments, taken
    with the @ modifier) lies within the histogram bucket that holds the client's median TTFT
    (the median of the ttft_ms each response reported): histogram_quantile interpolates inside a
    bucket, so one bucket is the tolerance (the tiny model's TTFTs are a few ms, where the buckets
    are 1-5 and 5-10 ms);
  - the router answers with the client's x-request-id in initial metadata, and writes one access
    line per request carrying it.

Nothing is skipped: without a prometheus binary (apt install prometheus; tools/setup-deps) the
test fails.
"""
import argparse
import bisect
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_harness as h  # noqa: E402

# Bucket bounds of lazyattn_worker_ttft_seconds (services/worker/server/worker_metrics.cc).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
                0.75, 1, 1.5, 2, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560]
WORDS = ["river", "stone", "cloud", "maple", "copper", "harbor", "violet", "lantern", "meadow",
         "falcon", "orchard", "glacier"]


def documents(n):
    """n documents of identical token count: the same words in different orders (the byte-level
    BPE pre-tokenizer splits at each " word", so each word tokenizes alike in any position)."""
    docs = []
    for k in range(n):
        rotated = WORDS[k:] + WORDS[:k]
        docs.append("Notes " + " ".join(rotated * 3) + ".")
    return docs


class Prometheus:
    def __init__(self, binary, tmp, config):
        self.port = h.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(tmp, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp}/prometheus-data",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"prometheus did not become ready (exit {self.proc.poll()}); "
                           f"see {tmp}/prometheus.log")

    def api(self, path, **params):
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:  # 400/422 carry the error as JSON
            return json.load(e)

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)

    def scalar(self, expr):
        r = self.query(expr)
        if r.get("status") != "success" or not r["data"]["result"]:
            return None
        return float(r["data"]["result"][0]["value"][1])

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def dashboard_expressions():
    out = []
    for path in sorted(glob.glob(os.path.join(h.REPO, "deploy/grafana/dashboards/*.json"))):
        with open(path) as f:
            d = json.load(f)
        panels = list(d.get("panels", []))
        for p in list(panels):
            panels += p.get("panels", [])  # collapsed rows hold their panels
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    expr = (t["expr"].replace("$__rate_interval", "1m").replace("$__range", "5m")
                            .replace("$__interval", "15s"))
                    out.append((f"{os.path.basename(path)}: {p.get('title')} [{t.get('refId')}]",
                                expr))
    return out


def rule_expressions():
    out = []
    for path in sorted(glob.glob(os.path.join(h.REPO, "deploy/prometheus/rules/*.yml"))):
        with open(path) as f:
            for g in (yaml.safe_load(f) or {}).get("groups", []):
                for r in g.get("rules", []):
                    out.append((f"{os.path.basename(path)}: {r.get('alert') or r.get('record')}",
                                r["expr"]))
    return out


def has_infinity(result):
    data = result.get("data", {})
    if data.get("resultType") == "scalar":
        return data["result"][1] in ("+Inf", "-Inf")
    for s in data.get("result", []):
        values = [s["value"]] if "value" in s else s.get("values", [])
        if any(v[1] in ("+Inf", "-Inf") for v in values):
            return True
    return False


def check_expressions(prom, label, exprs):
    bad = []
    for name, expr in exprs:
        r = prom.query(expr)
        if r.get("status") != "success":
            bad.append(f"{name}: {r.get('error')}")
        elif has_infinity(r):
            bad.append(f"{name}: returns an infinity")
    h.check(f"{label}: {len(exprs)} expressions evaluate without error or infinity", not bad and exprs,
            "; ".join(bad) if bad else ("none found" if not exprs else ""))


def encode_varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def check_request_id(c):
    """Generate with x-request-id: the router echoes it in initial metadata and logs it."""
    import grpc  # python3-grpcio
    question = b"What is in the notes?"
    sampling = b"\x28" + encode_varint(2)  # SamplingParams.max_tokens = 2
    request = (b"\x1a" + encode_varint(len(question)) + question +
               b"\x2a" + encode_varint(len(sampling)) + sampling)
    with grpc.insecure_channel(c.router) as channel:
        call = channel.unary_stream("/lazyattn.v1.Inference/Generate",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)(
            request, metadata=(("x-request-id", "prom-test-4711"),), timeout=30)
        initial = dict(call.initial_metadata())
        messages = list(call)
    h.check("the router returns the client's x-request-id in initial metadata",
            initial.get("x-request-id") == "prom-test-4711" and messages,
            f"initial metadata {initial}, {len(messages)} messages")
    deadline = time.monotonic() + 5
    line = ""
    while time.monotonic() < deadline and not line:
        with open(c.procs["router"].log_path, errors="replace") as f:
            line = next((l for l in f if "request_id=prom-test-4711" in l), "")
        time.sleep(0.1)
    h.check("the router's access log has one line with that request id, its status, worker, "
            "attempts, TTFT and tokens",
            all(k in line for k in ("status=ok", "worker=worker-", "attempts=1", "ttft_s=",
                                    "tokens=")) and "What is in the notes" not in line,
            line.strip() or "no line")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--prometheus", default=shutil.which("prometheus"))
    args = ap.parse_args()
    if not args.prometheus:
        h.check("a prometheus binary is installed (apt install prometheus; tools/setup-deps)", False)
        h.finish()
    tmp = tempfile.mkdtemp(prefix="lazyattn-prometheus-")
    print(f"work folder {tmp}", flush=True)
    c = h.Cluster(args, tmp, workers=2, policy="cache_aware")
    prom = None
    try:
        targets = {name: urllib.parse.urlparse(c.metrics_url(name)).netloc
                   for name in ["kvdir", "router"] + c.workers}
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [os.path.join(h.REPO, "deploy/prometheus/rules/*.yml")],
            "scrape_configs": [
                {"job_name": "lazyattn-kvdir", "static_configs": [
                    {"targets": [targets["kvdir"]],
                     "labels": {"component": "kvdir", "instance": "kvdir"}}]},
                {"job_name": "lazyattn-router", "static_configs": [
                    {"targets": [targets["router"]],
                     "labels": {"component": "router", "instance": "router"}}]},
                {"job_name": "lazyattn-worker", "static_configs": [
                    {"targets": [targets[w]],
                     "labels": {"component": "worker", "instance": w, "worker": w}}
                    for w in c.workers]},
            ]}
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            yaml.safe_dump(config, f)
        prom = Prometheus(args.prometheus, tmp, os.path.join(tmp, "prometheus.yml"))

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            active = prom.api("targets")["data"]["activeTargets"]
            if len(active) == len(targets) and all(t["health"] == "up" for t in active):
                break
            time.sleep(0.5)
        h.check("every process is scraped and up", len(active) == len(targets) and
                all(t["health"] == "up" for t in active),
                ", ".join(f"{t['labels'].get('instance')}: {t['health']} {t['lastError']}"
                          for t in active))
        for metric in ("process_resident_memory_bytes", "process_cpu_seconds_total",
                       "process_open_fds", "process_start_time_seconds", "lazyattn_build_info"):
            n = prom.scalar(f"count({metric})")
            h.check(f"every process exports {metric}", n == len(targets), f"{n} of {len(targets)}")

        check_expressions(prom, "dashboard before traffic", dashboard_expressions())

        # The trace. The settle wait lets the warm-up requests' metrics reach Prometheus, so that
        # `before` (a timestamp) separates them from the trace's.
        time.sleep(3)
        before = time.time()
        time.sleep(1.5)
        docs = []  # `lazyattn client --doc` reads a file
        for k, text in enumerate(documents(6)):
            docs.append(os.path.join(tmp, f"doc-{k}.txt"))
            with open(docs[-1], "w") as f:
                f.write(text)
        order = [0, 1, 0, 2, 0, 1, 3, 0, 1, 2, 4, 0, 1, 0, 5, 2, 0, 1, 3, 0]
        results = []
        for i, k in enumerate(order):
            pair = [docs[k], docs[(k + 1) % len(docs)]]
            r = c.request(pair, f"Question {i}: which word comes first?", max_tokens=4)
            results.append(r)
        ok = [r for r in results if r.get("ok")]
        h.check(f"the trace's {len(results)} requests are answered", len(ok) == len(results),
                "; ".join(r.get("error", "") for r in results if not r.get("ok"))[:400])
        time.sleep(2.5)  # the workers copy engine counters into /metrics every second

        # Wait until Prometheus holds what the workers now export.
        direct = {}
        for w in c.workers:
            for key, v in h.parse_metrics(c.scrape(w)).items():
                direct[key] = direct.get(key, 0) + v
        want_lookup = sum(v for (n, _), v in direct.items()
                          if n == "lazyattn_worker_document_lookup_tokens_total")
        deadline = time.monotonic() + 20
        got = None
        while time.monotonic() < deadline:
            got = prom.scalar("sum(lazyattn_worker_document_lookup_tokens_total)")
            if got == want_lookup:
                break
            time.sleep(0.5)
        h.check("Prometheus caught up with the workers' document lookup counters",
                got == want_lookup and want_lookup > 0, f"{got} vs {want_lookup}")

        client_docs = sum(r["documents"] for r in ok)
        client_hits = sum(r["documents_hit"] for r in ok)
        client_ratio = client_hits / client_docs if client_docs else float("nan")
        prom_ratio = prom.scalar("sum(lazyattn_worker_document_hit_tokens_total) / "
                                 "(sum(lazyattn_worker_document_lookup_tokens_total) > 0)")
        h.check("document hit ratio: PromQL equals the client's within 0.01",
                prom_ratio is not None and abs(prom_ratio - client_ratio) <= 0.01,
                f"PromQL {prom_ratio}, client {client_hits}/{client_docs} = {client_ratio:.4f}")

        ttfts = sorted(r["ttft_ms"] / 1000 for r in ok)
        if not ttfts:
            h.check("TTFT median: no answered request to compare", False)
            h.finish()
        client_median = statistics.median(ttfts)
        n = len(ttfts)
        low, high = ttfts[(n - 1) // 2], ttfts[n // 2]  # the middle value(s)
        lo_edge = ([0] + TTFT_BUCKETS)[bisect.bisect_left(TTFT_BUCKETS, low)]
        hi_edge = (TTFT_BUCKETS + [float("inf")])[bisect.bisect_left(TTFT_BUCKETS, high)]
        prom_median = prom.scalar(
            "histogram_quantile(0.5, sum by (le) (lazyattn_worker_ttft_seconds_bucket) - "
            f"sum by (le) (lazyattn_worker_ttft_seconds_bucket @ {before:.3f}))")
        h.check("TTFT median: PromQL lies in the bucket of the client's median",
                prom_median is not None and lo_edge <= prom_median <= hi_edge,
                f"PromQL {prom_median}, client {client_median:.4f} s, bucket [{lo_edge}, {hi_edge}]")
        trace_count = prom.scalar("sum(lazyattn_worker_ttft_seconds_count) - "
                                  f"sum(lazyattn_worker_ttft_seconds_count @ {before:.3f})")
        h.check("the TTFT histogram counted each of the trace's requests once",
                trace_count == len(ok), f"{trace_count} vs {len(ok)}")
        router_count = prom.scalar("sum(lazyattn_router_ttft_seconds_count) - "
                                   f"sum(lazyattn_router_ttft_seconds_count @ {before:.3f})")
        h.check("the router's TTFT histogram counted each of them once", router_count == len(ok),
                f"{router_count} vs {len(ok)}")
        in_flight = prom.scalar("sum(lazyattn_router_in_flight_requests)")
        h.check("the router has no request in flight afterwards", in_flight == 0, f"{in_flight}")

        check_expressions(prom, "dashboard after traffic", dashboard_expressions())
        rules = rule_expressions()
        check_expressions(prom, "alert and recording rules (deploy/prometheus/rules)", rules)
        groups = prom.api("rules")["data"]["groups"]
        loaded = [r for g in groups for r in g["rules"]]
        unhealthy = [f"{r['name']}: {r.get('lastError')}" for r in loaded if r["health"] != "ok"]
        h.check("Prometheus loaded every rule and evaluates each with health ok",
                len(loaded) == len(rules) and not unhealthy,
                f"{len(loaded)} loaded of {len(rules)}; " + "; ".join(unhealthy))

        check_request_id(c)
    finally:
        if prom is not None:
            prom.stop()
        c.stop()
    h.finish()


if __name__ == "__main__":
    main()
