#!/usr/bin/env python3
"""The router's OpenAI-compatible HTTP API on real processes, driven by the official `openai`
Python SDK (tools/setup-test-venv installs it) and by curl:

  secured cluster (TLS with the router's certificate, API keys):
  - /health, /v1/models and /v1/models/{id} (models.retrieve);
  - greedy chat and completions, streamed and not, equal to the gRPC API's answer for the same
    request (`lazyattn client`), with and without documents; the second request with the same
    documents reports them hit (usage.prompt_tokens_details.cached_tokens, lazyattn.documents_hit);
  - multi-turn chat equal to /v1/completions given the chat template's rendering of the same turns;
  - stop strings; stream_options.include_usage; SSE framing as curl -N sees it;
  - logit_bias on both endpoints: +100 forces a token at every step, -100 bans the greedy first
    token (the runner-up takes its place), and malformed or out-of-range biases are 400s;
  - errors with their HTTP codes: 400 (bad field, bad JSON), 401 (no key, unknown key), 403 (a key
    without the generate scope), 404 (unknown model, unknown path), 413 (body over the limit),
    429 (a key over its in-flight cap);
  plaintext cluster with one request in flight at most:
  - 429 while a request holds the only slot (its worker frozen with SIGSTOP), 503 once the only
    worker is gone.

Prints one line per check and "N passed, M failed" last; exits non-zero on any failure.
"""
import argparse
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import httpx
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_harness import REPO, Cluster, check, finish  # noqa: E402

GEN_CERTS = os.path.join(REPO, "tools", "gen-certs")
HTTP_RE = re.compile(r"lazyattn-router http on (https?://\S+)")
SYSTEM = "You answer in one word."
QUESTION = "Which river flows through Paris?"
DOCS = ["The Seine flows through Paris.\n", "The Loire is the longest river in France.\n"]


