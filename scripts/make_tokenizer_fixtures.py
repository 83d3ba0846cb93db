"""Build the tokenizer test fixtures from llama.cpp (through llama-cpp-python), and the unicode table.

    python scripts/make_tokenizer_fixtures.py corpus            # tests/fixtures/tokenizer/corpus.json
    python scripts/make_tokenizer_fixtures.py fixtures [NAME=GGUF …]  # the corpus through llama.cpp
    python scripts/make_tokenizer_fixtures.py vocab-gguf SRC DST  # a vocabulary-only GGUF from a header
    python scripts/make_tokenizer_fixtures.py unicode-data unicode-data.cpp

`fixtures` defaults to smollm2 and gemma3 from the edgellm model store (or /tmp/models), every
models/vocab/*.gguf, and the gpt-2 vocabulary renamed to other pre-tokenizers (pre-*.json). Each
fixture holds, per corpus string, llama_tokenize's ids for the four (add_special, parse_special)
combinations (ff, ft, tf, tt; those derivable from others left out, see compact()) and
llama_detokenize's text (d: of ff, special=False; ds: of tt, special=True); and for the vocabulary its
special ids, end-of-generation set, and hashes of every token's piece and control flag.
Only this script imports llama_cpp.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"
CORPUS = FIXTURES / "corpus.json"
COMBOS = {"ff": (False, False), "ft": (False, True), "tf": (True, False), "tt": (True, True)}


# --------------------------------------------------------------------------------------------- corpus
PROSE = """\
The quick brown fox jumps over the lazy dog. It wasn't the first time, and it won't be the last.
In 1905, Albert Einstein published four papers that changed physics; the third introduced special relativity.
She said, "I've never seen anything like it!" -- then she laughed, and we'd all laughed with her.
Rain fell on the tin roof all night, a soft, steady drumming that made the cabin feel smaller and warmer.
A tokenizer that disagrees with the model's training tokenizer silently degrades every answer it gives.
Please read the instructions carefully: (a) fill in the form; (b) sign it; (c) return it by Friday.
Mr. O'Neil's dog -- a three-legged terrier named Biscuit -- hasn't missed a walk in eleven years.
"Where are you going?" asked the child. "Nowhere," replied the old man, "and I'm in no hurry to get there."
The committee's report, released on 3 March 2024, recommends a 12.5% increase in funding over five years.
Honestly? I don't know. Maybe we'll find out tomorrow, maybe we won't; either way, we're ready.
They'd said they'd come, but they didn't; we'll never know why, and it's probably better that way.
THE END. IT'S OVER. WE'RE DONE. YOU'LL SEE. I'M SURE. HE'D AGREE. THEY'VE LEFT. DON'T CRY.
Large language models are trained on trillions of tokens drawn from the web, books, and source code.
Water boils at 100 °C (212 °F) at sea level; at the summit of Everest it boils at roughly 70 °C.
To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and arrows.
e.g., i.e., etc., vs., Dr., St., No. 5 -- abbreviations are a perennial source of tokenizer surprises.
"""

CODE = [
    'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "class Stack:\n\tdef __init__(self):\n\t\tself.items = []\n\n"
    "\tdef push(self, x):\n\t\tself.items.append(x)\n",
    '#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf("Hello, %s!\\n", argv[0]);\n'
    "    return 0;\n}\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // dot product",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(2, 3)}`);\nexport default add;\n",
    "fn main() {\n    let v: Vec<u32> = (1..=10).filter(|x| x % 2 == 0).collect();\n"
    '    println!("{:?}", v);\n}\n',
    'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello, 世界")\n}\n',
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id\nWHERE o.total > 100.00"
    " GROUP BY u.id HAVING n >= 3 ORDER BY n DESC;",
    '<!DOCTYPE html>\n<html lang="en">\n  <head><title>Test &amp; check</title></head>\n'
    '  <body><p class="x">Hi&nbsp;there</p></body>\n</html>\n',
    '{"name": "edgellm", "version": "0.1.0", "tags": ["llm", "cpu"], "nested": {"a": [1, 2.5, null, true]}}',
    '#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.gguf; do\n  echo "$f: $(stat -c %s "$f")"\ndone\n',
    "\\begin{equation}\n  E = mc^2 \\quad \\text{and} \\quad "
    "\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}",
    r"re.compile(r'^(?P<user>[\w.+-]+)@(?P<host>[\w-]+\.)+[a-z]{2,}$', re.I)",
    "    if (x != NULL && x->next) {\n        x = x->next->next;\n    }\n",
    "public static void main(String[] args) throws IOException {\n"
    '    System.out.println(String.format("%d items", items.size()));\n}',
    "x <- c(1, 2, 3)\nmean(x)  # R\ny = [i**2 for i in range(10) if i % 3 != 0]",
    "| col A | col B |\n|-------|------:|\n| 1     | 2.50  |\n| foo   | bar   |\n",
    "- [ ] todo item\n- [x] done item\n  1. nested *emphasis* and **bold** and `code`\n",
    "diff --git a/x.py b/x.py\n@@ -1,3 +1,3 @@\n-print('old')\n+print('new')\n",
    "a=1;b=2;c=a<<b|a>>1^~b&0xFF;d=a<=b>=c!=d==e;f+=1;g-=2;h*=3;i/=4;j%=5;k**=6;l//=7;",
    "x=>x|>y<|z::w->v<-u:=t...s..r??q?.p!!o&&n||m",
    "\t\tindented with tabs\n    indented with spaces\n\t    mixed\n",
    "```python\nprint('fenced')\n```\n",
]

URLS = [
    "https://www.example.com/path/to/page?query=1&other=two#section",
    "http://localhost:8080/v1/chat/completions",
    "ftp://ftp.gnu.org/gnu/gcc/gcc-13.2.0/gcc-13.2.0.tar.xz",
    "See https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp#L280 for details.",
    "mailto:someone@example.org, first.last+tag@sub.example.co.uk",
    "file:///home/user/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "C:\\Users\\Admin\\Documents\\report_final(2).docx",
    "/usr/local/lib/python3.11/site-packages/edgellm/__init__.py",
    "https://ja.wikipedia.org/wiki/東京都 and https://ru.wikipedia.org/wiki/Москва",
    "www.example.com/a-b_c~d%20e",
]

SCRIPTS = [
    "我们今天去公园散步，天气非常好。",
    "人工智能正在改变世界。",
    "東京は日本の首都です。ひらがなとカタカナ、そして漢字。",
    "今日はいい天気ですね！コーヒーを飲みましょう。",
    "안녕하세요, 만나서 반갑습니다. 한국어 문장입니다.",
    "مرحبا بالعالم! كيف حالك اليوم؟",
    "اللغة العربية جميلة جداً ١٢٣٤٥",
    "नमस्ते दुनिया! आप कैसे हैं?",
    "भारत एक विशाल देश है।",
    "আমি বাংলায় গান গাই।",
    "தமிழ் ஒரு பழமையான மொழி.",
    "Привет, мир! Как дела?",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Українська мова: їжак, ґанок, європейський.",
    "สวัสดีครับ ยินดีที่ได้รู้จัก",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "שלום עולם! מה שלומך?",
    "עברית נכתבת מימין לשמאל.",
    "Γειά σου Κόσμε! Τι κάνεις;",
    "ΑΒΓΔ αβγδ ΣΊΣΥΦΟΣ σίσυφος",
    "Բարև աշխարհ",
    "გამარჯობა მსოფლიო",
    "Tiếng Việt có nhiều dấu: ắ, ặ, ề, ở, ữ.",
    "İstanbul'da ılık bir gün; IĞDIR ve ığdır.",
    "Straße, Größe, Fußgänger — ÄÖÜ äöü ß ẞ",
    "Ça va? Très bien, merci. Où est la bibliothèque?",
    "ñandú, pingüino, ¿qué tal? ¡Hola!",
    "e\u0301 vs \u00e9, a\u0308 vs \u00e4, n\u0303 vs \u00f1",
    "Z\u0351\u036b\u0343a\u0310\u0352l\u0357g\u034co\u0364 text",
    "ᚠᛇᚻ᛫ᛒᛦᚦ ᚱᚢᚾᛁᚲ",
    "አማርኛ ቋንቋ",
    "ꯃꯤꯇꯩ ꯂꯣꯟ",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝐛𝐨𝐥𝐝 𝒮𝒸𝓇𝒾𝓅𝓉",
    "ﬁ ﬂ ﬀ ligatures and ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ １２３",
    "中文English混合text，标点。",
    "日本語とEnglishのmixed文章です。",
    "Ⅻ Ⅳ ⅷ ① ② ⑳ ½ ¾ ⅞ ² ³ ¹",
    "ℕ ℤ ℚ ℝ ℂ ∀x∈ℝ: x² ≥ 0 ∑ ∏ ∫ √ ∞ ≠ ≈",
]

EMOJI = [
    "😀",
    "Hello 😀 world",
    "👍🏽",
    "👍🏻👍🏼👍🏽👍🏾👍🏿",
    "👨‍👩‍👧‍👦",
    "👩🏽‍💻 is coding",
    "🏳️‍🌈 and 🏴‍☠️",
    "🇺🇸🇯🇵🇫🇷🇩🇪",
    "1️⃣ 2️⃣ #️⃣",
    "❤️ ♥ ❤",
    "I love 🍕 and 🍣!!! 🎉🎉🎉",
    "🧑‍🤝‍🧑",
    "😀😃😄😁😆😅😂🤣",
    "emoji at end 🚀",
    "👋🏽hello",
    "☃ ☀ ⛄ ✈ ✔ ✗ ★ ☆",
]

CONTRACTIONS = [
    "it's", "It's", "IT'S", "don't", "Don't", "DON'T", "we're", "We're", "WE'RE", "We'Re",
    "I've", "I'VE", "I'm", "I'M", "you'll", "YOU'LL", "You'Ll", "he'd", "HE'D",
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "' s", "'S", "'T", "'RE", "'Ve",
    "rock 'n' roll", "the '90s", "''quoted''", "don’t (curly) it’s", "O'Reilly's", "y'all'd've",
    "He said 's' and 't' and 're'", "cats' toys", "James's", " 's", "x 'll y", "'", "''", "' '",
]  # fmt: skip

SPECIALS = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|>",
    "<|im_start",
    "<<|im_end|>>",
    " <|im_end|> ",
    "<|im_end|>\n\n",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>model\nFour.<end_of_turn>",
    "<bos>Hello<eos>",
    "<eos><eos><pad><unk><mask>",
    "<unused0> <unused99>",
    "[multimodal] <start_of_image><end_of_image>",
    "<repo_name>edgellm<file_sep>tokenizer.py",
    "<s>[INST] hi [/INST]</s>",
    "<|user|>\nhi<|end|>\n<|assistant|>",
    "<think>\nreasoning\n</think>\nanswer",
    '<tool_call>{"name": "f"}</tool_call>',
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>",
    "<|fim_prefix|>def f(<|fim_suffix|>)<|fim_middle|>",
]

ODD = [
    "",
    " ",
    "  ",
    "a",
    "\n",
    "\t",
    "\r\n",
    "'",
    "\u2581",
    "\u2581hello\u2581world",
    "Ġhello ĠĠ Ċ",
    "<0x41><0xFF>",
    "\x00",
    "a\x00b",
    "\x07\x08\x1b[31mred\x1b[0m",
    "\ufeffBOM at start",
    "zero\u200bwidth\u200cjoiner\u200dhere",
    "soft\u00adhyphen",
    "\u200f\u200eRTL marks\u202e reversed",
    "nbsp\u00a0here and\u00a0\u00a0two",
    "ideographic\u3000space",
    "em\u2003space thin\u2009space",
    "next\u0085line",
    "line\u2028separator\u2029para",
    "\x0b\x0c vertical tab and form feed",
    "\u0300 leading combining mark",
    "\U0010fffd private use plane 16",
    "\ue000\uf8ff BMP private use",
    "\U0001f9ff\U0001fa70 newer emoji",
    "\U000e0001\U000e0041 tag characters",
    "[UNK] [CLS] [SEP]",
    "</s>",
    "Ċ",
]

WHITESPACE = [
    *[" " * n for n in (2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 64)],
    *["a" + " " * n + "b" for n in (1, 2, 3, 4, 8, 16)],
    *["\n" * n for n in (2, 3, 5, 10, 31, 32, 40)],
    *["\t" * n for n in (2, 3, 8, 31, 32)],
    " a", "a ", " a ", "  a  b   c    d", "a\nb", "a\n\nb", "a \n b", "a\t\tb", "a \t b",
    "\n \n", " \n", "\n ", "\r\n\r\n", "\r", "a\rb", "trailing spaces   ", "   leading spaces",
    "line1\nline2\n\nline4\n", "  \n  \n  ", " \t \n \r ", "\n\n\n\nfour newlines", "x\n\n\n\n\n\ny",
    "tab\tseparated\tvalues\t1\t2", "word  word   word    word", ". . .", "a . b , c ! d ? e",
    "hello .", "hello ,world", "hello ?", "why ! not", "Hello , world .",
]  # fmt: skip

NUMBERS = [
    *[("1234567890" * 4)[:n] for n in (*range(1, 11), 12, 15, 20, 40)],
    "3.14159265358979", "-42", "+7", "1,000,000", "1.000.000,00", "2024-01-01T12:34:56Z", "0x1F2E3D",
    "1e-10", "6.022e23", "$19.99", "€5,00", "¥1000", "100%", "1/2", "3:45pm", "v1.2.3-rc.4",
    "+1 (555) 123-4567", "192.168.0.1:8080", "٠١٢٣٤٥٦٧٨٩", "१२३४५", "１２３４５", "²³¹", "12abc34",
    "abc123def", "a1b2c3", "007", "00000", "1 2 3 4 5", "10 000 000", "1st 2nd 3rd 4th", "π≈3.14",
]  # fmt: skip

LONG = {
    "5000 x a": "a" * 5000,
    "2000 spaces": " " * 2000,
    "1000 x ab": "ab" * 1000,
    "1000 newlines": "\n" * 1000,
    "1000 dots": "." * 1000,
    "1000 ones": "1" * 1000,
    "300 emoji": "😀" * 300,
    "500 CJK": "的" * 500,
    "500 x 'the '": "the " * 500,
    "300 tabs": "\t" * 300,
    "1000 x a-space": "a " * 1000,
    "long word": "supercalifragilisticexpialidocious" * 20,
    "2000 x ▁": "\u2581" * 2000,
    "400 x <|im_end|>": "<|im_end|>" * 400,
    "1500 x é": "é" * 1500,
}


def build_corpus() -> list[str]:
    sentences = [s for s in PROSE.splitlines() if s]
    words = PROSE.split()
    mixed = [
        "Translate to French: 'The cat is on the table.' -> 'Le chat est sur la table.'",
        "User: what's 12*34?\nAssistant: 12*34 = 408.",
        "Emoji in code: print('🐍') # 🐍 python",
        "日本語のテキスト with English words and 123 numbers and émojis 🎌.",
        "Математика: ∫₀¹ x² dx = 1/3 ≈ 0.333",
        "<b>bold</b> &lt;escaped&gt; &#x1F600; &amp;",
        "Q: Is 'NaN' == 'NaN'?\nA: No -- NaN != NaN in IEEE 754.",
        "He paid $3.50 for 2 coffees @ 9:15am, then ran 5km in 27'30\".",
        "#hashtag @mention u/user r/subreddit ~tilde ^caret",
        "snake_case camelCase PascalCase kebab-case SCREAMING_CASE dot.case",
    ]
    corpus = (
        [PROSE, "\n".join(sentences[:5]), " ".join(words[:60])]
        + sentences
        + [" " + s for s in sentences[:4]]
        + [s.upper() for s in sentences[:3]]
        + [s.lower() for s in sentences[3:6]]
        + CODE
        + ["\n".join(CODE)]
        + URLS
        + SCRIPTS
        + [" ".join(SCRIPTS[:12])]
        + EMOJI
        + CONTRACTIONS
        + [" ".join(CONTRACTIONS)]
        + SPECIALS
        + ODD
        + WHITESPACE
        + NUMBERS
        + [" ".join(NUMBERS)]
        + mixed
        + list(LONG.values())
    )
    seen: set[str] = set()
    out = [s for s in corpus if not (s in seen or seen.add(s))]
    assert len(out) >= 300, len(out)
    return out


# ------------------------------------------------------------------------------------------ llama.cpp side
def _llama(path: Path):
    from llama_cpp import Llama

    return Llama(str(path), vocab_only=True, verbose=False)


def ll_tokenize(vocab, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
    import llama_cpp

    n = len(text) + 8
    buf = (llama_cpp.llama_token * n)()
    k = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n, add_special, parse_special)
    if k < 0:
        buf = (llama_cpp.llama_token * -k)()
        k = llama_cpp.llama_tokenize(vocab, text, len(text), buf, -k, add_special, parse_special)
    return list(buf[:k])


def ll_detokenize(vocab, ids: list[int], special: bool) -> bytes:
    import llama_cpp

    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 16 * len(ids)
    out = ctypes.create_string_buffer(cap)
    k = llama_cpp.llama_detokenize(vocab, arr, len(ids), out, cap, False, special)
    if k < 0:
        cap = -k
        out = ctypes.create_string_buffer(cap)
        k = llama_cpp.llama_detokenize(vocab, arr, len(ids), out, cap, False, special)
    return out.raw[:k]


def ll_piece(vocab, token: int, special: bool) -> bytes:
    import llama_cpp

    buf = ctypes.create_string_buffer(256)
    k = llama_cpp.llama_token_to_piece(vocab, token, buf, 256, 0, special)
    if k < 0:
        buf = ctypes.create_string_buffer(-k)
        k = llama_cpp.llama_token_to_piece(vocab, token, buf, -k, 0, special)
    return buf.raw[:k]


def pieces_digest(pieces) -> str:
    h = hashlib.sha256()
    for p in pieces:
        h.update(len(p).to_bytes(4, "little") + p)
    return h.hexdigest()


def _text(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + b.hex()


def make_fixture(path: Path, corpus: list[str]) -> dict:
    import llama_cpp

    llm = _llama(path)
    v = llm._model.vocab
    n = llama_cpp.llama_vocab_n_tokens(v)

    def opt(x: int) -> int | None:
        return None if x < 0 else x

    fx: dict = {
        "file": path.name,
        "llama_cpp_python": llama_cpp.__version__,
        "n_vocab": n,
        "bos": opt(llama_cpp.llama_vocab_bos(v)),
        "eos": opt(llama_cpp.llama_vocab_eos(v)),
        "eot": opt(llama_cpp.llama_vocab_eot(v)),
        "pad": opt(llama_cpp.llama_vocab_pad(v)),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v)),
        "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(v, i)],
        "pieces_sha256": pieces_digest(ll_piece(v, i, False) for i in range(n)),
        "pieces_special_sha256": pieces_digest(ll_piece(v, i, True) for i in range(n)),
        "control_sha256": hashlib.sha256(
            bytes(int(llama_cpp.llama_vocab_is_control(v, i)) for i in range(n))
        ).hexdigest(),
        "cases": [],
    }
    for s in corpus:
        b = s.encode("utf-8")
        case: dict = {}
        for key, (add_special, parse_special) in COMBOS.items():
            case[key] = ll_tokenize(v, b, add_special, parse_special)
        case["d"] = _text(ll_detokenize(v, case["ff"], False))
        case["ds"] = _text(ll_detokenize(v, case["tt"], True))
        fx["cases"].append(case)
    llm.close()
    return fx


def compact(fx: dict) -> dict:
    """Drop the ids a reader can derive: ft when equal to ff; tf/tt when they are ff/ft plus BOS/EOS."""
    pre = [fx["bos"]] if fx["add_bos"] else []
    post = [fx["eos"]] if fx["add_eos"] else []
    out = []
    for c in fx["cases"]:
        c = dict(c)
        if c["tt"] == pre + c["ft"] + post:
            del c["tt"]
        if c["tf"] == pre + c["ff"] + post:
            del c["tf"]
        if c["ft"] == c["ff"]:
            del c["ft"]
        out.append(c)
    return {**fx, "cases": out}


def write_fixture(name: str, fx: dict) -> Path:
    out = FIXTURES / f"{name}.json"
    fx = compact(fx)
    lines = ["{"]  # one case per line: readable diffs, still compact
    for k, v in fx.items():
        if k != "cases":
            lines.append(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False, separators=(',', ':'))},")
    lines.append('"cases": [')
    lines.append(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in fx["cases"]))
    lines.append("]}")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def default_models() -> dict[str, Path]:
    models: dict[str, Path] = {}
    try:
        sys.path.insert(0, str(ROOT))
        from edgellm import store

        for name, alias in (
            ("smollm2", "smollm2-135m"),
            ("gemma3", "gemma3-270m"),
            ("qwen2.5-coder", "qwen2.5-coder-0.5b"),
        ):
            spec = store.spec_for(alias)
            if spec is not None and store.is_cached(spec):
                models[name] = store.cached_path(spec)
    except Exception:  # noqa: BLE001 - the store is a convenience here
        pass
    for name, p in (
        ("smollm2", Path("/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf")),
        ("gemma3", Path("/tmp/models/gemma-3-270m-q4_k_m.gguf")),
    ):
        if name not in models and p.exists():
            models[name] = p
    for p in sorted((ROOT / "models" / "vocab").glob("*.gguf")):
        models["vocab-" + p.stem] = p
    return models


# pre-tokenizers with no vocabulary file at hand: llama.cpp runs them over the gpt-2 vocabulary, renamed
PRE_BASE = "ggml-vocab-gpt-2.gguf"
PRE_VARIANTS = ["deepseek-v3", "poro-chat", "viking", "tekken", "gpt-4o", "bailingmoe", "seed-coder"]
PRE_VARIANTS += ["minicpm5", "stablelm2"]


def pre_variant_fixtures(corpus: list[str]) -> None:
    import tempfile

    base = ROOT / "models" / "vocab" / PRE_BASE
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            path = Path(tmp) / f"{pre}.gguf"
            write_vocab_gguf(base, path, {"tokenizer.ggml.pre": pre})
            fx = {"base": PRE_BASE, "pre": pre, **make_fixture(path, corpus)}
            out = write_fixture(f"pre-{pre}", fx)
            print(f"{out}: {out.stat().st_size / 1e6:.2f} MB")


# ------------------------------------------------------------------------------------------ other tools
def write_vocab_gguf(src: Path, dst: Path, overrides: dict | None = None) -> None:
    """Every metadata key of a GGUF header (with `overrides` applied) in a GGUF without tensors, like
    llama.cpp's models/ggml-vocab-*.gguf (integers become uint32, as llama.cpp reads ids and sizes)."""
    import gguf

    sys.path.insert(0, str(ROOT))
    from edgellm.gguf import ModelFile, StringArray

    md = {**ModelFile(src, metadata_only=True).metadata, **(overrides or {})}
    w = gguf.GGUFWriter(str(dst), md["general.architecture"])
    for key, val in md.items():
        if key == "general.architecture":
            continue
        if isinstance(val, StringArray):
            w.add_array(key, val.tobytes_list())
        elif hasattr(val, "dtype"):
            w.add_array(key, val.tolist())  # int32 token types, float32 scores
        elif isinstance(val, bool):
            w.add_bool(key, val)
        elif isinstance(val, int):
            w.add_uint32(key, val)
        elif isinstance(val, float):
            w.add_float32(key, val)
        else:
            w.add_string(key, str(val))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


