"""Write tests/data/tokenizer_golden.json: llama.cpp tokenization of a fixed corpus.

ids_special = llama_tokenize(text, add_special/add_bos=False, parse_special=True)
ids_plain   = llama_tokenize(text, add_special/add_bos=False, parse_special=False)
"""
from __future__ import annotations

import argparse
from pathlib import Path

import refcommon as rc
from corpus import corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=str(rc.DEFAULT_MODEL))
    ap.add_argument("--out", default=str(rc.DATA_DIR / "tokenizer_golden.json"))
    args = ap.parse_args()

    import llama_cpp

    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)

    cases = []
    for text in corpus():
        b = text.encode("utf-8")
        ids_special = llm.tokenize(b, add_bos=False, special=True)
        ids_plain = llm.tokenize(b, add_bos=False, special=False)
        detok = rc.detokenize(llm, ids_plain, special=False)
        cases.append(
            {
                "text": text,
                "text_utf8_hex": b.hex(),
                "ids_special": ids_special,
                "ids_plain": ids_plain,
                "detok_plain_roundtrip": detok == b,
            }
        )

    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    control = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, t)]
    out = rc.header(
        args.model,
        reference="llama.cpp via llama-cpp-python: Llama(model_path, vocab_only=True).tokenize(text.encode('utf-8'), add_bos=False, special=True|False)",
        notes=[
            "ids_special: llama_tokenize(..., add_special=false, parse_special=true): text matching a special/control token string becomes that token id",
            "ids_plain: parse_special=false: special-token strings are tokenized as ordinary text",
            "text_utf8_hex: the exact UTF-8 bytes of text (use it if your JSON parser mangles escapes)",
            "detok_plain_roundtrip: concatenated llama_token_to_piece(id, lstrip=0, special=false) over ids_plain reproduces the input bytes exactly",
        ],
        vocab={
            "n_vocab": n_vocab,
            "bos": llama_cpp.llama_vocab_bos(vocab),
            "eos": llama_cpp.llama_vocab_eos(vocab),
            "eog_ids": eog,
            "control_ids": control,
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        },
        n_cases=len(cases),
        cases=cases,
    )
    rc.write_json(args.out, out)
    rc.log(f"wrote {args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
