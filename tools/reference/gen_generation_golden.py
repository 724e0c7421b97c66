"""Write tests/data/generation_golden.json: llama.cpp greedy decoding on SmolLM2.

The golden numbers come from llama.cpp running an all-F32 copy of the GGUF
(every tensor dequantized with gguf-py), F32 KV cache, no flash attention,
n_threads=2: an fp32 reference of the quantized model's *weights*.
For information, the same prompts are also run on the original Q4_1 file
(llama.cpp then quantizes activations to 8 bits inside its matmuls).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

import refcommon as rc
import llamacpp_run as lr
from gguf_f32 import dequantize_to_f32

N_NEW = 32

PROMPTS = [
    ("question", "What is the capital of France?"),
    ("story", "Once upon a time, in a small village by the sea, there lived"),
    ("code", "Write a Python function that checks whether a number is prime."),
    ("list", "List five fruits that are red."),
    ("math", "A train travels at 60 miles per hour for 3 hours. How many miles does it travel?"),
    ("non_english", "\u00bfCu\u00e1l es la capital de Espa\u00f1a? Responde en espa\u00f1ol."),
    ("code_completion", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("long_context",
     "Read the text and answer the question.\n\nText: The Amazon rainforest covers much of the Amazon basin "
     "of South America. The basin is 7,000,000 square kilometres, of which 5,500,000 square kilometres are "
     "covered by the rainforest. This region includes territory belonging to nine nations and 3,344 formally "
     "acknowledged indigenous territories. The majority of the forest, 60%, is in Brazil, followed by Peru "
     "with 13%, Colombia with 10%, and with minor amounts in Bolivia, Ecuador, French Guiana, Guyana, "
     "Suriname, and Venezuela.\n\nQuestion: Which country contains most of the Amazon rainforest?"),
]


def cut_at_eog(ids: list[int], vocab) -> tuple[list[int], int | None]:
    import llama_cpp

    for i, t in enumerate(ids):
        if llama_cpp.llama_vocab_is_eog(vocab, t):
            return ids[: i + 1], t
    return list(ids), None


def render_chat_template(template: str, messages: list[dict], *, bos_token: str, eos_token: str,
                         add_generation_prompt: bool = True) -> str:
    """Render like transformers' apply_chat_template does (jinja2 sandbox, trim/lstrip blocks)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=bos_token, eos_token=eos_token)


