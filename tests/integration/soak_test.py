#!/usr/bin/env python3
"""Soak test: a local cluster (kvdir, 2 workers, router on 127.0.0.1, tiny model) under concurrent
mixed traffic with a small KV budget, so requests are preempted and cached documents evicted while
others are cancelled, hit their deadlines, or name the same document twice.

Traffic (seeded; the seed is printed, --seed replays it): `--requests` requests from
`--concurrency` threads, each a `lazyattn client` process, stopping early after `--time-limit`
seconds. A request has 0-3 documents from a pool of shared ones (Zipf popularity) or fresh ones
used once, and in about a third of them one document appears twice; its cache mode is lazy, block,
prefix or full, sometimes with a system prompt; and it is one of
  greedy    temperature 0, must be answered;
  cancel    the client is killed after a random delay (the router cancels the call);
  deadline  a deadline of 5-300 ms (a third of them 1-10 ms);
  sampled   a seed and sampling settings at the edges of their ranges (SAMPLED_EDGES), must be
            answered.

At the end, one line per check:
  - every greedy and sampled request was answered; cancelled and deadline ones either answered or
    ended by their cancel / deadline, never by another error (UNAVAILABLE would mean a worker died);
  - some cancels and deadlines did end calls early (the scenario exercised them);
  - every worker is alive, its KV blocks add up to the total, none is referenced once idle, and
    lazyattn_worker_kv_pool_errors_total is exported and 0;
  - the answers of the answered greedy requests equal those of the same requests sent one at a
    time to a fresh single-worker cluster with a KV budget large enough that nothing is preempted
    or evicted.

Why that reference, and the one tolerance: the reference must not share state with the cluster
under test (replaying on the soaked cluster would read the same, possibly corrupted, cached blocks
and agree with them), and it must run without preemption, eviction or cancels. In every mode the
engine computes the same function whether a document's KV was cached or encoded just now (lazy and
block documents are encoded alone at their own positions; the radix prefix tree only skips
recomputing identical KV), so answers could differ only through floating-point rounding, which
does depend on history and on what shares a step: the CPU backend multiplies a lone row with sgemv
and several rows with sgemm, chunked prefill splits a prompt where the token budget falls, and a
`block` document cached at another offset is copied with its f16 keys re-rotated (one more
rounding, DESIGN.md section 3), so which offsets a document was cached at before changes the bits.
Rounding moves a log-probability by about 1e-4 here, and changes a greedy token only where the
top two are that close. Greedy requests therefore ask for their tokens' log-probabilities and the
top 5 at each step, and an answer that differs from the reference's must agree with it up to the
first differing token, every shared token's log-probability within PREFIX_LOGPROB_TOLERANCE of the
reference's, and at that token the two choices must be a near-tie in both runs: each run's choice
among the other's top 5, within NEAR_TIE_LOGPROB of that run's best, and the two choices'
log-probabilities within PREFIX_LOGPROB_TOLERANCE across the runs. (Where one answer ended, by
the end-of-sequence token, which is never streamed, the other's choice there must have had a rival
within NEAR_TIE_LOGPROB.) Corrupted KV (wrong blocks,
wrong rotation) moves log-probabilities by far more than rounding does, so it fails either way.
Near-ties are counted and printed; anything else is wrong and printed with the request so it can
be replayed.

  python3 tests/integration/soak_test.py [--bin-dir build/bin] [--seed N] [--requests N]
Prints one line per check and "N passed, M failed" last; exits non-zero on any failure.
"""
import argparse
import concurrent.futures
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_harness as h  # noqa: E402

WORDS = ("river water sea mountain valley city bridge stone forest lake north south east west "
         "harbor island meadow canyon glacier desert tower road field garden").split()
