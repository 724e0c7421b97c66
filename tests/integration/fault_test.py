#!/usr/bin/env python3
"""Fault containment on real processes (kvdir, workers and a router on 127.0.0.1, tiny model, CPU):
sick workers take themselves out, and a query of death costs at most two workers
(docs/worker.md "Stopping to serve", docs/router.md "Failures").

Two clusters, one after the other:

  sick     three workers: worker-0 gets a sticky device error at its first step
           (testing.sticky_error_after: 0), worker-2 fails every step with
           engine.max_consecutive_step_failures: 1 (testing.fail_steps_after: 0), worker-1 is
           healthy. Under load every client request is answered (by worker-1: the sick workers
           answer UNAVAILABLE before any token, and the router fails over); each sick worker turns
           itself NOT_SERVING once (one log line, lazyattn_worker_serving 0, its failed step
           counted), leaves kvdir (only worker-1 stays alive there), and gets no attempt at all
           once it said so.
  poison   three workers with testing.abort_on_prompt_marker. A request carrying the marker kills
           the worker it reaches and then the next one; the router then quarantines its content:
           the request ends FAILED_PRECONDITION ("quarantined") instead of killing the third.
           Later requests with the same content are refused at once while ordinary ones keep
           being answered; the router logs one line naming the fingerprint, never the prompt. Then
           the dead workers are restarted and an ordinary crash (SIGKILL of the worker holding a
           normal request before its first token) still fails over, and quarantines nothing.

  python3 tests/integration/fault_test.py [--bin-dir build/bin]
Prints one line per check and "N passed, M failed" last.
"""
import argparse
import os
import re
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_harness as h  # noqa: E402

MARKER = "POISON-PILL-7f3a"
ROUTER_EXTRA = {
    "routing": {"max_attempts": 3, "first_token_timeout_ms": 20000},
    "health_check": {"interval_ms": 200, "timeout_ms": 300, "unhealthy_threshold": 2,
                     "base_ejection_ms": 1000, "max_ejection_ms": 10000},
}
DOC_TEXTS = [f"Document {i}: the {w} lies north of the {v}." for i, (w, v) in enumerate(
    [("river", "city"), ("lake", "forest"), ("tower", "bridge"), ("harbor", "island")])]


class FaultCluster(h.Cluster):
    """The shared harness's cluster with this test's router keys and per-worker sections:
    `per_worker` maps a worker index to {section: {key: value}} added to its YAML."""

    def __init__(self, args, tmp, per_worker, **kw):
        self.per_worker = per_worker
        super().__init__(args, tmp, **kw)

    @staticmethod
    def _add(text, extra):
        for section, keys in extra.items():
            lines = "".join(f"  {k}: {v}\n" for k, v in keys.items())
            if f"\n{section}:\n" in "\n" + text:
                text = ("\n" + text).replace(f"\n{section}:\n", f"\n{section}:\n{lines}", 1)[1:]
            else:
                text += f"{section}:\n{lines}"
        return text

    def _write(self, name, text):
        if name == "router.yaml":
            text = self._add(text, ROUTER_EXTRA)
        m = re.fullmatch(r"worker-(\d+)\.yaml", name)
        if m and int(m.group(1)) in self.per_worker:
            text = self._add(text, self.per_worker[int(m.group(1))])
        super()._write(name, text)

    def metric(self, name, key, labels=""):
        try:
            return h.metric_sum(h.parse_metrics(self.scrape(name)), key, labels)
        except OSError:
            return None

    def selections(self, worker):
        return self.metric("router", "lazyattn_router_worker_selections_total",
                           f'{{worker="{worker}"}}') or 0.0

    def log(self, name):
        with open(self.procs[name].log_path, errors="replace") as f:
            return f.read()


def write_doc(tmp, name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text + "\n")
    return path


def run_load(c, docs, clients, per_client, tag):
    """`clients` threads, each sending `per_client` requests back to back; returns the results."""
    results, lock = [], threading.Lock()

    def one(i):
        for n in range(per_client):
            r = c.request([docs[(i + n) % len(docs)]] if (i + n) % 3 else [],
                          f"{tag} question {i}.{n}: where is it?", max_tokens=4, timeout=40)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return results


