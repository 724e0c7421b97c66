#!/usr/bin/env python3
"""Exact routing predictions on real processes (kvdir, two workers, a cache_aware router, the tiny
model): a document stored in block mode at one offset is predicted as a hit only for a block
request that places it at that same offset, never for a lazy request nor for a block request at
another offset (docs/router.md, "Predictions"). Each request's Final carries the router's
prediction for the worker that served it (predicted_hit_tokens); the worker reports what it
reused (usage.document_hit_tokens); the two must agree.

  python3 tests/integration/prediction_test.py --bin-dir build/bin

The router's speculative entries would answer for a moment after each request; the checks wait
past their TTL (2 s by default), so what they see is kvdir's answer. Prints one line per check and
"N passed, M failed" last; exits non-zero on any failure.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_harness import REPO, Cluster, check, finish, metric_sum, parse_metrics  # noqa: E402

SPECULATIVE_TTL_S = 2.0  # routing.speculative_ttl_ms's default
STORED = ("lazyattn_kvdir_events_applied_total", '{kind="stored"}')


def message_classes(tmp):
    """GenerateRequest and GenerateResponse built from the repository's proto at run time (a
    descriptor set from protoc: no generated Python code, so no protobuf version to match)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    out = os.path.join(tmp, "inference.pb")
    subprocess.run(["protoc", "-I", os.path.join(REPO, "proto"), "--include_imports",
                    f"--descriptor_set_out={out}", "lazyattn/v1/inference.proto"], check=True)
    with open(out, "rb") as f:
        files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)

    def cls(name):
        d = pool.FindMessageTypeByName(name)
        if hasattr(message_factory, "GetMessageClass"):
            return message_factory.GetMessageClass(d)
        return message_factory.MessageFactory(pool).GetPrototype(d)
    return cls("lazyattn.v1.GenerateRequest"), cls("lazyattn.v1.GenerateResponse"), pool


class Client:
    def __init__(self, router, tmp):
        import grpc  # python3-grpcio
        self.channel = grpc.insecure_channel(router)
        self.Request, self.Response, pool = message_classes(tmp)
        self.modes = pool.FindEnumTypeByName("lazyattn.v1.CacheMode").values_by_name
        self.generate = self.channel.unary_stream(
            "/lazyattn.v1.Inference/Generate", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self.Response.FromString)

    def run(self, docs, mode):
        """One Generate with token-id documents; returns its Final."""
        r = self.Request(question=b" Which document?", cache_mode=self.modes[mode].number)
        r.sampling.max_tokens = 2
        r.sampling.ignore_eos = True
        for ids in docs:
            r.documents.add().tokens.ids.extend(ids)
        final = None
        for m in self.generate(r, timeout=60):
            if m.HasField("final"):
                final = m.final
        return final


def stored_events(c):
    return parse_metrics(c.scrape("kvdir")).get(STORED, 0)


def wait_stored(c, at_least, timeout=10):
    """Waits until kvdir applied `at_least` STORED events; returns how many it did."""
    deadline = time.monotonic() + timeout
    while True:
        n = stored_events(c)
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default="build/bin")
    args = ap.parse_args()
    doc_d = [(7 * i + 3) % 90 + 5 for i in range(40)]  # 40 token ids of the tiny vocabulary
    doc_e = [(11 * i + 1) % 90 + 5 for i in range(25)]
    with tempfile.TemporaryDirectory() as tmp:
        c = Cluster(args, tmp, workers=2, policy="cache_aware")
        try:
            client = Client(c.router, tmp)
            # Block mode, D first: the router cannot place it yet (the prefix length comes from
            # the first answer), so it predicts nothing; the worker stores D at the prefix's end.
            first = client.run([doc_d], "CACHE_MODE_BLOCK")
            prefix = first.usage.prefix_tokens
            check("a cold block request: nothing predicted, nothing reused",
                  first.predicted_hit_tokens == 0 and first.usage.document_hit_tokens == 0,
                  f"predicted {first.predicted_hit_tokens}, reused "
                  f"{first.usage.document_hit_tokens}, prefix {prefix} tokens")
            check("the workers stored D in block mode and kvdir applied it",
                  wait_stored(c, 1) >= 1, f"{stored_events(c)} stored events")
            time.sleep(SPECULATIVE_TTL_S + 0.3)

            lazy = client.run([doc_d], "CACHE_MODE_LAZY")
            check("a lazy request for D (held only at one offset, block mode) is not predicted "
                  "as a hit, and indeed re-encodes it",
                  lazy.predicted_hit_tokens == 0 and lazy.usage.document_hit_tokens == 0,
                  f"predicted {lazy.predicted_hit_tokens}, reused "
                  f"{lazy.usage.document_hit_tokens} on {lazy.worker}")
            wait_stored(c, 2)
            time.sleep(SPECULATIVE_TTL_S + 0.3)

            moved = client.run([doc_e, doc_d], "CACHE_MODE_BLOCK")  # D at prefix + 25
            check("a block request placing D at another offset is not predicted as a hit (the "
                  "worker copies it: cached, but no hit)",
                  moved.predicted_hit_tokens == 0 and moved.usage.document_hit_tokens == 0,
                  f"predicted {moved.predicted_hit_tokens}, reused "
                  f"{moved.usage.document_hit_tokens}, cached {moved.usage.cached_tokens} on "
                  f"{moved.worker}")
            wait_stored(c, 4)
            time.sleep(SPECULATIVE_TTL_S + 0.3)

            same = client.run([doc_d], "CACHE_MODE_BLOCK")  # D at the prefix's end again
            check("a block request placing D at the offset it was stored at is predicted as a "
                  "hit of D's tokens, routed to the worker holding it, which reuses them",
                  same.predicted_hit_tokens == len(doc_d) and
                  same.usage.document_hit_tokens == len(doc_d) and same.worker == first.worker,
                  f"predicted {same.predicted_hit_tokens}, reused "
                  f"{same.usage.document_hit_tokens} on {same.worker} (stored on {first.worker})")
            metrics = parse_metrics(c.scrape("router"))
            errors = metric_sum(metrics, "lazyattn_router_prediction_error_tokens_count")
            exact = metric_sum(metrics, "lazyattn_router_prediction_error_tokens_bucket", '{le="0"}')
            check("the router counted every prediction, all exact",
                  errors == 4 and exact == 4, f"{exact} of {errors} in the le=0 bucket")
        finally:
            c.stop()
    finish()


if __name__ == "__main__":
    main()