MODES = ("lazy",) * 11 + ("block",) * 3 + ("prefix",) * 3 + ("full",) * 3
KINDS = ("greedy",) * 13 + ("cancel",) * 3 + ("deadline",) * 3 + ("sampled",) * 3
# A sampled request takes each setting from the edges of its range (common/request_validator.cc)
# or leaves it out (None), so the samplers meet near-zero and the largest temperatures, nucleus,
# top-k and min-p cuts that keep one token, penalties at their limits and the most alternatives,
# in steps shared with greedy rows.
SAMPLED_EDGES = (
    ("--temperature", ("0.9", "0.00002", "100")),
    ("--top-p", (None, "0.000001", "0.5")),
    ("--top-k", (None, "1", "1000000")),
    ("--min-p", (None, "0.999", "1")),
    ("--presence-penalty", (None, "2", "-2")),
    ("--frequency-penalty", (None, "2", "-2")),
    ("--repetition-penalty", (None, "100", "0.01")),
)
# 2 MiB: 128 blocks of 16 tokens of the tiny model (2 x 4 layers x 2 KV heads x 16 dims x 4 bytes
# x 16 tokens = 16 KiB a block), room for 2,048 tokens: a few requests of up to ~1,300 prompt
# tokens each, so concurrent ones preempt each other and evict cached documents.
SOAK_ENGINE = {"kv_budget_bytes": 2097152, "max_batch_tokens": 32, "max_running": 8}
REFERENCE_ENGINE = {"kv_budget_bytes": 67108864, "max_batch_tokens": 32}
# Rounding moved log-probabilities by at most ~3e-4 on this model (a block document copied from
# another offset, sgemm versus sgemv rows); corrupted KV moves them by whole units.
PREFIX_LOGPROB_TOLERANCE = 5e-3
NEAR_TIE_LOGPROB = 2e-3
GREEDY_LOGPROB_FLAGS = ["--logprobs", "--top-logprobs", "5"]


def write_doc(tmp, name, rng, words):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(f"{name}. " + " ".join(rng.choice(WORDS) for _ in range(words)) + ".\n")
    return path


def plan(rng, tmp, n):
    """n request specs. A spec is a dict; its 'key' (everything that determines a greedy answer)
    identifies the same request in the reference run."""
    pool = [write_doc(tmp, f"shared{i}.txt", rng, rng.randint(15, 60)) for i in range(12)]
    weights = [1 / (i + 1) ** 0.9 for i in range(len(pool))]
    specs = []
    for i in range(n):
        kind = rng.choice(KINDS)
        docs = []
        for _ in range(rng.choice((0, 1, 1, 2, 2, 3))):
            if rng.random() < 0.2:
                docs.append(write_doc(tmp, f"fresh{i}_{len(docs)}.txt", rng, rng.randint(15, 60)))
            else:
                docs.append(rng.choices(pool, weights)[0])
        if docs and rng.random() < 0.35:
            docs.insert(rng.randint(0, len(docs)), rng.choice(docs))  # the same document twice
        if kind in ("cancel", "deadline") and rng.random() < 0.6:
            # A document nobody has cached, long enough to take several steps to encode, named
            # twice: a cancel that lands during its encode is what took workers down (the issue's
            # reproducer, tests/integration/reproducer_test.py).
            docs = docs[:2]
            fresh = write_doc(tmp, f"long{i}.txt", rng, rng.randint(50, 100))
            docs[rng.randint(0, len(docs)):0] = [fresh]
            docs.insert(rng.randint(0, len(docs)), fresh)
        extra = ["--mode", rng.choice(MODES)]
        if rng.random() < 0.3:
            extra += ["--system", "You answer in one short sentence."]
        if rng.random() < 0.5:
            extra += ["--ignore-eos"]
        if kind == "sampled":
            for flag, values in SAMPLED_EDGES:
                value = rng.choice(values)
                extra += [flag, value] if value is not None else []
            extra += ["--seed", str(i)]
            if rng.random() < 0.3:
                extra += ["--logprobs", "--top-logprobs", "20"]
        if kind == "greedy":
            extra += GREEDY_LOGPROB_FLAGS  # the near-tie check reads them
        question = f"Question {i}: what about the {rng.choice(WORDS)}?"
        max_tokens = rng.randint(2, 8)
        spec = {"i": i, "kind": kind, "docs": docs, "question": question, "max_tokens": max_tokens,
                "extra": extra, "key": (tuple(docs), question, max_tokens, tuple(extra))}
        if kind == "cancel":
            spec["cancel_after"] = rng.uniform(0.0, 0.3)
        if kind == "deadline":
            # A tiny model serves most requests within a few ms: with deadlines of 5-300 ms alone,
            # a fast run ended none of 45 early (1 in 12 ends early). A third get 1-10 ms, which
            # land in routing or the first encode step.
            short = rng.random() < 1 / 3
            spec["timeout"] = rng.uniform(0.001, 0.01) if short else rng.uniform(0.005, 0.3)
        specs.append(spec)
    return specs