def http_url(c, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(c.procs["router"].log_path, errors="replace") as f:
            m = HTTP_RE.search(f.read())
        if m:
            return m.group(1)
        time.sleep(0.1)
    raise RuntimeError("the router printed no HTTP address")


def grpc_answer(c, prompt, docs=(), chat=False, system=None, max_tokens=12, extra=()):
    """The gRPC API's answer (`lazyattn client --json`) for the same greedy request."""
    argv = ["--temperature", "0", *extra]
    if chat:
        argv.append("--chat")
    if system:
        argv += ["--system", system]
    return c.request(list(docs), prompt, max_tokens=max_tokens, extra=argv)


def raw(url, body=None, key=None, ca=None, method=None, headers=None):
    """(status, parsed JSON or text) of one plain HTTP request."""
    req = urllib.request.Request(url, data=body, method=method or ("POST" if body else "GET"))
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    ctx = ssl.create_default_context(cafile=ca) if ca else None
    try:
        with urllib.request.urlopen(req, timeout=60, context=ctx) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def stream_text(client, **kw):
    """Concatenated deltas, the finish reason, the usage chunk (or None) and the chunk count."""
    text, finish_reason, usage, chunks, ext = "", None, None, 0, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason:
                finish_reason = choice.finish_reason
                ext = (chunk.model_extra or {}).get("lazyattn")
    return text, finish_reason, usage, chunks, ext


def secured_checks(args, tmp):
    certs = os.path.join(tmp, "certs")
    subprocess.run([GEN_CERTS, "--out", certs, "--workers", "2"], check=True, capture_output=True)
    # A key with only the admin scope: refused the generate scope (403).
    subprocess.run([GEN_CERTS, "api-key", "ops", "admin", "--out", certs], check=True,
                   capture_output=True)
    with open(f"{certs}/ops.key") as f:
        admin_only = f.read().strip()
    # A key with one request in flight at most (key_limits.h): its second concurrent request 429.
    subprocess.run([GEN_CERTS, "api-key", "capped", "generate", "--out", certs], check=True,
                   capture_output=True)
    with open(f"{certs}/api-keys.yaml", "a") as f:
        f.write("    limits: {max_in_flight: 1}\n")  # continues the entry gen-certs just wrote
    with open(f"{certs}/capped.key") as f:
        capped_key = f.read().strip()
    ca = f"{certs}/ca.crt"
    with open(f"{certs}/demo.key") as f:
        key = f.read().strip()
    docs = []
    for i, text in enumerate(DOCS):
        docs.append(os.path.join(tmp, f"doc{i}.txt"))
        with open(docs[-1], "w") as f:
            f.write(text)
    # One worker: document hits are then certain (with two, cache-aware routing may still send a
    # request elsewhere before kvdir hears of the documents; cluster_test covers placement).
    c = Cluster(args, tempfile.mkdtemp(dir=tmp), 1, "cache_aware", certs=certs,
                router_extra="http:\n  listen: 127.0.0.1:0\n  max_body_bytes: 65536\n")
    try:
        base = http_url(c)
        check("HTTP listener on TLS with the router's certificate", base.startswith("https://"), base)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0,
                               http_client=httpx.Client(verify=ca, timeout=60))
        status, body = raw(f"{base}/health", ca=ca)
        check("GET /health without a key: 200 with live workers", status == 200 and body["workers"] >= 1,
              str(body))
        models = client.models.list()
        model = models.data[0].id if models.data else ""
        check("GET /v1/models names the served model", model != "", str(models))
        one = client.models.retrieve(model)
        check("GET /v1/models/{id} (models.retrieve) returns the listed model",
              one.id == model and one.object == "model", str(one))
        try:
            client.models.retrieve("no-such-model")
            check("GET /v1/models/{unknown}: 404 model_not_found", False, "answered")
        except openai.NotFoundError as e:
            body = e.body if isinstance(e.body, dict) else {}
            body = body.get("error", body)  # the SDK hands over the error object or the body
            check("GET /v1/models/{unknown}: 404 model_not_found",
                  e.status_code == 404 and body.get("code") == "model_not_found", str(e.body))

        # Greedy chat equals the gRPC API's answer (system + question through the chat template).
        want = grpc_answer(c, QUESTION, chat=True, system=SYSTEM)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
        got = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                             max_tokens=12)
        check("chat, not streamed: the gRPC API's text and token count",
              want.get("ok") and got.choices[0].message.content == want["text"] and
              got.usage.completion_tokens == want["completion_tokens"] and
              got.usage.prompt_tokens == want["prompt_tokens"],
              f"http={got.choices[0].message.content!r} grpc={want.get('text')!r}")
        check("finish_reason as OpenAI names it", got.choices[0].finish_reason == want.get("finish_reason")
              and got.choices[0].finish_reason in ("stop", "length"), got.choices[0].finish_reason)
        text, reason, usage, chunks, _ = stream_text(
            client, model=model, messages=messages, temperature=0, max_tokens=12,
            stream_options={"include_usage": True})
        check("chat, streamed: the same text in deltas, then a usage chunk",
              text == want.get("text") and reason == got.choices[0].finish_reason and
              usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
              and usage.completion_tokens == want.get("completion_tokens"),
              f"{text!r} {reason} {usage} chunks={chunks}")
        text, _, usage, _, _ = stream_text(client, model=model, messages=messages, temperature=0,
                                           max_tokens=12)
        check("streamed without include_usage: no usage chunk", usage is None and text == want.get("text"))

        # Completions (no template) equal the gRPC API without --chat.
        want = grpc_answer(c, "The capital of France is")
        got = client.completions.create(model=model, prompt="The capital of France is",
                                        temperature=0, max_tokens=12)
        check("completions: the gRPC API's text", want.get("ok") and got.choices[0].text == want["text"],
              f"{got.choices[0].text!r} vs {want.get('text')!r}")
        streamed = "".join(ch.choices[0].text for ch in client.completions.create(
            model=model, prompt="The capital of France is", temperature=0, max_tokens=12,
            stream=True) if ch.choices)
        check("completions, streamed: the same text", streamed == want.get("text"), repr(streamed))

        # Log probabilities: the gRPC API's, one per token, in OpenAI's forms.
        want = grpc_answer(c, QUESTION, chat=True, system=SYSTEM, extra=["--logprobs"])
        got = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                             max_tokens=12, logprobs=True)
        entries = got.choices[0].logprobs.content if got.choices[0].logprobs else []
        close = lambda a, b: len(a) == len(b) and all(abs(x - y) <= 1e-6 for x, y in zip(a, b))
        check("chat logprobs: the gRPC API's, one entry per token, each with its bytes",
              want.get("ok") and close([e.logprob for e in entries], want.get("logprobs", [])) and
              len(entries) == want.get("completion_tokens") and
              all(e.bytes is not None and e.top_logprobs == [] for e in entries),
              f"http={[e.logprob for e in entries]} grpc={want.get('logprobs')}")
        # (Bytes that are no UTF-8 alone show as U+FFFD in the text; Python and the worker may
        # replace a broken sequence by one or by several.)
        joined = b"".join(bytes(e.bytes) for e in entries)
        one_fffd = lambda t: re.sub("\ufffd+", "\ufffd", t)
        check("chat logprobs: the tokens' bytes spell the text",
              one_fffd(joined.decode("utf-8", "replace")) == one_fffd(got.choices[0].message.content),
              f"{joined!r} vs {got.choices[0].message.content!r}")
        streamed = [e.logprob for ch in client.chat.completions.create(
            model=model, messages=messages, temperature=0, max_tokens=12, logprobs=True,
            stream=True) for choice in ch.choices if choice.logprobs
            for e in choice.logprobs.content or []]
        check("chat logprobs, streamed: the same entries", close(streamed, [e.logprob for e in entries]),
              f"{streamed}")
        completion = client.completions.create(model=model, prompt="The capital of France is",
                                               temperature=0, max_tokens=12, logprobs=0)
        lp = completion.choices[0].logprobs
        check("completions logprobs 0: tokens, token_logprobs and text_offset, one per token",
              lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) ==
              completion.usage.completion_tokens and lp.text_offset[0] == 0 and
              lp.text_offset == sorted(lp.text_offset), str(lp))
        # Alternatives: the gRPC API's, k per token, most likely first; greedy, the chosen token
        # heads them with its own logprob.
        want = grpc_answer(c, QUESTION, chat=True, system=SYSTEM,
                           extra=["--logprobs", "--top-logprobs", "3"])
        got = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                             max_tokens=12, logprobs=True, top_logprobs=3)
        entries = got.choices[0].logprobs.content if got.choices[0].logprobs else []
        want_top = want.get("top_logprobs", [])
        check("chat top_logprobs 3: the gRPC API's alternatives, ranked, the chosen token first",
              want.get("ok") and len(entries) == len(want_top) == want.get("completion_tokens") and
              all(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token and
                  e.top_logprobs[0].logprob == e.logprob and
                  all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:])) and
                  all(t.bytes is not None for t in e.top_logprobs) and
                  close([t.logprob for t in e.top_logprobs], [w["logprob"] for w in ws])
                  for e, ws in zip(entries, want_top)),
              f"http={[[t.logprob for t in e.top_logprobs] for e in entries]} grpc={want_top}")
        streamed = [[t.logprob for t in e.top_logprobs] for ch in client.chat.completions.create(
            model=model, messages=messages, temperature=0, max_tokens=12, logprobs=True,
            top_logprobs=3, stream=True) for choice in ch.choices if choice.logprobs
            for e in choice.logprobs.content or []]
        check("chat top_logprobs, streamed: the same alternatives",
              streamed == [[t.logprob for t in e.top_logprobs] for e in entries], f"{streamed}")
        completion = client.completions.create(model=model, prompt="The capital of France is",
                                               temperature=0, max_tokens=12, logprobs=2)
        lp = completion.choices[0].logprobs
        check("completions logprobs 2: one {token: logprob} object per token, the chosen one in it",
              lp is not None and lp.top_logprobs is not None and
              len(lp.top_logprobs) == len(lp.tokens) == completion.usage.completion_tokens and
              all(1 <= len(alts) <= 3 and alts.get(tok) == tlp
                  for alts, tok, tlp in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs)),
              str(lp))
        for name, kwargs in [("top_logprobs 3 without logprobs", {"top_logprobs": 3}),
                             ("top_logprobs 21", {"logprobs": True, "top_logprobs": 21})]:
            refused = None
            try:
                client.chat.completions.create(model=model, messages=messages, max_tokens=4,
                                               **kwargs)
            except openai.BadRequestError as e:
                refused = e
            check(f"{name}: 400 naming top_logprobs",
                  refused is not None and (refused.body or {}).get("param") == "top_logprobs",
                  str(refused))

        # logit_bias: the ids of the greedy first token and of its runner-up from the gRPC API
        # (`lazyattn client --json` reports ids), their bytes from the same request over HTTP.
        want = grpc_answer(c, QUESTION, chat=True, system=SYSTEM, max_tokens=6,
                           extra=["--logprobs", "--top-logprobs", "2"])
        plain = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                               max_tokens=6, logprobs=True, top_logprobs=2)
        entries = plain.choices[0].logprobs.content if plain.choices[0].logprobs else []
        ranked = (want.get("top_logprobs") or [[]])[0]
        ok = want.get("ok") and len(ranked) == 2 and entries and len(entries[0].top_logprobs) == 2
        first_id, second_id = (ranked[0]["id"], ranked[1]["id"]) if ok else (0, 0)
        first_bytes = entries[0].bytes if ok else None
        second_bytes = entries[0].top_logprobs[1].bytes if ok else None
        check("logit_bias setup: the first token and its runner-up, as ids (gRPC) and bytes (HTTP)",
              ok and want["token_ids"][0] == first_id and first_id != second_id and
              close([t.logprob for t in entries[0].top_logprobs], [w["logprob"] for w in ranked])
              and second_bytes and second_bytes != first_bytes,
              f"grpc={ranked} http={entries[0].top_logprobs if entries else None}")
        forced = client.chat.completions.create(
            model=model, messages=messages, temperature=0, max_tokens=6, logprobs=True,
            logit_bias={str(second_id): 100})
        got = forced.choices[0].logprobs.content if forced.choices[0].logprobs else []
        check("logit_bias +100 on the runner-up: every token is it, at a biased logprob near 0",
              len(got) == 6 and all(e.bytes == second_bytes and e.logprob > -1e-3 for e in got),
              f"{[(e.bytes, e.logprob) for e in got]} want {second_bytes}")
        banned = client.chat.completions.create(
            model=model, messages=messages, temperature=0, max_tokens=2, logprobs=True,
            logit_bias={str(first_id): -100.0})
        got = banned.choices[0].logprobs.content if banned.choices[0].logprobs else []
        check("logit_bias -100 on the greedy first token: the runner-up comes first instead",
              got and got[0].bytes == second_bytes and got[0].bytes != first_bytes,
              f"{[e.bytes for e in got]} first={first_bytes} runner-up={second_bytes}")
        completion = client.completions.create(model=model, prompt="The capital of France is",
                                               temperature=0, max_tokens=4, logprobs=0,
                                               logit_bias={str(second_id): 100})
        lp = completion.choices[0].logprobs
        check("completions logit_bias +100: every token is the biased one",
              lp is not None and len(lp.tokens) == 4 and
              all(t == entries[0].top_logprobs[1].token for t in lp.tokens),
              f"{lp.tokens if lp else None} want {entries[0].top_logprobs[1].token if entries else None}")

        # Documents: placed as the gRPC API places them, and hit on the second request.
        want = grpc_answer(c, QUESTION, docs=docs, chat=True, system=SYSTEM)
        body = {"documents": [{"id": f"doc{i}", "text": t} for i, t in enumerate(DOCS)]}
        got = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                             max_tokens=12, extra_body=body)
        ext = got.model_extra.get("lazyattn", {})
        check("chat with documents: the gRPC API's text", want.get("ok") and
              got.choices[0].message.content == want["text"] and ext.get("documents") == 2,
              f"{got.choices[0].message.content!r} vs {want.get('text')!r} {ext}")
        check("documents hit after the gRPC request cached them (cached_tokens, documents_hit)",
              ext.get("documents_hit") == 2 and got.usage.prompt_tokens_details.cached_tokens > 0,
              f"{ext} {got.usage}")
        text, _, _, _, ext = stream_text(client, model=model, messages=messages, temperature=0,
                                         max_tokens=12, extra_body=body)
        check("streamed with documents: same text, documents reported on the last chunk",
              text == want.get("text") and (ext or {}).get("documents_hit") == 2, f"{text!r} {ext}")

        # Multi-turn: the conversation through the template equals the template's text given to
        # /v1/completions (the tiny model's template is ChatML).
        turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a river."},
                 {"role": "assistant", "content": "Seine"}, {"role": "user", "content": "Another?"}]
        rendered = "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in turns) + \
            "<|im_start|>assistant\n"
        multi = client.chat.completions.create(model=model, messages=turns, temperature=0, max_tokens=12)
        plain = client.completions.create(model=model, prompt=rendered, temperature=0, max_tokens=12)
        check("multi-turn chat: the template's rendering of every turn",
              multi.choices[0].message.content == plain.choices[0].text and
              multi.usage.prompt_tokens == plain.usage.prompt_tokens,
              f"{multi.choices[0].message.content!r} vs {plain.choices[0].text!r}")
        text, _, _, _, _ = stream_text(client, model=model, messages=turns, temperature=0, max_tokens=12)
        check("multi-turn chat, streamed: the same text", text == multi.choices[0].message.content)
        with_docs = client.chat.completions.create(model=model, messages=turns, temperature=0,
                                                   max_tokens=12, extra_body=body)
        check("multi-turn chat with documents (in the last user turn): documents hit",
              with_docs.model_extra["lazyattn"]["documents_hit"] == 2, str(with_docs.model_extra))

        # Stop strings: generation ends before the first occurrence.
        full = client.completions.create(model=model, prompt="The capital of France is",
                                         temperature=0, max_tokens=24).choices[0].text
        # A printable ASCII character that first occurs after the start (the tiny model's text has
        # U+FFFD for bytes that are not UTF-8 alone, which no stop string can match).
        at = next((i for i in range(1, len(full)) if full[i].isascii() and full[i].isprintable()
                   and full[i] not in full[:i]), None)
        stop = full[at] if at is not None else None
        if stop:
            cut = client.completions.create(model=model, prompt="The capital of France is",
                                            temperature=0, max_tokens=24, stop=[stop, "\x00never"])
            check("stop strings: the text before the first occurrence, finish_reason stop",
                  cut.choices[0].text == full[:at] and cut.choices[0].finish_reason == "stop",
                  f"stop={stop!r} full={full!r} cut={cut.choices[0].text!r}")
        else:
            check("stop strings: the model produced text to stop in", False, repr(full))

        # n: choice i is the request with seed + i, whole and streamed; the prompt is counted once.
        sampled = dict(model=model, messages=messages, temperature=1.0, max_tokens=12)
        many = client.chat.completions.create(n=3, seed=11, **sampled)
        alone = [client.chat.completions.create(seed=11 + i, **sampled) for i in range(3)]
        check("n=3 seeded: choice i is the answer of seed + i, index i",
              [ch.index for ch in many.choices] == [0, 1, 2] and
              [ch.message.content for ch in many.choices] ==
              [a.choices[0].message.content for a in alone] and
              many.usage.prompt_tokens == alone[0].usage.prompt_tokens and
              many.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone),
              f"{[ch.message.content for ch in many.choices]} vs "
              f"{[a.choices[0].message.content for a in alone]} {many.usage}")
        texts, finished = ["", "", ""], [None, None, None]
        for ch in client.chat.completions.create(n=3, seed=11, stream=True, **sampled):
            for choice in ch.choices:
                texts[choice.index] += choice.delta.content or ""
                finished[choice.index] = choice.finish_reason or finished[choice.index]
        check("n=3 seeded, streamed: the same choices, each finished",
              texts == [ch.message.content for ch in many.choices] and
              finished == [ch.finish_reason for ch in many.choices], f"{texts} {finished}")
        prompts = client.completions.create(model=model, prompt="The capital of France is",
                                            temperature=0, max_tokens=12, n=2)
        check("completions n=2 greedy: two equal choices",
              len(prompts.choices) == 2 and prompts.choices[0].text == prompts.choices[1].text,
              str(prompts.choices))

        # SSE framing as curl -N sees it.
        p = subprocess.run(["curl", "-sN", "-i", "--cacert", ca, "-H", f"Authorization: Bearer {key}",
                            "-H", "Content-Type: application/json", "-d", json.dumps({
                                "model": model, "messages": messages, "temperature": 0,
                                "max_tokens": 6, "stream": True}),
                            f"{base}/v1/chat/completions"], capture_output=True, text=True, timeout=60)
        head, _, sse = p.stdout.replace("\r\n", "\n").partition("\n\n")
        events = sse.split("\n\n")
        check("curl -N: text/event-stream, `data: ` events separated by blank lines, [DONE] last",
              "content-type: text/event-stream" in head.lower() and events[-1] == "" and
              events[-2] == "data: [DONE]" and all(e.startswith("data: {") for e in events[:-2]) and
              json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant",
              p.stdout[-300:])

        # Errors, as the SDK raises them.
        def raises(name, exc, call, status, param=None):
            try:
                call()
                check(name, False, "no error")
            except exc as e:
                body = e.body if isinstance(e.body, dict) else {}
                check(name, e.status_code == status and (param is None or body.get("param") == param),
                      f"{e.status_code} {body}")
        ask = dict(model=model, messages=messages, max_tokens=2)
        raises("n=129: 400 naming n", openai.BadRequestError,
               lambda: client.chat.completions.create(n=129, **ask), 400, "n")
        capped = openai.OpenAI(base_url=f"{base}/v1", api_key=capped_key, max_retries=0,
                               http_client=httpx.Client(verify=ca, timeout=60))
        raises("n=2 on a key with one place in flight: 400 naming n (no retry could pass)",
               openai.BadRequestError, lambda: capped.chat.completions.create(n=2, **ask), 400, "n")
        raises("max_tokens over the limit: 400 naming max_tokens", openai.BadRequestError,
               lambda: client.chat.completions.create(**dict(ask, max_tokens=10**6)), 400, "max_tokens")
        raises("logit_bias 101: 400 naming logit_bias", openai.BadRequestError,
               lambda: client.chat.completions.create(**dict(ask, logit_bias={"7": 101})), 400,
               "logit_bias")
        raises("logit_bias key \"abc\": 400 naming logit_bias", openai.BadRequestError,
               lambda: client.completions.create(model=model, prompt="x", max_tokens=2,
                                                 logit_bias={"abc": 1}), 400, "logit_bias")
        raises("last turn not a user turn: 400 naming the message", openai.BadRequestError,
               lambda: client.chat.completions.create(model=model, messages=turns[:3]), 400,
               "messages[2].role")
        raises("unknown model: 404", openai.NotFoundError,
               lambda: client.chat.completions.create(**dict(ask, model="gpt-4")), 404)
        status, body = raw(f"{base}/v1/chat/completions", json.dumps(ask).encode(), ca=ca)
        check("no API key: 401 in OpenAI's error shape",
              status == 401 and body["error"]["type"] == "authentication_error", str(body))
        wrong = openai.OpenAI(base_url=f"{base}/v1", api_key="not-a-key", max_retries=0,
                              http_client=httpx.Client(verify=ca))
        raises("unknown API key: 401", openai.AuthenticationError,
               lambda: wrong.chat.completions.create(**ask), 401)
        ops = openai.OpenAI(base_url=f"{base}/v1", api_key=admin_only, max_retries=0,
                            http_client=httpx.Client(verify=ca))
        raises("key without the generate scope: 403", openai.PermissionDeniedError,
               lambda: ops.chat.completions.create(**ask), 403)
        status, body = raw(f"{base}/v1/chat/completions", b"{not json", key=key, ca=ca)
        check("malformed JSON: 400 in OpenAI's error shape",
              status == 400 and body["error"]["type"] == "invalid_request_error", str(body))
        big = json.dumps({"model": model, "messages": [{"role": "user", "content": "x" * 70000}]})
        status, body = raw(f"{base}/v1/chat/completions", big.encode(), key=key, ca=ca)
        check("body over http.max_body_bytes: 413", status == 413 and "error" in body, str(body)[:200])
        status, body = raw(f"{base}/v1/embeddings", b"{}", key=key, ca=ca)
        check("unknown path: 404 in OpenAI's error shape", status == 404 and "error" in body, str(body))
        worker = c.procs["worker-0"].proc
        os.kill(worker.pid, signal.SIGSTOP)  # the key's first request stays in flight
        held = {}
        t = threading.Thread(target=lambda: held.update(
            r=capped.chat.completions.create(**ask).choices[0].finish_reason))
        t.start()
        time.sleep(1.0)
        try:
            capped.chat.completions.create(**ask)
            check("a key at its max_in_flight: 429 naming the key", False, "no error")
        except openai.RateLimitError as e:
            check("a key at its max_in_flight: 429 naming the key",
                  e.status_code == 429 and "capped" in str(e.body), str(e.body))
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        t.join(60)
        check("the key's held request completes", held.get("r") in ("stop", "length"), str(held))
        r = c.request([], "still there?", max_tokens=1)
        check("the gRPC API still answers after all that", r.get("ok"), str(r)[:200])
    finally:
        c.stop()


