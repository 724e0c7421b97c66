"""Tokenizer test corpus (strings only; golden ids come from llama.cpp)."""
from __future__ import annotations

_LONG_PARAGRAPH = (
    "The history of computing is a story of abstraction layered upon abstraction. "
    "In the 1940s, engineers wired programs directly into machines such as ENIAC, "
    "setting thousands of switches and plugging cables by hand; a single change could "
    "take days. Stored-program computers, proposed by von Neumann and others in 1945, "
    "changed that: instructions became data, and data could be rewritten at 5,000 "
    "operations per second. Assembly languages followed, then FORTRAN (1957), COBOL "
    "(1959) and LISP (1958), each promising that \"programmers won't need to think about "
    "the hardware anymore.\" They were half right. Compilers turned formulas like "
    "x = (a + b) * c / 2.5e3 into machine code, but memory was still counted in "
    "kilobytes and every byte mattered. By the 1970s, C and Unix showed that a portable "
    "systems language could build an entire operating system; by the 1990s, the World "
    "Wide Web connected millions of machines over TCP/IP, and HTML pages like "
    "<html><body>Hello!</body></html> were written by people who had never seen a "
    "transistor. Today's large language models are trained on trillions of tokens - "
    "text split into pieces by tokenizers such as byte-pair encoding (BPE). A tokenizer "
    "sees \"don't\" as perhaps two pieces, \"internationalization\" as several, and "
    "\"2024-03-15\" as a sequence of digits and dashes. Numbers are split digit by digit "
    "in some vocabularies (1234567 becomes 1 2 3 4 5 6 7) so that arithmetic is easier "
    "to learn. Whitespace matters too: four spaces of Python indentation,    like this, "
    "may become one token or four. Unicode adds more variety: caf\u00e9, na\u00efve, "
    "\u00fcber, \u4e2d\u6587, \u65e5\u672c\u8a9e, \ud55c\uad6d\uc5b4, and emoji such as "
    "\U0001F600 are all encoded as UTF-8 bytes before merging. When engineers build an "
    "inference engine, they must reproduce the reference tokenizer exactly, byte for "
    "byte, or the model will see inputs it was never trained on, and its answers will "
    "quietly degrade. That is why test suites compare against an independent "
    "implementation: the same text must yield the same token ids, every time, on every "
    "machine, for every language and every strange corner case - tabs\tand\ttabs, "
    "carriage returns\r\n, and trailing spaces   "
)


def corpus() -> list[str]:
    cases: list[str] = [
        # plain English
        "Hello world",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "What is the capital of France?",
        "Once upon a time, in a land far, far away, there lived a small dragon.",
        "ALL CAPS SENTENCE WITH SHOUTING!!!",
        "mIxEd CaSe WoRdS",
        # contractions
        "don't",
        "I'LL be there, it's fine, we've done it, they're here, you'd know, I'm sure",
        "DON'T STOP. It'S ok. I'Ve seen.",
        "rock 'n' roll ''quoted'' 'single'",
        # code
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)  # comment\nprint(x.shape)",
        "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() > 2 ? 0 : 1;\n}\n",
        "template <typename T> auto add(T a, T b) -> decltype(a + b) { return a + b; }",
        '{"name": "SmolLM2", "layers": 30, "rope_theta": 100000.0, "tags": ["a", "b"], "ok": true, "none": null}',
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
        "<div class=\"x\">&amp; &lt;tag&gt;</div>",
        "a->b; c::d; e=>f; g!=h; i<=j; k&&l || m; n++; --o; p**2; q//r; s%=t",
        # numbers
        "1234567",
        "3.14159",
        "1e-9",
        "2024-03-15",
        "12/31/1999 23:59:59",
        "The year 2000 had 366 days and cost $1,234,567.89 (about 12.5%).",
        "0x7fffffff 0b1010 0o777 -42 +17 1_000_000",
        "12345678901234567890123456789012345678901234567890",
        "v1.2.3-rc.4",
        # whitespace
        " ",
        "  ",
        "     ",
        "\t",
        "\t\t\t",
        " \t \t  ",
        "   leading spaces",
        "trailing spaces   ",
        "  both sides  ",
        "multiple     spaces    between   words",
        "tab\tseparated\tvalues",
        # newlines
        "\n",
        "\r\n",
        "\n\n\n",
        "line one\nline two\r\nline three\n\n\nline four",
        "ends with newline\n",
        "\n starts with newline",
        " \n \n ",
        "\r",
        # accents and combining marks
        "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
        "se\u00f1or ma\u00f1ana \u00fcber Stra\u00dfe",
        "cafe\u0301 (combining acute) n\u0303 a\u0308",
        "\u00c5ngstr\u00f6m \u00c6sir \u00d8resund \u0141\u00f3d\u017a",
        # CJK
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
        "\u6211\u559c\u6b22\u5b66\u4e60\u673a\u5668\u5b66\u4e60\u3002",
        "\u3053\u3093\u306b\u3061\u306f\u3001\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059",
        "\uc548\ub155\ud558\uc138\uc694 \ud55c\uad6d\uc5b4",
        "\uff21\uff22\uff23 full-width \uff11\uff12\uff13",
        # emoji
        "\U0001F600",
        "I love pizza \U0001F355\U0001F355!",
        "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 family ZWJ",
        "\U0001F3F3\uFE0F\u200D\U0001F308 \U0001F44D\U0001F3FD",
        "flags \U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5\U0001F1EB\U0001F1F7",
        # other scripts
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
        "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
        "Mixed: English, \u4e2d\u6587, \u0420\u0443\u0441\u0441\u043a\u0438\u0439, \u0627\u0644\u0639\u0631\u0628\u064a\u0629, 123.",
        # special-token look-alikes
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>",
        "text before<|endoftext|>text after",
        "<|im_start",
        "< |im_end| >",
        "<|unknown|>",
        "<|im_end|><|im_end|>",
        " <|im_start|> spaced ",
        "<|im_start|>\n\n<|im_end|>",
        "<repo_name>x<file_sep>y<filename>z",
        "<s> </s> <unk> [INST] [/INST] <<SYS>>",
        # punctuation / symbols
        "!!!???...,,,;;;:::",
        "\u201csmart quotes\u201d \u2018single\u2019 \u2014 em dash \u2013 en dash \u2026",
        "\u00a9 \u00ae \u2122 \u20ac \u00a3 \u00a5 \u00b0 \u00b1 \u00d7 \u00f7 \u221e \u2260 \u2264",
        "https://example.com/path?query=1&other=two#frag",
        "user@example.com",
        "\u00a0non-breaking\u00a0space and\u2003em space",
        "\u200bzero\u200bwidth\u200bspace",
        # empty and single characters
        "",
        "a",
        "A",
        "0",
        "!",
        "'",
        "\u00e9",
        "\u4e2d",
        "\u00ff",
        "\x00",
        "\x7f",
        # repeated characters
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "================================================================",
        "ab" * 40,
        # long paragraph
        _LONG_PARAGRAPH,
    ]
    # deduplicate, keep order
    seen: set[str] = set()
    out = []
    for c in cases:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


if __name__ == "__main__":
    cs = corpus()
    print(len(cs), "cases; longest", max(len(c) for c in cs), "chars")
