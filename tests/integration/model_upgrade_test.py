#!/usr/bin/env python3
"""A rolling upgrade between two weight files behind one router (docs/router.md "Models"): real
kvdir, router and CPU worker processes on 127.0.0.1, requests over the gRPC API (Python messages
compiled from proto/ with Debian's protoc) and the HTTP API.

Weights A are tests/data/tiny/tiny-llama, weights B tests/data/tiny/tiny-llama-untied (another
output head: other fingerprints, other answers); both report the name "tiny" (`model.name`), as
an upgrade that keeps the name does.

  start   two workers of A: GetModelInfo lists one model, id "tiny"; requests without `model`
          and naming "tiny" are served by them; their greedy answers are kept.
  join    two workers of B join: GetModelInfo lists two models, "tiny@<A's fingerprint>" and
          "tiny@<B's>"; requests naming either (B by a short prefix) reach only that model's
          workers (Final.worker), A's greedy answers are those from before B joined and B's
          differ; a document computed on B is a hit on B's next request but not on A's; a bare
          "tiny" and a request without `model` go to the newer weights (two workers each: a tie);
          GET /v1/models lists both ids, a chat completion naming A is served by an A worker, an
          unknown model is 404 model_not_found.
  leave   A's workers drain (SIGTERM) and exit 0: GetModelInfo lists B alone; a request pinned to
          A is NOT_FOUND naming it; "tiny" and no `model` are served by B.
  names   a worker of A named "other" joins: a request without `model` is INVALID_ARGUMENT naming
          `model` and listing "other, tiny"; "other" and "tiny" reach their own workers.

  python3 tests/integration/model_upgrade_test.py [--bin-dir build/bin]
Prints one line per check and "N passed, M failed" last.
"""
import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_harness as h  # noqa: E402

MODEL_A = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf"
MODEL_B = "tests/data/tiny/tiny-llama-untied/tiny-llama-untied-f32.gguf"
NAME = "tiny"
A_WORKERS = ("worker-0", "worker-1")  # the harness's own, on MODEL_A
B_WORKERS = ("worker-b0", "worker-b1")
QUESTIONS = ["Where is the river?", "Who keeps the lighthouse?", "What does the map show?"]
DOC = "The river runs north of the old city; the lighthouse keeper draws maps of it."
# The router forgets a worker the directory stopped listing after this long.
FORGET_AFTER_MS = 300
# Long enough that a worker starved of CPU on a loaded test machine keeps its lease: one that
# lapses drops out of its model's count, and the two-two tie the join scenario checks is gone.
# Leaving workers disconnect, so only `leave` waits for it (wait_models allows 30 s).
LEASE_MS = 3000
ROUTER_EXTRA = {"kvdir": {"forget_after_ms": FORGET_AFTER_MS}, "http": {"listen": "127.0.0.1:0"}}
WORKER_EXTRA = {"model": {"name": NAME}, "server": {"drain_timeout_s": 10}}

pb = None  # lazyattn.v1.inference_pb2, compiled by load_messages()


def load_messages(tmp):
    global pb
    out = os.path.join(tmp, "py")
    os.makedirs(out)
    subprocess.run(["protoc", f"-I{h.REPO}/proto", f"--python_out={out}",
                    "lazyattn/v1/inference.proto"], check=True)
    sys.path.insert(0, out)
    pb = importlib.import_module("lazyattn.v1.inference_pb2")