def run_cancelled(c, spec):
    """Starts the client and kills it after spec['cancel_after'] seconds: the router sees the call
    cancelled and cancels the worker's."""
    argv = [f"{c.args.bin_dir}/lazyattn", "client", "--router", c.router, "--prompt",
            spec["question"], "--max-tokens", str(spec["max_tokens"]), "--json", "--timeout", "60",
            *spec["extra"]]
    for d in spec["docs"]:
        argv += ["--doc", d]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=spec["cancel_after"])
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        p.communicate()
        return {"ok": False, "rc": p.returncode, "error": "killed", "cancelled": True}
    return {"ok": p.returncode == 0, "rc": p.returncode, "error": err.strip(), "cancelled": False}


def send(c, spec):
    if spec["kind"] == "cancel":
        return run_cancelled(c, spec)
    return c.request(spec["docs"], spec["question"], spec["max_tokens"], spec["extra"],
                     timeout=round(spec['timeout'], 3) if spec["kind"] == "deadline" else 60)


def soak(c, specs, concurrency, time_limit):
    stop_at = time.monotonic() + time_limit
    lock = threading.Lock()
    done = {}

    def one(spec):
        if time.monotonic() > stop_at:
            return
        r = send(c, spec)
        with lock:
            done[spec["i"]] = r

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, specs))
    return done


def ended_acceptably(spec, r):
    """Cancelled and deadline requests may finish first; otherwise they end by their cancel (the
    killed client) or DEADLINE_EXCEEDED (code 4), never by another error."""
    if r["ok"]:
        return True
    if spec["kind"] == "cancel":
        return r.get("cancelled", False)
    if spec["kind"] == "deadline":
        return "code 4)" in r["error"]
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(h.REPO, "build", "bin"))
    ap.add_argument("--seed", type=int, default=None, help="traffic seed (default: random, printed)")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=90,
                    help="seconds of traffic at most, and again of the reference run")
    h.add_model_args(ap)
    ap.add_argument("--kv-budget-bytes", type=int, default=SOAK_ENGINE["kv_budget_bytes"],
                    help="each soaked worker's KV budget (default sized for the tiny model: scale "
                         "it with the model's bytes a token so the budget still runs out)")
    ap.add_argument("--logprob-tolerance", type=float, default=PREFIX_LOGPROB_TOLERANCE,
                    help="how far a shared token's log-probability may move between the soak and "
                         "the reference (default: the CPU backend's rounding)")
    ap.add_argument("--near-tie-logprob", type=float, default=NEAR_TIE_LOGPROB,
                    help="how close two choices must be to count as a near-tie")
    args = ap.parse_args()
    os.chdir(h.REPO)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"soak: seed {seed} (--seed {seed} replays the traffic), {args.requests} requests, "
          f"{args.concurrency} at a time, at most {args.time_limit:g} s; model {args.model} on "
          f"backend {args.backend}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        specs = plan(random.Random(seed), tmp, args.requests)
        try:
            done = run_soak(args, tmp, specs)
            run_reference(args, tmp, specs, done)
        except Exception as e:  # a scenario that could not run is a failure, never a skip
            h.check("soak ran", False, f"{type(e).__name__}: {e}")
    print(f"  ({time.monotonic() - started:.1f} s)")
    h.finish()