UNICODE_HEADER = '''\
"""Unicode codepoint categories exactly as llama.cpp classifies them (generated; do not edit).

Generated by `python scripts/make_tokenizer_fixtures.py unicode-data unicode-data.cpp` from
llama.cpp's src/unicode-data.cpp (as vendored in llama-cpp-python 0.3.36), so that the
pre-tokenizer agrees with llama.cpp's unicode_cpt_flags_from_cpt() even where Python's
unicodedata (another Unicode version) would not.
"""

# codepoints RANGE_STARTS[i] .. RANGE_STARTS[i+1]-1 carry the category bit RANGE_FLAGS[i]; unicode.h:
# 0x01 undefined, 0x02 \\p{N}, 0x04 \\p{L}, 0x08 \\p{Z}, 0x10 \\p{M}, 0x20 \\p{P}, 0x40 \\p{S}, 0x80 \\p{C}
# fmt: off
'''


def generate_unicode_module(cpp_path: Path) -> str:
    """edgellm/tokenizer/unicode_data.py from llama.cpp's src/unicode-data.cpp."""
    src = cpp_path.read_text(encoding="utf-8")

    def block(name: str) -> str:
        i = src.index(name)
        return src[i : src.index("};", i)]

    pairs = [
        (int(a, 16), int(b, 16))
        for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", block("unicode_ranges_flags"))
    ]
    ws = sorted(int(x, 16) for x in re.findall(r"0x([0-9A-F]+)", block("unicode_set_whitespace")))
    starts = [s for s, _ in pairs]
    flags = [f for _, f in pairs]
    assert starts[0] == 0 and starts[-1] == 0x110000 and all(f < 256 for f in flags)
    lines = UNICODE_HEADER.splitlines() + ["RANGE_STARTS = ("]
    lines += ["    " + " ".join(f"0x{s:06X}," for s in starts[i : i + 10]) for i in range(0, len(starts), 10)]
    lines.append(")")
    hexflags = bytes(flags).hex()
    lines.append("RANGE_FLAGS = bytes.fromhex(")
    lines += [f'    "{hexflags[i : i + 96]}"' for i in range(0, len(hexflags), 96)]
    lines.append(")")
    lines.append("WHITESPACE = frozenset((")
    lines += ["    " + " ".join(f"0x{s:04X}," for s in ws[i : i + 10]) for i in range(0, len(ws), 10)]
    lines.append("))")
    lines.append("# fmt: on")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("corpus")
    fx = sub.add_parser("fixtures")
    fx.add_argument("models", nargs="*", help="NAME=PATH pairs (default: smollm2, gemma3, models/vocab/*)")
    vg = sub.add_parser("vocab-gguf")
    vg.add_argument("src", type=Path)
    vg.add_argument("dst", type=Path)
    ud = sub.add_parser("unicode-data")
    ud.add_argument("cpp", type=Path)
    args = ap.parse_args()

    if args.cmd == "corpus":
        corpus = build_corpus()
        FIXTURES.mkdir(parents=True, exist_ok=True)
        CORPUS.write_text(json.dumps(corpus, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        print(f"{CORPUS}: {len(corpus)} strings")
    elif args.cmd == "fixtures":
        corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
        models = dict(m.split("=", 1) for m in args.models) if args.models else default_models()
        for name, path in models.items():
            out = write_fixture(name, make_fixture(Path(path), corpus))
            print(f"{out}: {out.stat().st_size / 1e6:.2f} MB")
        if not args.models and (ROOT / "models" / "vocab" / PRE_BASE).exists():
            pre_variant_fixtures(corpus)
    elif args.cmd == "vocab-gguf":
        write_vocab_gguf(args.src, args.dst)
        print(f"{args.dst}: {args.dst.stat().st_size / 1e6:.2f} MB")
    elif args.cmd == "unicode-data":
        out = ROOT / "edgellm" / "tokenizer" / "unicode_data.py"
        out.write_text(generate_unicode_module(args.cpp), encoding="utf-8")
        print(out)


if __name__ == "__main__":
    main()
