#!/usr/bin/env python3
"""A LazyAttention Cluster client an application backend can copy: sends a RAG request (documents
plus a question) to the router over gRPC and streams the answer.

  pip install -r deploy/examples/python/requirements.txt
  python3 deploy/examples/python/rag_client.py --router HOST:PORT \
      --ca build/certs/ca.crt --api-key-file build/certs/demo.key \
      --doc deploy/examples/docs/seine.txt --question "Which river flows through Paris?"

The router speaks TLS and wants an API key (`authorization: Bearer KEY` metadata) unless it was
started with `insecure: true`; then leave out --ca and the key. The defaults come from the
variables tools/cluster sets: LAZYATTN_ROUTER, LAZYATTN_CA, LAZYATTN_API_KEY(_FILE).

The Python stubs are generated from proto/lazyattn/v1/*.proto on first use (grpcio-tools); in a
real backend, generate them once at build time instead.
"""
import argparse
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def load_stubs():
    out = tempfile.mkdtemp(prefix="lazyattn_stubs_")
    proto_dir = os.path.join(REPO, "proto")
    for name in ("inference", "worker", "kvdir"):
        rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
                          os.path.join(proto_dir, "lazyattn", "v1", f"{name}.proto")])
        if rc != 0:
            sys.exit(f"protoc failed on {name}.proto")
    sys.path.insert(0, out)
    from lazyattn.v1 import inference_pb2, inference_pb2_grpc  # noqa: E402
    return inference_pb2, inference_pb2_grpc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--router", default=os.environ.get("LAZYATTN_ROUTER", "127.0.0.1:7000"))
    ap.add_argument("--doc", action="append", default=[], help="document file (repeatable)")
    ap.add_argument("--question", required=True)
    ap.add_argument("--system", default="Answer in one sentence using the documents.")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--ca", default=os.environ.get("LAZYATTN_CA"),
                    help="CA certificate (PEM) of the router's TLS; none: plaintext")
    ap.add_argument("--api-key", default=os.environ.get("LAZYATTN_API_KEY"))
    ap.add_argument("--api-key-file", default=os.environ.get("LAZYATTN_API_KEY_FILE"))
    args = ap.parse_args()
    pb, pb_grpc = load_stubs()

    # Request text fields are `bytes` holding UTF-8 (the servers check it and name a bad field);
    # response text fields are `string`.
    documents = []
    for path in args.doc:
        with open(path, "rb") as f:
            documents.append(pb.Document(id=os.path.basename(path).encode(), text=f.read()))
    request = pb.GenerateRequest(
        system=args.system.encode(), documents=documents, question=args.question.encode(), chat=True,
        cache_mode=pb.CACHE_MODE_LAZY,
        sampling=pb.SamplingParams(max_tokens=args.max_tokens, temperature=0.0))

    key = args.api_key
    if key is None and args.api_key_file:
        with open(args.api_key_file) as f:
            key = f.read().strip()
    metadata = [("authorization", f"Bearer {key}")] if key else []
    if args.ca:
        with open(args.ca, "rb") as f:
            channel = grpc.secure_channel(args.router, grpc.ssl_channel_credentials(f.read()))
    else:
        channel = grpc.insecure_channel(args.router)
    with channel:
        stub = pb_grpc.InferenceStub(channel)
        try:
            for response in stub.Generate(request, timeout=args.timeout, metadata=metadata):
                if response.HasField("token"):
                    print(response.token.text, end="", flush=True)
                else:
                    final = response.final
                    u = final.usage
                    print(f"\n[worker {final.worker}, documents hit {u.documents_hit}/{u.documents}, "
                          f"cached {u.cached_tokens}/{u.prompt_tokens} prompt tokens, "
                          f"TTFT {final.ttft_ms:.0f} ms]")
        except grpc.RpcError as e:
            # INVALID_ARGUMENT names the bad field; UNAVAILABLE means no worker could serve it;
            # UNAUTHENTICATED: a missing or unknown key; PERMISSION_DENIED: the key's scopes.
            sys.exit(f"\n{e.code().name}: {e.details()}")


if __name__ == "__main__":
    main()
