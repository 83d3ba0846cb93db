"""Byte-level BPE pre-tokenizers: split text into words exactly as llama.cpp's unicode_regex_split() does.

Mirrors ggml-org/llama.cpp src/llama-vocab.cpp (llm_tokenizer_bpe: one list of regexes per
`tokenizer.ggml.pre`, and the per-name options in llama_vocab::impl::load) and src/unicode.cpp
(unicode_regex_split). llama.cpp does not run these regexes with a Unicode regex engine: the gpt2, llama3
and qwen2 patterns have hand-written splitters, and every other pattern runs through std::regex on a
"collapsed" text in which each non-ASCII codepoint is replaced by one byte naming its category (letter,
number, ...; all whitespace becomes \\x0B). That collapse has visible effects (\\p{Lu} and \\p{Ll} become
the same class; a Greek capital counts as `[^a-z]`), so we reproduce it: Python's `re` runs on the same
collapsed text, with categories from llama.cpp's own table (unicode_data.py), and the hand-written splitters
are expressed as equivalent patterns over that text.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

from .errors import TokenizerError
from .unicode_data import RANGE_FLAGS, RANGE_STARTS, WHITESPACE

_NUMBER, _LETTER, _MARK, _PUNCT, _SYMBOL = 0x02, 0x04, 0x10, 0x20, 0x40


def cpt_category(cp: int) -> int:
    """llama.cpp's category bit for a codepoint (unicode_cpt_flags_from_cpt(cp).category_flag())."""
    if cp >= 0x110000:
        return 0x01  # undefined
    return RANGE_FLAGS[bisect_right(RANGE_STARTS, cp) - 1]


# unicode.cpp unicode_regex_split: k_ucat_cpt (the byte standing for a category in the collapsed text)
# and k_ucat_map (the ASCII members of each category, spelled out inside the collapsed regex)
_UCAT_CPT = {_NUMBER: "\xd1", _LETTER: "\xd2", _PUNCT: "\xd3", _MARK: "\xd4", _SYMBOL: "\xd5"}
_UCAT_ASCII = {
    _NUMBER: "0-9",
    _LETTER: "A-Za-z",
    _PUNCT: "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
    _MARK: "",
    _SYMBOL: "\\$\\+<->^`\\|\\~",
}
_UCAT_ENUM = {
    "\\p{N}": _NUMBER,
    "\\p{L}": _LETTER,
    "\\p{P}": _PUNCT,
    "\\p{M}": _MARK,
    "\\p{S}": _SYMBOL,
    "\\p{Lu}": _LETTER,
    "\\p{Ll}": _LETTER,
    "\\p{Lt}": _LETTER,
    "\\p{Lm}": _LETTER,
    "\\p{Lo}": _LETTER,
}


class _CollapseTable(dict):
    """str.translate table: codepoint -> the character llama.cpp puts in its collapsed text for it."""

    def __init__(self) -> None:
        super().__init__((i, i) for i in range(128))  # ASCII stays as is

    def __missing__(self, cp: int) -> int:
        v = 0x0B if cp in WHITESPACE else ord(_UCAT_CPT.get(cpt_category(cp), "\xd0"))
        self[cp] = v
        return v


_COLLAPSE = _CollapseTable()
# the std::wregex path only replaces non-ASCII whitespace (by \x0B); everything else stays itself
_WIDE = {cp: 0x0B for cp in WHITESPACE if cp >= 128}

# --- the hand-written splitters of unicode.cpp, as patterns over the collapsed text -------------------------
# classes: letters, numbers, whitespace (llama.cpp's whitespace set; non-ASCII members collapse to \x0B)
_L, _N, _W = "A-Za-z\\xd2", "0-9\\xd1", "\\t\\n\\x0b\\x0c\\r "
_OTHER = f"[^{_W}{_L}{_N}]"
# unicode_regex_split_custom_gpt2
_GPT2 = f"'(?:[stmd]|re|ve|ll)| ?[{_L}]+| ?[{_N}]+| ?{_OTHER}+|[{_W}]+(?![^{_W}])|[{_W}]+"
# unicode_regex_split_custom_llama3 (digits in runs of up to three) and _qwen2 (single digits)
_LLAMA3_TMPL = (
    f"'(?:[sStTmMdD]|[rR][eE]|[vV][eE]|[lL][lL])|[^\\r\\n{_L}{_N}]?[{_L}]+|[{_N}]DIGITS"
    f"| ?{_OTHER}+[\\r\\n]*|[{_W}]*[\\r\\n]+|[{_W}]+(?![^{_W}])|[{_W}]+"
)
_LLAMA3 = _LLAMA3_TMPL.replace("DIGITS", "{1,3}")
_QWEN2 = _LLAMA3_TMPL.replace("DIGITS", "")

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_CUSTOM = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)": _GPT2,
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": _LLAMA3,
    _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": _LLAMA3,
    _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": _QWEN2,
}

