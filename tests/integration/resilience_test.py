#!/usr/bin/env python3
"""Resilience: a local cluster (kvdir, 3 workers, router on 127.0.0.1, tiny model) keeps answering
while workers freeze, drain and restart (docs/router.md "Health probing and ejection", "First-token
timeout"; docs/worker.md "Graceful drain").

Scenarios, in order, on one cluster, each under steady load (`--clients` threads, each sending
`lazyattn client` requests back to back with documents from a small shared pool):

  leave     no load; one request caches a fresh document on some worker; SIGTERM to that worker:
            the directory stops tracking the document well before the worker's kvdir lease could
            have run out (it withdrew its documents), the worker exits 0, and a request naming
            the document right after is answered by another worker.
  freeze    SIGSTOP one of the three workers: the router's health probes eject it and the
            first-token timeout moves requests that reached it; measured: how long after the
            freeze the router still sent it an attempt (lazyattn_router_worker_selections_total,
            scraped every 100 ms; must be <= 5 s) and the longest wait of a request started after
            the freeze (must be <= the first-token timeout plus the longest wait before the
            freeze plus 2 s of scheduling slack on a loaded machine). Every request started after
            the freeze is answered. SIGCONT: a successful probe re-admits it and it gets requests
            again.
  rolling   SIGTERM (SIGHUP to every other one), wait for the exit, restart, for every worker in
            turn, under load: zero requests lost (every one answered), every one drains and
            exits 0.
  kvdir-freeze  SIGSTOP kvdir for 12 s (past the lease and the router's forget_after, 10 s), then
            SIGCONT, under load (docs/kvdir.md, stalls of kvdir itself): kvdir expires no lease
            (its heartbeats were unread, not missing), logs the stall once, and every request
            started during the freeze or in the 3 s after it is answered (the router never sees
            an empty worker list).

  python3 tests/integration/resilience_test.py [--bin-dir build/bin]
Prints one line per check (with the measured numbers) and "N passed, M failed" last.
"""
import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_harness as h  # noqa: E402

FIRST_TOKEN_TIMEOUT_S = 2.0
LEASE_MS = 6000  # long, so that "left the directory" cannot be the lease running out
ROUTER_EXTRA = {
    "routing": {"first_token_timeout_ms": int(FIRST_TOKEN_TIMEOUT_S * 1000), "max_attempts": 3},
    "health_check": {"interval_ms": 200, "timeout_ms": 300, "unhealthy_threshold": 2,
                     "base_ejection_ms": 1000, "max_ejection_ms": 10000},
}
WORKER_EXTRA = {"server": {"drain_timeout_s": 20}}
DOC_TEXTS = [f"Document {i}: the {w} lies north of the {v}." for i, (w, v) in enumerate(
    [("river", "city"), ("lake", "forest"), ("tower", "bridge"), ("harbor", "island"),
     ("meadow", "canyon"), ("glacier", "desert")])]
DOCS = []  # their files (`lazyattn client --doc` reads a file), written by main()


def write_doc(tmp, name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text + "\n")
    return path


def insecure_needed(bin_dir):
    """Whether these binaries refuse plaintext without `insecure: true` (they print the key in
    their own error message, so it is in the binary) and the harness does not write it itself."""
    if hasattr(h.Cluster, "_security"):
        return False
    try:
        with open(os.path.join(bin_dir, "lazyattn-worker"), "rb") as f:
            return b"or insecure: true" in f.read()
    except OSError:
        return False


class ResilienceCluster(h.Cluster):
    """The shared harness's cluster with this test's router and worker keys added."""

    def __init__(self, args, tmp, **kw):
        self.insecure = insecure_needed(args.bin_dir)
        super().__init__(args, tmp, **kw)

    def _write(self, name, text):
        extra = {"router.yaml": ROUTER_EXTRA, "worker.yaml": WORKER_EXTRA}.get(name, {})
        for section, keys in extra.items():
            lines = "".join(f"  {k}: {v}\n" for k, v in keys.items())
            if f"{section}:\n" in text:
                text = text.replace(f"{section}:\n", f"{section}:\n{lines}", 1)
            else:
                text += f"{section}:\n{lines}"
        if self.insecure and "insecure:" not in text:
            text += "insecure: true\n"
        super()._write(name, text)

    def router_value(self, name, labels=""):
        try:
            return h.metric_sum(h.parse_metrics(self.scrape("router")), name, labels) or 0.0
        except OSError:
            return None

    def kvdir_value(self, name):
        try:
            return h.parse_metrics(self.scrape("kvdir")).get((name, ""), None)
        except OSError:
            return None


class Load:
    """`clients` threads sending requests back to back until stop(); every request's start and
    end (monotonic), outcome and serving worker are kept."""

    def __init__(self, c, clients, seed):
        self.c, self.done, self.lock = c, [], threading.Lock()
        self.stopping = threading.Event()
        self.rng = random.Random(seed)
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self, i):
        rng = random.Random(self.rng.random())
        n = 0
        while not self.stopping.is_set():
            docs = rng.sample(DOCS, rng.randint(0, 2))
            start = time.monotonic()
            r = self.c.request(docs, f"Question {i}.{n}: where is it?", max_tokens=6, timeout=40)
            n += 1
            with self.lock:
                self.done.append((start, time.monotonic(), r))

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(120)

    def since(self, t0):
        with self.lock:
            return [d for d in self.done if d[0] >= t0]


