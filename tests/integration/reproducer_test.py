#!/usr/bin/env python3
"""Regression test: a request that names the same uncached document twice and is cancelled (here:
its deadline passes) while that document is being encoded must not take its worker down.

The issue's reproducer ran six `lazyattn client --doc big.txt --doc big.txt --timeout T` calls
(T from 0.2 to 0.7 s) against a local two-worker cluster, then one ordinary request: both workers
died silently and every later request got UNAVAILABLE. The two mentions of the document joined one
encode job twice, and the deadline freed that job twice.

Here the cluster serves the tiny model, whose encode of a document takes milliseconds rather than
the seconds SmolLM2 needs, so fixed deadlines would mostly land before or after it. Instead:
  - the workers run one 16-token chunk a step, so a ~1,500-token document takes ~100 steps;
  - one request on a document of the same size (named twice) measures the whole call, T;
  - then each of several fresh documents (named twice, never cached) gets a deadline at a
    different fraction of T, so some deadlines pass in the middle of an encode.
Checks: the ordinary request that follows is served, at least one deadline passed (the scenario
ran), and on every worker: alive, KV block counts add up to the total, nothing referenced once
idle, lazyattn_worker_kv_pool_errors_total exported and 0.

  python3 tests/integration/reproducer_test.py [--bin-dir build/bin]
Prints one line per check and "N passed, M failed" last; exits non-zero on any failure.
"""
import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_harness as h  # noqa: E402

WORDS = ("river water sea mountain valley city bridge stone forest lake north south east west "
         "harbor island meadow canyon glacier desert").split()
FRACTIONS = (0.08, 0.16, 0.25, 0.33, 0.42, 0.5, 0.6, 0.7, 0.8, 0.9)


def write_doc(tmp, name, seed, words):
    rng = random.Random(seed)
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(f"{name}. " + " ".join(rng.choice(WORDS) for _ in range(words)) + ".\n")
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(h.REPO, "build", "bin"))
    h.add_model_args(ap)
    ap.add_argument("--doc-words", type=int, default=260,
                    help="words per big document (the tiny model's 4,096 positions must hold two)")
    args = ap.parse_args()
    os.chdir(h.REPO)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        c = None
        try:
            c = h.Cluster(args, tmp, 2, "cache_aware", track_blocks=True,
                          engine={"kv_budget_bytes": 16777216, "max_batch_tokens": 16})
            calib = write_doc(tmp, "calibration.txt", 1, args.doc_words)
            r = c.request([calib, calib], "Summarize.", max_tokens=4)
            steps = r.get("prompt_tokens", 0) // 2 // 16
            h.check("calibration: a big document named twice is served, its encode spans many steps",
                    r["ok"] and steps >= 40,
                    f"{r.get('prompt_tokens')} prompt tokens (~{steps} steps of 16), "
                    f"{r['elapsed']:.3f} s" if r["ok"] else r["error"])
            if not r["ok"]:
                raise RuntimeError("calibration request failed")
            whole = r["elapsed"]
            outcomes = []
            for i, f in enumerate(FRACTIONS):
                big = write_doc(tmp, f"big{i}.txt", 100 + i, args.doc_words)
                t = max(0.005, f * whole)
                r = c.request([big, big], "Summarize.", max_tokens=4, timeout=round(t, 3))
                outcomes.append(f"{t:.3f}s:" + ("ok" if r["ok"] else
                                                "deadline" if "code 4" in r["error"] else
                                                f"rc {r['rc']} {r['error'][-80:]!r}"))
            print("  deadlines: " + ", ".join(outcomes), flush=True)
            h.check("the scenario ran: some deadlines passed before the answer",
                    any(o.endswith(":deadline") for o in outcomes))
            h.check("no call failed other than by its deadline",
                    all(o.endswith((":ok", ":deadline")) for o in outcomes))
            small = os.path.join(tmp, "a.txt")
            with open(small, "w") as f:
                f.write("A short document about a river.\n")
            r = c.request([small], "hi", max_tokens=4)
            h.check("the next ordinary request is served", r["ok"], r.get("error", r.get("worker", "")))
            h.check_workers_sound(c, "after the cancelled duplicate-document encodes")
        except Exception as e:  # a scenario that could not run is a failure, never a skip
            h.check("reproducer ran", False, str(e))
        finally:
            if c:
                c.stop()
    print(f"  ({time.monotonic() - started:.1f} s)")
    h.finish()


if __name__ == "__main__":
    main()