class ModelCluster(h.Cluster):
    """The shared harness's cluster, its workers named NAME, the router with HTTP and a short
    forget_after, plus workers started on other weights or under other names."""

    def _write(self, name, text):
        extra = {"router.yaml": ROUTER_EXTRA, "worker.yaml": WORKER_EXTRA}.get(name, {})
        for section, keys in extra.items():
            lines = "".join(f"  {k}: {v}\n" for k, v in keys.items())
            if f"{section}:\n" in text:
                text = text.replace(f"{section}:\n", f"{section}:\n{lines}", 1)
            else:
                text += f"{section}:\n{lines}"
        super()._write(name, text)

    def start_model_worker(self, name, model_path, model_name=NAME):
        with open(f"{self.tmp}/worker.yaml") as f:
            base = f.read()
        base = base.replace(f"path: {h.MODEL}", f"path: {model_path}", 1)
        base = base.replace(f"name: {NAME}", f"name: {model_name}", 1)
        # Written by the base class: no keys of this test's own added again.
        h.Cluster._write(self, f"{name}.yaml", "insecure: true\n" + base)
        self.procs[name] = h.cluster.Process(name, [
            f"{self.args.bin_dir}/lazyattn-worker", "--config", f"{self.tmp}/{name}.yaml",
            "--listen", "127.0.0.1:0", "--kvdir", self.kvdir_addr, "--worker-id", name], self.tmp)
        self.addrs[name] = self.procs[name].wait_ready(60)
        self.workers.append(name)

    def http_url(self):
        url = self.procs["router"].http_url
        if url is None:
            raise RuntimeError("the router printed no HTTP address")
        return url.rstrip("/")


def generate(c, model, question, docs=(), max_tokens=6):
    """One greedy Generate: {"ok", "worker", "text", "hit"} or {"ok": False, "code", "message"}."""
    import grpc  # python3-grpcio
    request = pb.GenerateRequest(question=question.encode(), model=model.encode())
    for d in docs:
        request.documents.add(text=d.encode())
    request.sampling.max_tokens = max_tokens
    with grpc.insecure_channel(c.router) as channel:
        call = channel.unary_stream("/lazyattn.v1.Inference/Generate",
                                    request_serializer=pb.GenerateRequest.SerializeToString,
                                    response_deserializer=pb.GenerateResponse.FromString)
        try:
            text, final = "", None
            for r in call(request, timeout=60):
                if r.HasField("token"):
                    text += r.token.text
                elif r.HasField("final"):
                    final = r.final
            return {"ok": True, "worker": final.worker, "text": text,
                    "hit": final.usage.documents_hit}
        except grpc.RpcError as e:
            return {"ok": False, "code": e.code().name, "message": e.details()}


def model_info(c):
    import grpc  # python3-grpcio
    with grpc.insecure_channel(c.router) as channel:
        call = channel.unary_unary("/lazyattn.v1.Inference/GetModelInfo",
                                   request_serializer=pb.GetModelInfoRequest.SerializeToString,
                                   response_deserializer=pb.ModelInfo.FromString)
        return call(pb.GetModelInfoRequest(), timeout=10)


def wait_models(c, n, workers, timeout=30):
    """GetModelInfo once it lists `n` models served by `workers` workers in all (the router learns
    of joins and leaves from kvdir); the last answer when that never happens."""
    deadline = time.monotonic() + timeout
    info = None
    while time.monotonic() < deadline:
        try:
            info = model_info(c)
            if len(info.models) == n and sum(m.workers for m in info.models) == workers:
                return info
        except Exception:  # UNAVAILABLE while nothing is known
            pass
        time.sleep(0.2)
    return info