# --- llama-vocab.cpp llm_tokenizer_bpe: regexes per pre-tokenizer type (copied verbatim) ------------------
_GPT2_EXPR = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_LLAMA3_EXPR = (
    _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_QWEN2_EXPR = (
    _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_CJK = "[一-龥ࠀ-一가-\ud7ff]+"
_GPT4O_LETTERS = (
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
)
_REGEXES: dict[str, tuple[str, ...]] = {
    "DEFAULT": ("[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2_EXPR, "\\p{N}+", "[0-9][0-9][0-9]"),
    "LLAMA3": (_LLAMA3_EXPR,),
    "DEEPSEEK_LLM": (
        "[\r\n]",
        "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
        "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
        "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
        "\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
        "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-"
        "\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113"
        "\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
        "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
        "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
        "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-"
        "\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+",
        "\\s+$",
        _CJK,
        "\\p{N}+",
    ),
    "DEEPSEEK_CODER": ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}"),
    "DEEPSEEK3_LLM": (
        "\\p{N}{1,3}",
        "[一-龥\u3040-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ),
    "FALCON": ("[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2_EXPR, "[0-9][0-9][0-9]"),
    "STARCODER": ("\\p{N}", _GPT2_EXPR),
    "GPT2": (_GPT2_EXPR,),
    "QWEN2": (_QWEN2_EXPR,),
    "PORO": (" ?[^(\\s|.,!?…。，、।۔،)]+",),
    "VIKING": (" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"),
    "TEKKEN": (
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
        "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
        "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "GPT4O": (
        _GPT4O_LETTERS + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "BAILINGMOE": (
        "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
        "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ),
    "SEED_CODER": (
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    "MINICPM5": (
        "\\p{N}{1,3}",
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
}


@dataclass(frozen=True)
class PreSpec:
    """How llama_vocab::impl::load configures a BPE vocabulary for one `tokenizer.ggml.pre` name."""

    regexes: str  # key into _REGEXES
    clean_spaces: bool = True  # detokenize drops " ," " 's" etc. (clean_up_tokenization_spaces)
    ignore_merges: bool = False  # a word that is already a token is not merged
    add_bos: bool = False  # default for add_bos_token when the file does not say


_LLAMA3_SPEC = PreSpec("LLAMA3", ignore_merges=True, add_bos=True)
_QWEN2_SPEC = PreSpec("QWEN2", clean_spaces=False)
_STARCODER_SPEC = PreSpec("STARCODER")
_GPT2_SPEC = PreSpec("GPT2")
PRE_SPECS: dict[str, PreSpec] = {
    "default": PreSpec("DEFAULT"),
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"],
        _LLAMA3_SPEC,
    ),
    "dbrx": PreSpec("LLAMA3"),
    "smaug-bpe": PreSpec("LLAMA3"),
    "deepseek-llm": PreSpec("DEEPSEEK_LLM", clean_spaces=False),
    "deepseek-coder": PreSpec("DEEPSEEK_CODER", clean_spaces=False),
    "deepseek-v3": PreSpec("DEEPSEEK3_LLM", clean_spaces=False),
    "hunyuan-dense": PreSpec("DEEPSEEK3_LLM", clean_spaces=False),
    "falcon": PreSpec("FALCON"),
    **dict.fromkeys(["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"], _STARCODER_SPEC),
    "command-r": PreSpec("STARCODER", clean_spaces=False),
    "smollm": PreSpec("STARCODER", clean_spaces=False),
    **dict.fromkeys(
        ["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum"]
        + ["modern-bert", "mpt", "olmo", "jais", "exaone4"],
        _GPT2_SPEC,
    ),
    "trillion": PreSpec("GPT2", clean_spaces=False),
    "granite-docling": PreSpec("GPT2", clean_spaces=False),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"], _QWEN2_SPEC),
    "grok-2": _QWEN2_SPEC,
    "stablelm2": PreSpec("QWEN2"),
    "megrez": PreSpec("QWEN2"),
    "poro-chat": PreSpec("PORO", clean_spaces=False),
    "bloom": PreSpec("PORO"),
    "gpt3-finnish": PreSpec("PORO"),
    "viking": PreSpec("VIKING", clean_spaces=False),
    "tekken": PreSpec("TEKKEN", clean_spaces=False, ignore_merges=True, add_bos=True),
    **dict.fromkeys(
        ["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], PreSpec("GPT4O", clean_spaces=False)
    ),
    **dict.fromkeys(["bailingmoe", "bailingmoe2", "llada-moe"], PreSpec("BAILINGMOE", clean_spaces=False)),
    "seed-coder": PreSpec("SEED_CODER", clean_spaces=False),
    "minicpm5": PreSpec("MINICPM5", ignore_merges=True),
}


def pre_spec(name: str) -> PreSpec:
    """llama.cpp's configuration for a `tokenizer.ggml.pre` value; a clear error for one we do not mirror."""
    spec = PRE_SPECS.get(name or "default")
    if spec is None:
        raise TokenizerError(
            f"unknown or unsupported BPE pre-tokenizer tokenizer.ggml.pre={name!r}; "
            f"supported: {', '.join(sorted(PRE_SPECS))}"
        )
    return spec


def _collapse_regex(expr: str) -> str:
    """unicode_regex_split: each \\p{..} becomes its collapsed byte plus its ASCII members (same brackets)."""
    out: list[str] = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
        elif inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
        elif c == "\\" and i + 3 < len(expr) and expr[i + 1] == "p" and expr[i + 2] == "{":
            close = expr.find("}", i + 3)
            cat = _UCAT_ENUM.get(expr[i : close + 1]) if close != -1 and close <= i + 10 else None
            if cat is None:
                out.append(c)
            else:
                body = _UCAT_CPT[cat] + _UCAT_ASCII[cat]
                out.append(body if inside else f"[{body}]")
                i = close
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _compile(expr: str) -> tuple[re.Pattern[str], bool, bool]:
    """(pattern, runs on the collapsed text?, matches every character?) for one llama.cpp regex."""
    custom = _CUSTOM.get(expr)
    if custom is not None:
        return re.compile(custom, re.ASCII), True, True
    collapsed = any(k in expr for k in _UCAT_ENUM)
    if collapsed:
        if any(ord(ch) >= 128 for ch in expr):
            raise TokenizerError(f"regex mixes unicode categories and non-ASCII characters: {expr!r}")
        expr = _collapse_regex(expr)
    if expr.endswith("$") and not expr.endswith("\\$"):
        expr = expr[:-1] + "\\Z"  # ECMAScript '$' is end of input; Python's also matches before a final \n
    # re.ASCII: std::regex's \s and \S follow the C locale (ASCII whitespace only), as here
    return re.compile(expr, re.ASCII), collapsed, False


class PreTokenizer:
    """Splits a text fragment into the words BPE merges within (unicode_regex_split, minus byte encoding)."""

    def __init__(self, name: str):
        self.name = name
        self.spec = pre_spec(name)
        self._stages = [_compile(e) for e in _REGEXES[self.spec.regexes]]

    def split(self, text: str) -> list[str]:
        if not text:
            return []
        ascii_ = text.isascii()
        views: dict[bool, str] = {}

        def view(collapsed: bool) -> str:
            if ascii_:
                return text
            v = views.get(collapsed)
            if v is None:
                v = views[collapsed] = text.translate(_COLLAPSE if collapsed else _WIDE)
            return v

        stages = self._stages
        if len(stages) == 1 and stages[0][2]:
            # one hand-written splitter: it matches every character, so the words are just its matches
            pat, collapsed, _ = stages[0]
            v = view(collapsed)
            if v is text and pat.groups == 0:
                return pat.findall(text)
            return [text[m.start() : m.end()] for m in pat.finditer(v)]

        spans = [(0, len(text))]
        for pat, collapsed, _ in stages:
            v = view(collapsed)
            out: list[tuple[int, int]] = []
            for a, b in spans:
                # like std::regex_iterator over [a, b): matches, and the unmatched gaps between them
                last = a
                for m in pat.finditer(v, a, b):
                    s, e = m.span()
                    if s > last:
                        out.append((last, s))
                    out.append((s, e))
                    last = e
                if last < b:
                    out.append((last, b))
            spans = out
        return [text[a:b] for a, b in spans]
