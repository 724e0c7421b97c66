"""Thin deterministic wrappers around llama-cpp-python used by the generators."""
from __future__ import annotations

import contextlib
import ctypes

import numpy as np


@contextlib.contextmanager
def _model_params_patch(**fields):
    """llama-cpp-python's Llama() exposes no knob for some llama_model_params fields
    (use_extra_bufts); patch llama_model_default_params() while the model loads."""
    import llama_cpp.llama_cpp as C

    orig = C.llama_model_default_params

    def patched():
        p = orig()
        for k, v in fields.items():
            setattr(p, k, v)
        return p

    C.llama_model_default_params = patched
    try:
        yield
    finally:
        C.llama_model_default_params = orig


def load(model_path: str, *, n_ctx: int = 512, n_threads: int = 2, logits_all: bool = False,
         f32_kv: bool = True, n_batch: int = 512, extra_bufts: bool = False, flash_attn: bool = False):
    """Load a model for reference runs.

    f32_kv: K/V cache in F32 (llama.cpp's default is F16, which would round K/V).
    flash_attn=False: attention is the plain F32 KQ -> softmax -> KQV graph.
    extra_bufts=False: no CPU "extra buffer types" (weight repacking, AMX). On this
    machine (Xeon with AMX-INT8) the AMX path of llama.cpp segfaults in
    ggml_backend_amx_mul_mat for Q4_1 batches of >1 token (cf. upstream issue
    ggml-org/llama.cpp#20824; PR #16315 notes AMX Q4_0/Q4_1 results were wrong).
    """
    import llama_cpp

    kw = {}
    if f32_kv:
        kw.update(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    with _model_params_patch(use_extra_bufts=extra_bufts):
        return _new_llama(model_path, n_ctx, n_batch, n_threads, logits_all, flash_attn, kw)


def _new_llama(model_path, n_ctx, n_batch, n_threads, logits_all, flash_attn, kw):
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(model_path),
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        n_gpu_layers=0,
        logits_all=logits_all,
        flash_attn=flash_attn,
        seed=0,
        verbose=bool(int(__import__("os").environ.get("REF_VERBOSE", "0"))),
        **kw,
    )


def settings_of(llm) -> dict:
    cp = llm.context_params
    return {
        "n_ctx": int(cp.n_ctx),
        "n_batch": int(cp.n_batch),
        "n_ubatch": int(cp.n_ubatch),
        "n_threads": int(cp.n_threads),
        "n_threads_batch": int(cp.n_threads_batch),
        "type_k": _ggml_type_name(int(cp.type_k)),
        "type_v": _ggml_type_name(int(cp.type_v)),
        "flash_attn": "disabled" if int(cp.flash_attn_type) == 0 else int(cp.flash_attn_type),
        "n_gpu_layers": 0,
        "use_extra_bufts": bool(llm.model_params.use_extra_bufts),
    }


def _ggml_type_name(t: int) -> str:
    return {0: "F32", 1: "F16", 8: "Q8_0", 30: "BF16"}.get(t, str(t))


def last_logits(llm) -> np.ndarray:
    """Logits of the last token of the last eval() (copied)."""
    import llama_cpp

    n_vocab = llm.n_vocab()
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32).copy()


def clear(llm) -> None:
    """Forget everything: n_tokens = 0 and an empty KV cache/memory."""
    import llama_cpp

    llm.reset()
    mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
    if mem is not None:
        llama_cpp.llama_memory_clear(mem, True)


def greedy(llm, prompt_ids: list[int], n_new: int, *, stop_at_eog: bool = True):
    """Greedy decode: eval the prompt as one batch, then feed one token at a time.

    argmax is taken by us (np.argmax: first index on exact ties), no sampler.
    Returns (generated_ids, first_step_logits, margins, eog_hit).
    margins[i] = top1 - top2 logit at step i (small => near-tie, fragile).
    """
    import llama_cpp

    vocab = llm._model.vocab
    clear(llm)
    llm.eval(list(prompt_ids))
    logits = last_logits(llm)
    first = logits.copy()
    out: list[int] = []
    margins: list[float] = []
    eog_hit = None
    for i in range(n_new):
        tok = int(np.argmax(logits))
        top2 = np.partition(logits, -2)[-2:]
        margins.append(float(top2.max() - top2.min()))
        out.append(tok)
        if stop_at_eog and llama_cpp.llama_vocab_is_eog(vocab, tok):
            eog_hit = tok
            break
        if i + 1 < n_new:
            llm.eval([tok])
            logits = last_logits(llm)
    return out, first, margins, eog_hit


def all_logits(llm, ids: list[int]) -> np.ndarray:
    """Logits at every position for ids (requires logits_all=True), shape [len(ids), n_vocab]."""
    clear(llm)
    llm.eval(list(ids))
    return np.array(llm.scores[: len(ids), :], dtype=np.float32, copy=True)


def topk(logits: np.ndarray, k: int = 10) -> list[tuple[int, float]]:
    order = np.argsort(-logits, kind="stable")[:k]
    return [(int(i), float(logits[i])) for i in order]