class SelectionSampler:
    """Scrapes the router's per-worker selection counter every 100 ms."""

    def __init__(self, c, worker):
        self.c, self.labels, self.samples = c, f'{{worker="{worker}"}}', []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping.is_set():
            v = self.c.router_value("lazyattn_router_worker_selections_total", self.labels)
            if v is not None:
                self.samples.append((time.monotonic(), v))
            time.sleep(0.1)

    def stop(self):
        self.stopping.set()
        self.thread.join(10)

    def last_increase_after(self, t0):
        """Monotonic time of the last sample, after t0, where the counter had grown (None: never)."""
        last, prev = None, None
        for t, v in self.samples:
            if prev is not None and v > prev and t >= t0:
                last = t
            prev = v
        return last

    def first_increase_after(self, t0):
        prev = None
        for t, v in self.samples:
            if prev is not None and v > prev and t >= t0:
                return t
            prev = v
        return None


def scenario_leave(c):
    doc = write_doc(c.tmp, "fresh.txt",
                    f"A fresh document {random.random()}: the archive sits east of the old harbor.")
    r = c.request([doc], "Where is the archive?", max_tokens=2)
    h.check("leave: request with a fresh document answered", r.get("ok"), str(r)[:300])
    if not r.get("ok"):
        return
    name = r["worker"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (c.kvdir_value("lazyattn_kvdir_documents_tracked") or 0) < 1:
        time.sleep(0.1)
    before = c.kvdir_value("lazyattn_kvdir_documents_tracked") or 0
    t0 = time.monotonic()
    c.procs[name].proc.send_signal(signal.SIGTERM)
    gone_at = None
    while time.monotonic() - t0 < LEASE_MS / 1000 - 1:
        v = c.kvdir_value("lazyattn_kvdir_documents_tracked")
        if v is not None and v < before:
            gone_at = time.monotonic() - t0
            break
        time.sleep(0.05)
    h.check("leave: the drained worker's documents left the directory before its lease ran out",
            gone_at is not None,
            f"{before:g} tracked before SIGTERM; gone after {gone_at:.2f} s" if gone_at is not None
            else f"still tracked {LEASE_MS / 1000 - 1:.0f} s after SIGTERM (lease {LEASE_MS} ms)")
    r2 = c.request([doc], "Where is the archive?", max_tokens=2)
    h.check("leave: the same document right after is answered by another worker",
            r2.get("ok") and r2.get("worker") != name, str(r2)[:300])
    try:
        rc = c.procs[name].proc.wait(30)
    except Exception as e:  # noqa: BLE001
        rc = repr(e)
    h.check(f"leave: {name} drained and exited 0", rc == 0 and "draining" in c.log_tail(name, 4000),
            f"exit {rc}; log ends {c.log_tail(name, 300)!r}")
    c.start_worker(int(name.split("-")[1]))
    c.procs["kvdir"].wait_workers_alive(3, 30)


def scenario_freeze(c, args):
    victim = "worker-1"
    sampler = SelectionSampler(c, victim)
    load = Load(c, args.clients, seed=1)
    time.sleep(3)
    warm = load.since(0)
    normal_wait = max((e - s for s, e, r in warm if r.get("ok")), default=1.0)
    ejections_before = c.router_value("lazyattn_router_worker_ejections_total") or 0
    pid = c.procs[victim].proc.pid
    t_freeze = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    time.sleep(10)
    last = sampler.last_increase_after(t_freeze)
    routed_for = 0.0 if last is None else last - t_freeze
    after = load.since(t_freeze)
    finished = [d for d in after if d[1] <= time.monotonic()]
    os.kill(pid, signal.SIGCONT)
    t_thaw = time.monotonic()
    deadline = t_thaw + 15
    readmitted = None
    while time.monotonic() < deadline:
        readmitted = sampler.first_increase_after(t_thaw)
        if readmitted is not None:
            break
        time.sleep(0.2)
    load.stop()
    sampler.stop()
    after = [d for d in load.since(t_freeze) if d[0] <= t_thaw]
    failed = [r for s, e, r in after if not r.get("ok")]
    longest = max((e - s for s, e, r in after), default=0.0)
    bound = FIRST_TOKEN_TIMEOUT_S + normal_wait + 2.0
    timeouts = c.router_value("lazyattn_router_first_token_timeouts_total")
    ejections = (c.router_value("lazyattn_router_worker_ejections_total") or 0) - ejections_before
    h.check("freeze: no new request routed to the frozen worker after <= 5 s", routed_for <= 5.0,
            f"last attempt sent to {victim} {routed_for:.2f} s after SIGSTOP")
    h.check("freeze: every request started while it was frozen was answered",
            after and not failed,
            f"{len(after)} requests, {len(failed)} failed" +
            (f": {failed[0].get('error', '')[:300]}" if failed else ""))
    h.check("freeze: longest wait <= first-token timeout + normal service time + 2 s", longest <= bound,
            f"longest {longest:.2f} s, bound {bound:.2f} s (first-token timeout "
            f"{FIRST_TOKEN_TIMEOUT_S:g} s, longest before the freeze {normal_wait:.2f} s); "
            f"{len(finished)} done within the frozen window; {timeouts:g} first-token timeouts")
    h.check("freeze: the router ejected the frozen worker (health probes)", ejections >= 1,
            f"{ejections:g} ejections; router log: "
            f"{[l for l in c.log_tail('router', 20000).splitlines() if 'ejected' in l][-1:]}")
    h.check("freeze: after SIGCONT a probe re-admits it and it gets requests again",
            readmitted is not None,
            f"first attempt {readmitted - t_thaw:.2f} s after SIGCONT" if readmitted else
            "no attempt within 15 s")


def scenario_rolling(c, args):
    load = Load(c, args.clients, seed=2)
    time.sleep(2)
    t0 = time.monotonic()
    exits = {}
    drained = {}
    signals = {}
    for i, name in enumerate(c.workers):
        # Every other worker gets SIGHUP (a closed terminal), which must drain the same way.
        signals[name] = signal.SIGHUP if i % 2 else signal.SIGTERM
        c.procs[name].proc.send_signal(signals[name])
        try:
            exits[name] = c.procs[name].proc.wait(30)
        except Exception as e:  # noqa: BLE001
            exits[name] = repr(e)
        drained[name] = "draining" in c.log_tail(name, 4000)
        c.start_worker(i)
        c.procs["kvdir"].wait_workers_alive(3, 30)
        time.sleep(1.5)  # the router learns the new address and probes it
    load.stop()
    during = load.since(t0)
    lost = [r for s, e, r in during if not r.get("ok")]
    h.check("rolling: every worker drained and exited 0 on SIGTERM or SIGHUP",
            all(v == 0 for v in exits.values()) and all(drained.values()),
            ", ".join(f"{n} {signals[n].name}: exit {exits[n]}, "
                      f"{'drained' if drained[n] else 'no drain in its log'}" for n in exits))
    h.check("rolling: a rolling restart of every worker under load loses zero requests",
            during and not lost,
            f"{len(during)} requests during the restart, {len(lost)} lost" +
            (f": {lost[0].get('error', '')[:300]}" if lost else "") +
            f"; {c.router_value('lazyattn_router_retries_total'):g} retries")


def scenario_kvdir_freeze(c, args):
    load = Load(c, args.clients, seed=3)
    time.sleep(1)
    expired_before = c.kvdir_value("lazyattn_kvdir_leases_expired_total") or 0
    pid = c.procs["kvdir"].proc.pid
    t_freeze = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    time.sleep(12)
    os.kill(pid, signal.SIGCONT)
    t_thaw = time.monotonic()
    time.sleep(3)
    load.stop()
    during = load.since(t_freeze)
    failed = [r for s, e, r in during if not r.get("ok")]
    after = [d for d in during if d[0] >= t_thaw]
    expired = (c.kvdir_value("lazyattn_kvdir_leases_expired_total") or 0) - expired_before
    stall_lines = [l for l in c.log_tail("kvdir", 20000).splitlines() if "did not run" in l]
    h.check("kvdir-freeze: no lease expired when kvdir resumed (heartbeats unread, not missing)",
            expired == 0 and len(stall_lines) == 1,
            f"{expired:g} leases expired; stall warnings: {stall_lines[-1:]}")
    h.check("kvdir-freeze: every request during the freeze and the 3 s after it was answered",
            during and after and not failed,
            f"{len(during)} requests ({len(after)} after SIGCONT), {len(failed)} failed" +
            (f": {failed[0].get('error', '')[:300]}" if failed else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default="build/bin")
    h.add_model_args(ap)
    ap.add_argument("--clients", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lazyattn-resilience-") as tmp:
        DOCS.extend(write_doc(tmp, f"doc{i}.txt", t) for i, t in enumerate(DOC_TEXTS))
        c = ResilienceCluster(args, tmp, workers=3, policy="cache_aware", lease_ms=LEASE_MS,
                              track_blocks=True)
        try:
            c.procs["kvdir"].wait_workers_alive(3, 30)
            scenario_leave(c)
            scenario_freeze(c, args)
            scenario_rolling(c, args)
            scenario_kvdir_freeze(c, args)
            h.check_workers_sound(c, "end")
        finally:
            for name in c.workers:
                p = c.procs[name].proc
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
            if c.procs["kvdir"].proc.poll() is None:
                os.kill(c.procs["kvdir"].proc.pid, signal.SIGCONT)
            c.stop()
            if not all(h.results):
                for name in ("router", *c.workers):
                    print(f"--- {name} log tail:\n{c.log_tail(name, 1500)}")
    h.finish()


if __name__ == "__main__":
    main()