def run_soak(args, tmp, specs):
    workdir = tempfile.mkdtemp(dir=tmp)
    engine = dict(SOAK_ENGINE, kv_budget_bytes=args.kv_budget_bytes)
    c = h.Cluster(args, workdir, 2, "cache_aware", engine=engine, track_blocks=True)
    try:
        min_free = {name: None for name in c.workers}
        sampling = threading.Event()

        def sample():  # the fewest free blocks each worker's /metrics showed during the traffic
            while not sampling.wait(0.25):
                for name in c.workers:
                    try:
                        free = h.parse_metrics(c.scrape(name)).get(h.FREE)
                    except OSError:
                        continue
                    if free is not None and (min_free[name] is None or free < min_free[name]):
                        min_free[name] = free

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        try:
            done = soak(c, specs, args.concurrency, args.time_limit)
        finally:
            sampling.set()
            sampler.join()
        elapsed = time.monotonic() - t0
        by_kind = {}
        for s in specs:
            if s["i"] in done:
                by_kind.setdefault(s["kind"], []).append((s, done[s["i"]]))
        print("  traffic: " + ", ".join(
            f"{k} {sum(r['ok'] for _, r in v)}/{len(v)} answered" for k, v in sorted(by_kind.items())) +
            f"; {len(done)} of {len(specs)} sent in {elapsed:.1f} s", flush=True)
        h.check("traffic: at least half the planned requests ran before the time limit",
                len(done) * 2 >= len(specs), f"{len(done)} of {len(specs)}")
        for kind in ("greedy", "sampled"):
            failed = [(s["i"], r.get("error", "")[-120:]) for s, r in by_kind.get(kind, []) if not r["ok"]]
            h.check(f"every {kind} request was answered", not failed and by_kind.get(kind),
                    f"{len(failed)} failed, first: {failed[:3]}" if failed else
                    f"{len(by_kind.get(kind, []))} requests")
        for kind in ("cancel", "deadline"):
            rs = by_kind.get(kind, [])
            bad = [(s["i"], r.get("error", "")[-120:]) for s, r in rs if not ended_acceptably(s, r)]
            early = sum(not r["ok"] for _, r in rs)
            h.check(f"every {kind} request answered or ended by its {kind}, no other error", not bad,
                    f"{len(bad)} of {len(rs)}, first: {bad[:3]}" if bad else f"{len(rs)} requests")
            h.check(f"the scenario exercised {kind}s: some ended calls early", early > 0,
                    f"{early} of {len(rs)}")
        h.check_workers_sound(c, "after the soak")
        # Pressure: a worker with (almost) no free block must evict cached documents, or make
        # requests wait or preempt them, to serve the next chunk.
        for name in c.workers:
            low = min_free[name]
            h.check(f"the KV budget ran out: {name} had under 10% of its blocks free at times",
                    low is not None and low < 0.1 * c.total_blocks[name],
                    f"fewest free {low} of {c.total_blocks[name]:g} (sampled every 0.25 s)")
        # Preemption depends on timing (admission reserves prompts, so only decode growth can
        # preempt): reported, and the metric must exist, but a count of 0 is not a failure.
        preempted = {name: h.parse_metrics(c.scrape(name)).get(("lazyattn_worker_preemptions_total", ""))
                     for name in c.workers}
        h.check("workers export lazyattn_worker_preemptions_total",
                all(v is not None for v in preempted.values()), f"{preempted}")
        r = c.request([], "Still there?", max_tokens=2)
        h.check("the cluster still serves after the soak", r["ok"], r.get("error", ""))
        return done
    finally:
        c.stop()


def answer(r):
    """What a greedy answer is compared by: its token ids (two different ids can decode to the
    same text, e.g. U+FFFD for partial UTF-8) and its text."""
    if "token_ids" not in r:
        raise RuntimeError("`lazyattn client --json` printed no token_ids: cannot compare answers")
    return tuple(r["token_ids"]), r["text"]


def judge(got, ref, prefix_tolerance=PREFIX_LOGPROB_TOLERANCE, near_tie=NEAR_TIE_LOGPROB):
    """(verdict, why, drift) for the soak's greedy result `got` against the reference's `ref`
    (both `lazyattn client --json` results with logprobs and top_logprobs; see the module's
    comment): verdict "equal", "near-tie" or "wrong"; why says what is wrong; drift is the largest
    log-probability difference over the tokens the two answers share before they differ. The two
    tolerances are the module's constants unless the run sets them (--logprob-tolerance,
    --near-tie-logprob)."""
    a, b = got["token_ids"], ref["token_ids"]
    first = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    for r in (got, ref):  # `lazyattn client --json` lists one entry per token in each
        if not len(r["token_ids"]) == len(r["logprobs"]) == len(r["top_logprobs"]):
            return "wrong", (f"{len(r['token_ids'])} token ids, {len(r['logprobs'])} logprobs and "
                             f"{len(r['top_logprobs'])} top_logprobs from worker {r['worker']}"), 0.0
    drifts = [abs(got["logprobs"][k] - ref["logprobs"][k]) for k in range(first)]
    drift = max(drifts, default=0.0)
    if drift > prefix_tolerance:
        return "wrong", f"token {drifts.index(drift)}'s log-probability moved by {drift:.2e}", drift
    if answer(got) == answer(ref):
        return "equal", "", drift
    if a == b:
        return "wrong", "the same token ids with different text", drift
    shorter, longer = (got, ref) if len(a) < len(b) else (ref, got)
    if first == min(len(a), len(b)):
        # The shorter one stopped where the longer one went on: the end-of-sequence token (never
        # streamed, so its id is in neither list) won there by a near-tie, so the longer one's
        # choice must have had a rival within NEAR_TIE_LOGPROB.
        top = sorted((t["logprob"] for t in longer["top_logprobs"][first]), reverse=True)
        if shorter["finish_reason"] == "stop" and len(top) >= 2 and top[0] - top[1] <= near_tie:
            return "near-tie", f"token {first}: the end of one answer", drift
        return "wrong", (f"one answer is a prefix of the other ({len(a)} and {len(b)} tokens, "
                         f"the shorter one ended by {shorter['finish_reason']!r})"), drift

    def lp(result, token):  # `token`'s log-probability among result's top 5 at `first`, or None
        return next((t["logprob"] for t in result["top_logprobs"][first] if t["id"] == token), None)

    def tie(choice, result):  # `choice` within `near_tie` of result's best at `first`
        best = max(t["logprob"] for t in result["top_logprobs"][first])
        return lp(result, choice) is not None and best - lp(result, choice) <= near_tie

    if not (tie(a[first], ref) and tie(b[first], got)):
        return "wrong", (f"token {first} differs ({a[first]} against {b[first]}) and is no "
                         f"near-tie: top 5 {got['top_logprobs'][first]} against "
                         f"{ref['top_logprobs'][first]}"), drift
    # Both runs must also agree on the two rivals' log-probabilities, as on every shared token:
    # otherwise each run's near-tie is judged on its own, possibly corrupted, numbers.
    for token in (a[first], b[first]):
        moved = abs(lp(got, token) - lp(ref, token))
        if moved > prefix_tolerance:
            return "wrong", (f"token {first}: the log-probability of {token} moved by "
                             f"{moved:.2e} between the runs"), max(drift, moved)
    return "near-tie", f"token {first}: {a[first]} against {b[first]}", drift