def overload_checks(args, tmp):
    c = Cluster(args, tempfile.mkdtemp(dir=tmp), 1, "least_loaded",
                router_limits={"max_inflight_requests": 1},
                router_extra="http:\n  listen: 127.0.0.1:0\n")
    try:
        base = http_url(c)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0,
                               http_client=httpx.Client(timeout=60))
        ask = dict(model="", messages=[{"role": "user", "content": QUESTION}], max_tokens=2,
                   temperature=0)
        worker = c.procs["worker-0"].proc
        os.kill(worker.pid, signal.SIGSTOP)  # the first request holds the only slot
        held = {}
        t = threading.Thread(target=lambda: held.update(
            r=client.chat.completions.create(**ask).choices[0].finish_reason))
        t.start()
        time.sleep(1.0)
        try:
            client.chat.completions.create(**ask)
            check("second request while the only slot is held: 429", False, "no error")
        except openai.RateLimitError as e:
            check("second request while the only slot is held: 429", e.status_code == 429, str(e.body))
        os.kill(worker.pid, signal.SIGCONT)
        t.join(60)
        check("the held request completes once its worker runs again", held.get("r") in ("stop", "length"),
              str(held))
        worker.kill()
        worker.wait()
        try:
            client.chat.completions.create(**ask)
            check("no live worker: 503", False, "no error")
        except openai.APIStatusError as e:
            check("no live worker: 503", e.status_code == 503, f"{e.status_code} {e.body}")
        deadline = time.monotonic() + 20
        status, body = raw(f"{base}/health")
        while status != 503 and time.monotonic() < deadline:
            time.sleep(0.2)
            status, body = raw(f"{base}/health")
        check("GET /health: 503 once the router knows no live worker", status == 503, str(body))
    finally:
        c.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(REPO, "build", "bin"))
    args = ap.parse_args()
    os.chdir(REPO)
    with tempfile.TemporaryDirectory() as tmp:
        secured_checks(args, tmp)
        overload_checks(args, tmp)
    finish()


if __name__ == "__main__":
    main()