def wait_for(predicate, timeout, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def scenario_sick(args, tmp, docs):
    sick = {0: ("sticky device error", {"testing": {"sticky_error_after": 0}}),
            2: ("a failed step", {"testing": {"fail_steps_after": 0},
                                  "engine": {"max_consecutive_step_failures": 1}})}
    c = FaultCluster(args, tmp, {i: extra for i, (_, extra) in sick.items()}, workers=3,
                     policy="cache_aware")
    try:
        for i in sick:
            h.check(f"sick: worker-{i} warned loudly at start that fault injection is on",
                    "FAULT INJECTION IS ON" in c.log(f"worker-{i}"))
        h.check("sick: the healthy worker has no fault-injection warning",
                "FAULT INJECTION" not in c.log("worker-1"))
        # Idle workers share document-less requests in turn: each sick one gets some.
        results = [c.request([], f"warm-up {i}: hello?", max_tokens=2) for i in range(6)]
        results += run_load(c, docs, clients=3, per_client=8, tag="sick")
        failed = [r for r in results if not r.get("ok")]
        h.check("sick: every client request is answered while two of three workers fail",
                results and not failed,
                f"{len(results)} requests, {len(failed)} failed" +
                (f": {failed[0].get('error', '')[:300]}" if failed else ""))
        for i, (why, _) in sick.items():
            name = f"worker-{i}"
            served = wait_for(lambda: c.metric(name, "lazyattn_worker_serving") == 0, 5)
            h.check(f"sick: {name} reports lazyattn_worker_serving 0", served,
                    f"lazyattn_worker_serving {c.metric(name, 'lazyattn_worker_serving')}")
            failures = c.metric(name, "lazyattn_worker_step_failures_total") or 0
            h.check(f"sick: {name} counted its failed step", failures >= 1,
                    f"lazyattn_worker_step_failures_total {failures:g}")
            log = c.log(name)
            lines = [l for l in log.splitlines() if "NOT_SERVING" in l]
            h.check(f"sick: {name} logged NOT_SERVING once, saying why ({why})",
                    len(lines) == 1 and why in lines[0], f"{lines}")
            h.check(f"sick: {name} is still running (a sick worker is not a crashed one)",
                    c.alive(name), f"exit {c.exit_status(name)}")
        h.check("sick: the healthy worker serves and failed no step",
                c.metric("worker-1", "lazyattn_worker_serving") == 1 and
                (c.metric("worker-1", "lazyattn_worker_step_failures_total") or 0) == 0)
        alive = wait_for(lambda: c.metric("kvdir", "lazyattn_kvdir_workers_alive") == 1, 5)
        h.check("sick: the sick workers left kvdir (only the healthy one is alive there)", alive,
                f"lazyattn_kvdir_workers_alive {c.metric('kvdir', 'lazyattn_kvdir_workers_alive')}")
        # Once they said NOT_SERVING they get no attempt at all.
        before = {i: c.selections(f"worker-{i}") for i in sick}
        after_results = run_load(c, docs, clients=2, per_client=6, tag="after")
        after = {i: c.selections(f"worker-{i}") for i in sick}
        workers = {r.get("worker") for r in after_results if r.get("ok")}
        h.check("sick: after NOT_SERVING the sick workers get no attempt",
                before == after and workers == {"worker-1"} and
                all(r.get("ok") and r.get("attempts") == 1 for r in after_results),
                f"attempts to sick workers {before} -> {after}; answered by {sorted(workers)}; "
                f"attempts {[r.get('attempts') for r in after_results]}")
        ejections = c.metric("router", "lazyattn_router_worker_ejections_total") or 0
        h.check("sick: the router's health probes ejected both", ejections >= 2,
                f"lazyattn_router_worker_ejections_total {ejections:g}")
    finally:
        c.stop()
        if not all(h.results):
            for name in ("router", *c.workers):
                print(f"--- {name} log tail:\n{c.log_tail(name, 1500)}")


def scenario_poison(args, tmp, docs):
    marker = {"testing": {"abort_on_prompt_marker": f'"{MARKER}"'}}
    c = FaultCluster(args, tmp, {0: marker, 1: marker, 2: marker}, workers=3,
                     policy="cache_aware")
    poison_q = f"Please summarize {MARKER} now."
    try:
        c.procs["kvdir"].wait_workers_alive(3, 30)
        time.sleep(0.5)  # the router probes every worker (its channels are connected)
        warm = c.request([docs[0]], "warm-up: where is it?", max_tokens=2)
        h.check("poison: an ordinary request is answered", warm.get("ok"), str(warm)[:300])

        r = c.request([], poison_q, max_tokens=4)
        wait_for(lambda: sum(not c.alive(n) for n in c.workers) >= 2, 10)
        dead = [n for n in c.workers if not c.alive(n)]
        h.check("poison: the poison request is refused as quarantined (FAILED_PRECONDITION)",
                not r.get("ok") and "quarantined" in r.get("error", "") and
                "(code 9)" in r.get("error", ""), str(r)[:400])
        h.check("poison: it cost exactly two workers", len(dead) == 2,
                f"dead: {dead}; exits {[c.exit_status(n) for n in c.workers]}")
        for n in dead:
            h.check(f"poison: {n} aborted (SIGABRT) on the marker (fault injection)",
                    c.exit_status(n) == -signal.SIGABRT and "aborting" in c.log(n),
                    f"exit {c.exit_status(n)}; {c.log_tail(n, 300)!r}")

        refused = [c.request([], poison_q, max_tokens=4) for _ in range(3)]
        h.check("poison: later requests with the same content are refused quickly",
                all(not x.get("ok") and "quarantined" in x.get("error", "") and
                    x["elapsed"] < 3.0 for x in refused),
                "; ".join(f"{x.get('error', 'ok')[:120]} in {x['elapsed']:.2f} s" for x in refused))
        still = [n for n in c.workers if c.alive(n)]
        h.check("poison: no further worker died", len(still) == 1, f"alive: {still}")

        ordinary = [c.request([docs[i % len(docs)]], f"ordinary {i}: where is it?", max_tokens=3)
                    for i in range(5)]
        h.check("poison: ordinary requests keep being answered",
                all(x.get("ok") for x in ordinary),
                "; ".join(str(x)[:150] for x in ordinary if not x.get("ok")))

        quarantined = c.metric("router", "lazyattn_router_quarantined_requests_total")
        losses = c.metric("router", "lazyattn_router_worker_connection_losses_total")
        h.check("poison: lazyattn_router_quarantined_requests_total counts every refusal (1 + 3)",
                quarantined == 4, f"{quarantined}")
        h.check("poison: two connections lost mid-call", losses == 2, f"{losses}")
        router_log = c.log("router")
        lines = [l for l in router_log.splitlines()
                 if "quarantined" in l and "fingerprint" in l and "second worker" in l]
        h.check("poison: the router logged the quarantine once, by fingerprint, not the prompt",
                len(lines) == 1 and re.search(r"[0-9a-f]{32}", lines[0]) and
                MARKER not in router_log, f"{lines}")

        # The dead workers come back; the quarantine is the router's and still holds.
        for n in dead:
            c.start_worker(int(n.split("-")[1]))
        c.procs["kvdir"].wait_workers_alive(3, 30)
        time.sleep(2.5)  # the router learns the new addresses and probes them
        again = c.request([], poison_q, max_tokens=4)
        h.check("poison: still refused after the workers restarted, and nobody died",
                not again.get("ok") and "quarantined" in again.get("error", "") and
                all(c.alive(n) for n in c.workers), str(again)[:300])

        scenario_ordinary_crash(c, docs)
    finally:
        c.stop()
        if not all(h.results):
            for name in ("router", *c.workers):
                print(f"--- {name} log tail:\n{c.log_tail(name, 1500)}")


def scenario_ordinary_crash(c, docs):
    """SIGKILL of the worker that holds a normal request before its first token: the request fails
    over, and nothing is quarantined."""
    doc = write_doc(c.tmp, "crash-doc.txt", "A document for the crash: the mill stands by the ford.")
    first = c.request([doc], "Where is the mill?", max_tokens=2)
    h.check("crash: a request caches its document on some worker", first.get("ok"), str(first)[:300])
    if not first.get("ok"):
        return
    victim = first["worker"]
    time.sleep(1.0)  # its STORED event reaches kvdir: the next request with it goes there
    losses_before = c.metric("router", "lazyattn_router_worker_connection_losses_total") or 0
    quarantined_before = c.metric("router", "lazyattn_router_quarantined_requests_total") or 0
    selected = c.selections(victim)
    pid = c.procs[victim].proc.pid
    os.kill(pid, signal.SIGSTOP)  # it holds the request without answering...
    out = {}
    t = threading.Thread(target=lambda: out.update(
        c.request([doc], "Where is the mill, again?", max_tokens=2, timeout=40)))
    t.start()
    reached = wait_for(lambda: c.selections(victim) > selected, 3, step=0.02)
    time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)  # ... and dies with it
    t.join(60)
    h.check("crash: the request reached the worker that was then killed", reached,
            f"selections of {victim}: {selected:g} -> {c.selections(victim):g}")
    h.check("crash: the request failed over to another worker",
            out.get("ok") and out.get("worker") != victim and out.get("attempts") == 2,
            str(out)[:400])
    losses = c.metric("router", "lazyattn_router_worker_connection_losses_total") or 0
    quarantined = c.metric("router", "lazyattn_router_quarantined_requests_total") or 0
    # The frozen worker never sent the call's headers, so the router cannot tell this from a
    # half-dead connection: not a loss (only a call that reached its worker counts), and nothing
    # is quarantined either way.
    h.check("crash: a worker frozen before the call reached it is no lost connection, "
            "and nothing is quarantined",
            losses == losses_before and quarantined == quarantined_before,
            f"losses {losses_before:g} -> {losses:g}, quarantined {quarantined_before:g} -> "
            f"{quarantined:g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default="build/bin")
    h.add_model_args(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lazyattn-fault-") as tmp:
        docs = [write_doc(tmp, f"doc{i}.txt", t) for i, t in enumerate(DOC_TEXTS)]
        sick_dir = os.path.join(tmp, "sick")
        poison_dir = os.path.join(tmp, "poison")
        os.makedirs(sick_dir)
        os.makedirs(poison_dir)
        scenario_sick(args, sick_dir, docs)
        scenario_poison(args, poison_dir, docs)
    h.finish()


if __name__ == "__main__":
    main()