def run_reference(args, tmp, specs, done):
    """Sends the answered greedy requests one at a time to a fresh worker (for at most
    --time-limit seconds, so the test stays bounded) and compares the answers."""
    answers = {}  # key -> [(spec, the soak's result)], one per answered greedy occurrence
    for s in specs:
        r = done.get(s["i"])
        if s["kind"] == "greedy" and r and r["ok"]:
            answers.setdefault(s["key"], []).append((s, r))
    c = h.Cluster(args, tempfile.mkdtemp(dir=tmp), 1, "cache_aware", engine=REFERENCE_ENGINE)
    try:
        alone, skipped = {}, 0
        stop_at = time.monotonic() + args.time_limit
        for key, got in list(answers.items()):
            if time.monotonic() > stop_at:
                skipped += len(answers.pop(key))  # not compared: out of time
                continue
            s = got[0][0]
            ref = c.request(s["docs"], s["question"], s["max_tokens"], s["extra"], timeout=60)
            if not ref["ok"]:
                raise RuntimeError(f"reference request {s['i']} failed: {ref['error']}")
            alone[key] = ref
        compared = sum(len(g) for g in answers.values())
        verdicts = {"equal": [], "near-tie": [], "wrong": []}
        largest_drift = 0.0
        for key, got in answers.items():
            for spec, r in got:
                verdict, why, drift = judge(r, alone[key], args.logprob_tolerance,
                                            args.near_tie_logprob)
                verdicts[verdict].append((spec, r, why))
                largest_drift = max(largest_drift, drift)
        for spec, r, why in verdicts["near-tie"][:3]:
            print(f"  near-tie: request {spec['i']} {why}", flush=True)
        for spec, r, why in verdicts["wrong"][:5]:
            print(f"  mismatch: request {spec['i']} ({' '.join(spec['extra'])}, docs "
                  f"{[os.path.basename(d) for d in spec['docs']]}, {spec['question']!r}): soak "
                  f"{answer(r)!r}, one by one {answer(alone[spec['key']])!r}: {why}", flush=True)
        near, wrong = len(verdicts["near-tie"]), len(verdicts["wrong"])
        h.check("greedy answers equal those of the same requests run on a fresh worker, or differ "
                "at a near-tie", compared > 0 and not wrong,
                f"{len(verdicts['equal'])} of {compared} equal to the request run alone"
                f"{f', {near} near-ties' if near else ''}{f', {wrong} wrong' if wrong else ''}; "
                f"shared tokens' log-probabilities within {largest_drift:.1e}"
                f" ({len(answers)} distinct requests"
                f"{f'; {skipped} answers not compared, out of time' if skipped else ''})")
    finally:
        c.stop()

if __name__ == "__main__":
    main()
