"""Write tests/data/prompt_golden.json: how HF transformers tokenizes SmolLM2 chat prompts.

The reference is HF's own code: the tokenizer is built from the GGUF's metadata by transformers'
GGUF tokenizer converter (transformers.integrations.gguf, the code behind
`AutoTokenizer.from_pretrained(..., gguf_file=...)`, called here without its torch-only file reader;
the metadata is read with gguf-py), the prompt is rendered by `apply_chat_template` with the GGUF's
own Jinja template, and tokenized by HF `tokenizers`. Nothing here is this project's code.

Per prompt case (a chat request: optional system text, documents, question):
  rendered        apply_chat_template([system?, user: "".join(documents) + question],
                  add_generation_prompt=True), as text
  system_prefix / question_text
                  the rendered text cut where the user content starts and where the question
                  starts (the parts a RAG request carries apart); system_prefix + documents +
                  question_text == rendered is checked here
  whole_ids       tokenizer(rendered, add_special_tokens=False): what modes full and prefix must
                  feed the model
  prefix_ids, document_ids, question_ids
                  each part tokenized alone (documents with special-token text kept literal,
                  split_special_tokens=True): what modes block and lazy feed, one part per
                  boundary
Per byte case: `ids` = tokenizer(text, add_special_tokens=False), for texts holding bytes the
vocabulary has no token for (HF drops them, as llama.cpp does).

Run from the repository root, in a venv with the packages of tools/reference/requirements-hf.txt:
  python tools/reference/gen_prompt_golden.py
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import platform
import sys
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = REPO_ROOT / "tests" / "data" / "prompt_golden.json"
MARKER = "\x01content\x01"

# name, system (None: the template's default), documents, question
PROMPT_CASES = [
    ("newline_then_spaces", None, [], "\n   Summarize the text."),
    ("leading_space", None, [], " What is 2+2?"),
    ("leading_spaces", None, [], "    indented question"),
    ("trailing_spaces", None, [], "Trailing spaces   "),
    ("trailing_newlines", None, [], "Ends with newlines\n\n"),
    ("tabs", None, [], "\tTabbed\tquestion\t"),
    ("nbsp", None, [], "\u00a0Non-breaking space"),
    ("ideographic_space", None, [], "\u3000全角スペース\u3000"),
    ("crlf", None, [], "\r\nWindows line\r\n"),
    ("only_spaces", None, [], "   "),
    ("special_text_in_question", None, [], "\nSay <|im_end|> then stop."),
    ("system_with_whitespace", "  Be brief.\n", [], "\nHi"),
    ("docs_newline_boundaries", None,
     ["Doc one ends with a newline\n", "\n  Doc two starts with whitespace\n"],
     "\n\nWhat do they say?"),
    ("doc_starts_with_tab", None, ["\n\tIndented doc."], " Why?"),
    ("doc_merges_into_next", "You answer.", [" ", "x", "y z "], " ?"),
    ("docs_unicode_spaces", None, ["\u2003em space doc\u2003", "\u00a0nbsp doc"], "\u3000Q?"),
]

# Bytes SmolLM2's byte-level alphabet has no token for, alone and inside characters.
BYTE_CASES = [
    "a\x04b", "\x06", "x\x13\x14y", "\x16\x1d", "tab\x1d\ttab",
    "x\U00050000y",  # F1 90 80 80
    "\U00080000",    # F2 80 80 80
    "ok \U0004ffff \U0008ffff end",
]


def field_value(field, gguf):
    t = field.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        if field.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if t == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]


def load_hf_tokenizer(path: Path):
    import gguf
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer)

    reader = gguf.GGUFReader(str(path))
    md = {k: field_value(f, gguf) for k, f in reader.fields.items()
          if k.startswith("tokenizer.") or k == "general.architecture"}
    grouped = {group: {name: md[f"tokenizer.{key}"] for key, name in renames.items()
                       if f"tokenizer.{key}" in md}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tdict, config = grouped["tokenizer"], grouped["tokenizer_config"]
    backend, extra = convert_gguf_tokenizer(md["general.architecture"], tdict)
    kwargs = dict(tokenizer_object=backend, chat_template=config.get("chat_template"))
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unk_token_id"), ("pad_token", "pad_token_id")):
        if tdict.get(key) is not None:
            kwargs[name] = tdict["tokens"][tdict[key]]
    assert not config.get("add_bos_token"), "the cases assume no BOS (SmolLM2 adds none)"
    return PreTrainedTokenizerFast(**kwargs, **extra)


def render(tok, system, content):
    messages = ([] if system is None else [{"role": "system", "content": system}])
    messages.append({"role": "user", "content": content})
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    tok = load_hf_tokenizer(Path(args.model))

    def ids(text, literal=False):
        return tok(text, add_special_tokens=False, split_special_tokens=literal)["input_ids"]

    prompts = []
    for name, system, docs, question in PROMPT_CASES:
        rendered = render(tok, system, "".join(docs) + question)
        cut = render(tok, system, MARKER + question)
        at = cut.index(MARKER)
        prefix, question_text = cut[:at], cut[at + len(MARKER):]
        assert prefix + "".join(docs) + question_text == rendered, name
        prompts.append({
            "name": name, "system": system, "documents": docs, "question": question,
            "rendered": rendered, "system_prefix": prefix, "question_text": question_text,
            "whole_ids": ids(rendered),
            "prefix_ids": ids(prefix),
            "document_ids": [ids(d, literal=True) for d in docs],
            "question_ids": ids(question_text),
        })

    byte_cases = []
    for text in BYTE_CASES:
        byte_cases.append({"text_utf8_hex": text.encode().hex(), "ids": ids(text, literal=True)})

    versions = {"python": platform.python_version()}
    for pkg in ("transformers", "tokenizers", "gguf", "jinja2"):
        versions[pkg] = metadata.version(pkg)
    h = hashlib.sha256(Path(args.model).read_bytes()).hexdigest()
    out = {
        "generated_by": " ".join([Path(sys.executable).name, *sys.argv]),
        "generated_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": versions,
        "model_file": Path(args.model).name,
        "model_sha256": h,
        "reference": "HF transformers (GGUF tokenizer converter, apply_chat_template) + tokenizers",
        "prompts": prompts,
        "bytes": byte_cases,
    }
    Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {len(prompts)} prompts, {len(byte_cases)} byte cases")


if __name__ == "__main__":
    main()
