"""Shared helpers for the independent-reference (llama.cpp) golden-data generators.

Everything in tools/reference/ computes reference data with code nobody in this
project wrote: llama.cpp (through the llama-cpp-python bindings) and gguf-py.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "tests" / "data"
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPECTED_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def sha256_file(path: str | os.PathLike, _cache: dict = {}) -> str:
    path = str(Path(path).resolve())
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _cache[key] = h.hexdigest()
    return _cache[key]


def generated_by() -> str:
    """The command that produced the current file, as typed from the repo root.

    tools/reference/make-golden exports REF_GENERATED_BY with its own command line;
    direct `python -m` invocations fall back to sys.argv.
    """
    cmd = os.environ.get("REF_GENERATED_BY")
    if cmd:
        return cmd
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("llama-cpp-python", "gguf", "numpy", "safetensors", "jinja2"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    try:
        import llama_cpp

        info = llama_cpp.llama_print_system_info()
        out["llama_cpp_system_info"] = info.decode() if isinstance(info, bytes) else str(info)
    except Exception:  # pragma: no cover - informational only
        pass
    out["machine"] = f"{platform.system()} {platform.machine()} ({os.cpu_count()} cpus)"
    return out


def header(model_path: str | os.PathLike | None = None, **extra) -> dict:
    h = {
        "generated_by": generated_by(),
        "generated_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": versions(),
    }
    if model_path is not None:
        h["model_file"] = Path(model_path).name
        h["model_sha256"] = sha256_file(model_path)
    h.update(extra)
    return h


def f32(x) -> float:
    """A Python float whose repr is the shortest string that round-trips the float32 value."""
    import numpy as np

    v = np.float32(x)
    if not math.isfinite(float(v)):
        raise ValueError(f"non-finite value {v}")
    return float(str(v))


def f32_list(arr) -> list:
    import numpy as np

    return [f32(v) for v in np.asarray(arr, dtype=np.float32).ravel()]


def write_json(path: str | os.PathLike, obj, *, compact_lists: bool = True) -> None:
    """Write JSON with one number-array per line (readable diffs, small files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, ensure_ascii=False, indent=1)
    if compact_lists:
        text = _collapse_number_arrays(text)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)


def _collapse_number_arrays(text: str) -> str:
    """Collapse innermost arrays that contain only numbers/short scalars onto one line."""
    import re

    pat = re.compile(r"\[\s*((?:-?[0-9][0-9eE+.\-]*|true|false|null)(?:\s*,\s*(?:-?[0-9][0-9eE+.\-]*|true|false|null))*)\s*\]")
    return pat.sub(lambda m: "[" + ", ".join(s.strip() for s in m.group(1).split(",")) + "]", text)


def token_piece(llm, token: int, special: bool = False) -> bytes:
    """llama_token_to_piece with a large buffer.

    (llama-cpp-python 0.3.36's Llama.detokenize uses a 32-byte buffer and silently
    truncates longer pieces, e.g. SmolLM2 token 28909 = 64 x '='.)
    """
    import ctypes

    import llama_cpp

    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, int(token), buf, size, 0, special)
        if n >= 0:
            return buf.raw[:n]
        size = -n + 1


def detokenize(llm, ids, special: bool = False) -> bytes:
    return b"".join(token_piece(llm, t, special) for t in ids)


def log(*a) -> None:
    print("[ref]", *a, file=sys.stderr, flush=True)