def http(c, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(c.http_url() + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def served_by(results, workers):
    return all(r.get("ok") and r["worker"] in workers for r in results)


def brief(results):
    return "; ".join(r["worker"] if r.get("ok") else f"{r['code']}: {r['message']}"
                     for r in results)[:600]


def scenario_start(c):
    info = wait_models(c, 1, workers=2)
    h.check("start: GetModelInfo lists one model, id \"tiny\", with both workers",
            info is not None and [m.id for m in info.models] == [NAME] and info.name == NAME and
            info.models[0].workers == 2, str(info).replace("\n", " ")[:400])
    rs = [generate(c, "", q, [DOC]) for q in QUESTIONS]
    h.check("start: requests without `model` are served by A's workers", served_by(rs, A_WORKERS),
            brief(rs))
    named = generate(c, NAME, QUESTIONS[0], [DOC])
    h.check("start: a request naming \"tiny\" is served with the same greedy answer",
            named.get("ok") and named["worker"] in A_WORKERS and rs[0].get("ok") and
            named["text"] == rs[0]["text"], brief([named]))
    return info.models[0].model_fingerprint, [r.get("text") for r in rs]


def scenario_join(c, fp_a, answers_a):
    for name in B_WORKERS:
        c.start_model_worker(name, MODEL_B)
    info = wait_models(c, 2, workers=4)
    models = {m.model_fingerprint: m for m in (info.models if info else [])}
    fp_b = next((fp for fp in models if fp != fp_a), "")
    id_a, id_b = f"{NAME}@{fp_a[:12]}", f"{NAME}@{fp_b[:12]}"
    h.check("join: GetModelInfo lists two models, named by their fingerprints, two workers each",
            fp_b and sorted(m.id for m in info.models) == sorted([id_a, id_b]) and
            all(m.workers == 2 for m in info.models) and info.workers == 4 and info.name == "",
            str(info).replace("\n", " ")[:600])
    if not fp_b:
        return None, None
    on_a = [generate(c, id_a, q, [DOC]) for q in QUESTIONS]
    on_a += [generate(c, id_a, f"Question {i}?") for i in range(3)]
    h.check(f"join: requests naming {id_a} reach only A's workers", served_by(on_a, A_WORKERS),
            brief(on_a))
    h.check("join: A's greedy answers are those from before B joined",
            [r.get("text") for r in on_a[:3]] == answers_a,
            f"{[r.get('text') for r in on_a[:3]]} vs {answers_a}")
    short_b = f"{NAME}@{fp_b[:6]}"
    on_b = [generate(c, short_b, q, [DOC]) for q in QUESTIONS]
    on_b += [generate(c, short_b, f"Question {i}?") for i in range(3)]
    h.check(f"join: requests naming {short_b} reach only B's workers", served_by(on_b, B_WORKERS),
            brief(on_b))
    h.check("join: B's weights answer otherwise (at least one of three greedy answers differs)",
            all(r.get("ok") for r in on_b[:3]) and
            [r.get("text") for r in on_b[:3]] != answers_a,
            f"{[r.get('text') for r in on_b[:3]]} vs {answers_a}")
    # Document keys are per model: B's copy of a fresh document is no hit for A.
    fresh = f"A fresh document {time.time()}: the archive sits east of the harbor."
    b1 = generate(c, id_b, "Where is the archive?", [fresh])
    b2 = generate(c, id_b, "What is east of the harbor?", [fresh])
    a1 = generate(c, id_a, "Where is the archive?", [fresh])
    h.check("join: a document computed on B is a hit for B's next request and not for A's",
            served_by([b1, b2], B_WORKERS) and served_by([a1], A_WORKERS) and
            (b1["hit"], b2["hit"], a1["hit"]) == (0, 1, 0),
            brief([b1, b2, a1]) + (f"; hits {b1.get('hit')}, {b2.get('hit')}, {a1.get('hit')}"))
    cli = subprocess.run([f"{c.args.bin_dir}/lazyattn", "client", "--router", c.router,
                          "--prompt", QUESTIONS[0], "--served-model", short_b, "--max-tokens", "4",
                          "--json"], capture_output=True, text=True, timeout=60)
    cli_worker = json.loads(cli.stdout).get("worker") if cli.returncode == 0 else None
    h.check(f"join: `lazyattn client --served-model {short_b}` is served by a B worker",
            cli_worker in B_WORKERS, (cli.stdout + cli.stderr)[-300:])
    bare = [generate(c, NAME, QUESTIONS[0]), generate(c, "", QUESTIONS[1])]
    h.check("join: \"tiny\" and no `model` go to the newer weights on a two-two tie",
            served_by(bare, B_WORKERS), brief(bare))
    status, listing = http(c, "GET", "/v1/models")
    ids = sorted(m.get("id") for m in listing.get("data", []))
    h.check("join: GET /v1/models lists both ids", status == 200 and ids == sorted([id_a, id_b]),
            f"{status} {listing}")
    status, chat = http(c, "POST", "/v1/chat/completions", {
        "model": id_a, "messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": 4,
        "temperature": 0})
    worker = chat.get("lazyattn", {}).get("worker")
    h.check("join: a chat completion naming A is served by an A worker and echoes the model",
            status == 200 and worker in A_WORKERS and chat.get("model") == id_a,
            f"{status} {str(chat)[:400]}")
    status, missing = http(c, "POST", "/v1/chat/completions", {
        "model": "tiny@ffffffffffff", "messages": [{"role": "user", "content": "hi"}]})
    h.check("join: an unknown model over HTTP is 404 model_not_found",
            status == 404 and missing.get("error", {}).get("code") == "model_not_found",
            f"{status} {missing}")
    return id_a, id_b


def scenario_leave(c, id_a):
    for name in A_WORKERS:
        c.procs[name].proc.send_signal(signal.SIGTERM)
    codes = {}
    for name in A_WORKERS:
        try:
            codes[name] = c.procs[name].proc.wait(30)
        except subprocess.TimeoutExpired:
            codes[name] = None
    h.check("leave: A's workers drain and exit 0", all(v == 0 for v in codes.values()),
            str(codes))
    info = wait_models(c, 1, workers=2)
    h.check("leave: GetModelInfo lists B alone, under the bare name again",
            info is not None and [m.id for m in info.models] == [NAME] and
            info.workers == 2 and info.id == NAME, str(info).replace("\n", " ")[:400])
    pinned = generate(c, id_a, QUESTIONS[0])
    h.check(f"leave: a request pinned to {id_a} is NOT_FOUND naming it",
            not pinned.get("ok") and pinned.get("code") == "NOT_FOUND" and
            id_a in pinned.get("message", ""), brief([pinned]))
    rest = [generate(c, NAME, QUESTIONS[0]), generate(c, "", QUESTIONS[1], [DOC])]
    h.check("leave: \"tiny\" and no `model` are served by B", served_by(rest, B_WORKERS),
            brief(rest))


def scenario_names(c):
    c.start_model_worker("worker-o0", MODEL_A, model_name="other")
    info = wait_models(c, 2, workers=3)
    h.check("names: GetModelInfo lists \"other\" and \"tiny\"",
            info is not None and [m.id for m in info.models] == ["other", NAME],
            str(info).replace("\n", " ")[:400])
    missing = generate(c, "", QUESTIONS[0])
    h.check("names: a request without `model` is INVALID_ARGUMENT naming `model` and the choices",
            not missing.get("ok") and missing.get("code") == "INVALID_ARGUMENT" and
            "model" in missing.get("message", "") and "other, tiny" in missing.get("message", ""),
            brief([missing]))
    other = [generate(c, "other", q) for q in QUESTIONS]
    tiny = [generate(c, NAME, q) for q in QUESTIONS]
    h.check("names: \"other\" reaches its worker and \"tiny\" B's",
            served_by(other, ("worker-o0",)) and served_by(tiny, B_WORKERS),
            brief(other + tiny))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default="build/bin")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lazyattn-models-") as tmp:
        load_messages(tmp)
        c = ModelCluster(args, tmp, workers=len(A_WORKERS), policy="cache_aware",
                         lease_ms=LEASE_MS)
        try:
            c.procs["kvdir"].wait_workers_alive(len(A_WORKERS), 30)
            fp_a, answers_a = scenario_start(c)
            id_a, _ = scenario_join(c, fp_a, answers_a)
            if id_a is not None:
                scenario_leave(c, id_a)
                scenario_names(c)
            for name in c.workers:
                if name not in A_WORKERS:
                    h.check(f"end: {name} is alive", c.alive(name),
                            f"exit status {c.exit_status(name)}")
        finally:
            c.stop()
            if not all(h.results):
                for name in ("router", *c.workers):
                    print(f"--- {name} log tail:\n{c.log_tail(name, 1500)}")
    h.finish()


if __name__ == "__main__":
    main()