def llama_cpp_builtin_template(llm, messages: list[dict], add_ass: bool = True) -> str | None:
    """llama.cpp's own (non-jinja) llama_chat_apply_template with the model's template string."""
    import ctypes

    import llama_cpp

    tmpl = llama_cpp.llama_model_chat_template(llm._model.model, None)
    if tmpl is None:
        return None
    msgs = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        r, c = m["role"].encode(), m["content"].encode()
        keep += [r, c]
        msgs[i].role, msgs[i].content = r, c
    size = 8192
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(tmpl, msgs, len(messages), add_ass, buf, size)
    if n < 0:
        return None
    if n > size:
        buf = ctypes.create_string_buffer(n)
        n = llama_cpp.llama_chat_apply_template(tmpl, msgs, len(messages), add_ass, buf, n)
    return buf.raw[:n].decode("utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=str(rc.DEFAULT_MODEL))
    ap.add_argument("--f32-model", default=None,
                    help="where to write/read the dequantized F32 GGUF (default: models/<stem>.F32.gguf)")
    ap.add_argument("--out", default=str(rc.DATA_DIR / "generation_golden.json"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import gguf
    import llama_cpp

    model = Path(args.model)
    f32_path = Path(args.f32_model) if args.f32_model else model.with_name(model.name.replace(".Q4_1", "") .removesuffix(".gguf") + ".F32.gguf")
    if model.name.endswith(".F32.gguf"):
        raise SystemExit("--model must be the original (quantized) GGUF")
    # Always regenerate the F32 copy (a few seconds) so it is known to match --model.
    dequantize_to_f32(model, f32_path, log=rc.log)

    reader = gguf.GGUFReader(str(model))
    template = reader.fields["tokenizer.chat_template"].contents()
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    bos_tok = tokens[reader.fields["tokenizer.ggml.bos_token_id"].contents()]
    eos_tok = tokens[reader.fields["tokenizer.ggml.eos_token_id"].contents()]
    del reader, tokens

    ref = lr.load(str(f32_path), n_ctx=1024, n_threads=args.threads)
    q41 = lr.load(str(model), n_ctx=1024, n_threads=args.threads)
    vocab = ref._model.vocab

    runs = []
    builtin_all_match = True
    builtin_examples: list[dict] = []
    for name, prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        rendered = render_chat_template(template, messages, bos_token=bos_tok, eos_token=eos_tok)
        builtin = llama_cpp_builtin_template(ref, messages)
        builtin_all_match &= builtin == rendered
        if builtin != rendered:
            builtin_examples.append({"user_prompt": prompt, "llama_cpp_builtin": builtin})
        for mode, text in (("raw", prompt), ("chat", rendered)):
            ids = ref.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            assert ids == q41.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            # decode N_NEW tokens without stopping; greedy_ids is that list cut after the first EOG
            # (argmax decoding is deterministic, so this equals a run that stops at EOG)
            g_all, first, margins, _ = lr.greedy(ref, ids, N_NEW, stop_at_eog=False)
            gq_all, firstq, _, _ = lr.greedy(q41, ids, N_NEW, stop_at_eog=False)
            g, eog = cut_at_eog(g_all, vocab)
            gq, eogq = cut_at_eog(gq_all, vocab)
            n = min(len(g), len(gq))
            prefix = next((i for i in range(n) if g[i] != gq[i]), n)
            entry = {
                "name": name,
                "mode": mode,
                "user_prompt": prompt,
                "prompt_text": text,
                "prompt_ids": ids,
                "greedy_ids": g,
                "n_generated": len(g),
                "stopped_at_eog": eog is not None,
                "eog_id": eog,
                "greedy_text": rc.detokenize(ref, g, special=True).decode("utf-8", errors="replace"),
                "greedy_top2_margins": [rc.f32(m) for m in margins[: len(g)]],
                "greedy_ids_no_stop": g_all,
                "greedy_top2_margins_no_stop": [rc.f32(m) for m in margins],
                "top10": [[i, rc.f32(v)] for i, v in lr.topk(first, 10)],
                "first_step_logit_stats": {"mean": rc.f32(first.mean()), "std": rc.f32(first.std()),
                                           "min": rc.f32(first.min()), "max": rc.f32(first.max())},
                "q4_1_info": {
                    "greedy_ids": gq,
                    "stopped_at_eog": eogq is not None,
                    "greedy_ids_no_stop": gq_all,
                    "n_match_positional_no_stop": int(sum(1 for a, b in zip(g_all, gq_all) if a == b)),
                    "n_match_positional": int(sum(1 for a, b in zip(g, gq) if a == b)),
                    "n_match_prefix": int(prefix),
                    "top10": [[i, rc.f32(v)] for i, v in lr.topk(firstq, 10)],
                    "first_step_max_abs_logit_diff_vs_f32": rc.f32(np.abs(first - firstq).max()),
                },
            }
            runs.append(entry)
            rc.log(f"{name}/{mode}: {len(ids)} prompt tokens, {len(g)} generated, "
                   f"Q4_1 match {entry['q4_1_info']['n_match_positional']}/{len(g)} (prefix {prefix})"
                   + (f", EOG {eog}" if eog is not None else ""))

    out = rc.header(
        model,
        f32_model_file=f32_path.name,
        f32_model_sha256=rc.sha256_file(f32_path),
        reference=("llama.cpp (llama-cpp-python) on the all-F32 dequantized copy of model_file "
                   "(tools/reference/gguf_f32.py: gguf.quants.dequantize of every tensor, all metadata copied, "
                   "general.file_type=0); greedy = our own argmax over llama_get_logits_ith(ctx,-1) after each "
                   "llama_decode; prompt decoded as one batch, then one token per decode"),
        llama_cpp_settings=lr.settings_of(ref),
        n_new_tokens=N_NEW,
        eog_ids=[t for t in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        eos_id=llama_cpp.llama_vocab_eos(vocab),
        add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        chat_template={
            "source": "GGUF metadata tokenizer.chat_template of model_file",
            "template": template,
            "renderer": ("jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, "
                         "extensions=[loopcontrols]) like transformers.apply_chat_template; "
                         "messages=[{role:user, content:prompt}], add_generation_prompt=True, "
                         f"bos_token={bos_tok!r}, eos_token={eos_tok!r}"),
            "llama_cpp_builtin_apply_template_matches": builtin_all_match,
            "llama_cpp_builtin_note": ("llama.cpp's C++ llama_chat_apply_template does not execute jinja: it detects "
                                       "'chatml' and emits the messages only, without this template's default system "
                                       "message; the jinja rendering (prompt_text of chat runs) is the golden"),
            "llama_cpp_builtin_mismatches": builtin_examples[:2],
        },
        notes=[
            "prompt_ids = llama_tokenize(prompt_text, add_special=false, parse_special=true); no BOS (add_bos_token=false)",
            "greedy_ids: up to n_new_tokens tokens; if an end-of-generation token (llama_vocab_is_eog; eog_ids) is produced earlier, "
            "the list ends with it, stopped_at_eog=true and eog_id names it",
            "top10: [token_id, raw logit] of the FIRST generated position (logits after the prompt), highest first",
            "greedy_top2_margins[i]: top1-top2 logit gap at step i; tiny gaps mean an fp32 engine may legitimately diverge there",
            "greedy_ids_no_stop: always n_new_tokens tokens, decoding continues past EOG (EOG fed back like any token); "
            "greedy_ids is its prefix up to and including the first EOG",
            "q4_1_info: the same run on the original Q4_1 file (llama.cpp quantizes activations to Q8 inside Q4_1/Q8_0 matmuls) - information only",
        ],
        q4_1_summary={
            "runs_identical_greedy_ids": sum(1 for r in runs if r["greedy_ids"] == r["q4_1_info"]["greedy_ids"]),
            "runs": len(runs),
            "positional_matches_no_stop": sum(r["q4_1_info"]["n_match_positional_no_stop"] for r in runs),
            "tokens_no_stop": N_NEW * len(runs),
            "first_token_matches": sum(1 for r in runs if r["greedy_ids"][0] == r["q4_1_info"]["greedy_ids"][0]),
        },
        runs=runs,
    )
    rc.write_json(args.out, out)
    rc.log(f"wrote {args.out}: {len(runs)} runs")


if __name__ == "__main__":
    main()
