"""A GGUF vocabulary as llama.cpp loads it: token texts and attributes, special ids, end-of-generation set.

Mirrors ggml-org/llama.cpp src/llama-vocab.cpp, llama_vocab::impl::load (defaults per tokenizer model and
pre-tokenizer, special ids from metadata, the text-based detection of EOT/FIM/EOG tokens and its attribute
overrides, the special-token cache) and ::token_to_piece. Opening is instant: the token strings are parsed
in bulk the first time something needs them (~0.3 s for Gemma 3's 262k tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

import numpy as np

from edgellm.gguf import describe_value

from .errors import TokenizerError
from .pretokenize import pre_spec

# llama.h llama_token_attr bits
ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL, ATTR_CONTROL = 1, 2, 4, 8
ATTR_USER_DEFINED, ATTR_BYTE, ATTR_LSTRIP, ATTR_RSTRIP = 16, 32, 128, 256
# llama_token_type (the values in tokenizer.ggml.token_type) -> attribute; anything else is UNDEFINED (0)
_TYPE_ATTR = {
    1: ATTR_NORMAL,
    2: ATTR_UNKNOWN,
    3: ATTR_CONTROL,
    4: ATTR_USER_DEFINED,
    5: ATTR_UNUSED,
    6: ATTR_BYTE,
}

# load(): "auto-detect special tokens by text"; for each role the first text present wins
_DETECT = {
    "eot": ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"],
    "eom": ["<|eom_id|>"],
    "fim_pre": ["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"],
    "fim_suf": ["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"],
    "fim_mid": ["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"],
    "fim_pad": ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    "fim_rep": ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    "fim_sep": ["<|file_sep|>"],
}  # fmt: skip
# load(): texts that always end generation (whatever their role)
_EOG_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
])  # fmt: skip
_SPECIAL_KEYS = {  # role -> metadata key (llama-arch.cpp LLM_KV_TOKENIZER_*_ID); later keys override earlier
    "bos": ["tokenizer.ggml.bos_token_id"],
    "eos": ["tokenizer.ggml.eos_token_id"],
    "eot": ["tokenizer.ggml.eot_token_id"],
    "eom": ["tokenizer.ggml.eom_token_id"],
    "unk": ["tokenizer.ggml.unknown_token_id"],
    "sep": ["tokenizer.ggml.seperator_token_id"],  # sic
    "pad": ["tokenizer.ggml.padding_token_id"],
    "mask": ["tokenizer.ggml.mask_token_id"],
    "fim_pre": ["tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"],
    "fim_suf": ["tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"],
    "fim_mid": ["tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"],
    "fim_pad": ["tokenizer.ggml.fim_pad_token_id"],
    "fim_rep": ["tokenizer.ggml.fim_rep_token_id"],
    "fim_sep": ["tokenizer.ggml.fim_sep_token_id"],
}

# unicode.cpp unicode_byte_to_utf8_map: GPT-2's printable stand-in for each byte
_PRINTABLE = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
BYTE_TO_UNICODE: dict[int, str] = {b: chr(b) for b in _PRINTABLE}
BYTE_TO_UNICODE.update({b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in _PRINTABLE)})
_UNICODE_TO_BYTE = {ord(c): chr(b) for b, c in BYTE_TO_UNICODE.items()}


# element types the arrays must have (llama_vocab::impl::load reads scores as float, token_type as int32)
_ARRAY_KINDS = {
    "tokenizer.ggml.tokens": ("string", "an array of strings"),
    "tokenizer.ggml.merges": ("string", "an array of strings"),
    "tokenizer.ggml.scores": ("f", "an array of floats"),
    "tokenizer.ggml.token_type": ("iu", "an array of integers"),
}


def check_token_arrays(md: Mapping[str, Any]) -> None:
    """The token arrays the file has are of the element types they are read as, and scores and token_type
    cover every token. Cheap: only each array's type and length are looked at, no string is parsed."""
    tokens = md.get("tokenizer.ggml.tokens")
    for key, (kind, what) in _ARRAY_KINDS.items():
        v = md.get(key)
        if v is None:
            continue
        if kind == "string":
            ok = hasattr(v, "tobytes_list")  # a StringArray (or a stand-in with the same bulk reader)
        else:
            ok = isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in kind
        if not ok:
            raise TokenizerError(f"{key} = {describe_value(v)}: expected {what}")
        if tokens is not None and key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            if len(v) < len(tokens):
                raise TokenizerError(
                    f"{key} = {describe_value(v)}: fewer entries than the {len(tokens)} tokens"
                )


def check_special_ids(md: Mapping[str, Any]) -> None:
    """Every special-token id the file sets is an integer inside the token list. Stricter than llama.cpp,
    which warns "bad special token" and keeps its default id; a file that names a token it lacks is
    broken, and its default (bos=1 …) would be a guess."""
    tokens = md.get("tokenizer.ggml.tokens")
    n = len(tokens) if tokens is not None else None
    for keys in _SPECIAL_KEYS.values():
        for key in keys:
            v = md.get(key)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                raise TokenizerError(f"{key} = {describe_value(v)}: expected an integer token id")
            if v < 0 or (n is not None and v >= n):
                raise TokenizerError(f"{key} = {v}: outside the vocabulary of {n} tokens")


def token_bytes(text: str) -> bytes:
    """A token's text back to the raw bytes stored in the file (texts are decoded with surrogateescape)."""
    return text.encode("utf-8", "surrogateescape")


class Vocab:
    """Token table plus llama.cpp's view of it; `kind` is "bpe" (gpt2) or "spm" (llama)."""

    def __init__(self, md: Mapping[str, Any]):
        model = md.get("tokenizer.ggml.model")
        tokens = md.get("tokenizer.ggml.tokens")
        if model == "llama":
            self.kind = "spm"
            ids: dict[str, int | None] = {"bos": 1, "eos": 2, "unk": 0}
        elif model == "gpt2":
            self.kind = "bpe"
            ids = {"bos": 11, "eos": 11}  # llama.cpp's defaults for a BPE file that names none
        else:
            raise TokenizerError(
                f"unsupported tokenizer.ggml.model={model!r}: edgellm tokenizes 'gpt2' (byte-level BPE) "
                "and 'llama' (SentencePiece-style) vocabularies"
            )
        if tokens is None:
            raise TokenizerError("the file has no tokenizer.ggml.tokens string array")
        check_token_arrays(md)
        self.model = model
        self.n_tokens = n = len(tokens)
        self._tokens = tokens
        self._types = md.get("tokenizer.ggml.token_type")
        self._scores = md.get("tokenizer.ggml.scores")
        self.merges = md.get("tokenizer.ggml.merges")
        self.general_name = str(md.get("general.name") or "")

        if self.kind == "bpe":
            if self.merges is None:
                raise TokenizerError("a gpt2 (BPE) vocabulary needs tokenizer.ggml.merges")
            self.pre_name = str(md.get("tokenizer.ggml.pre") or "default")
            spec = pre_spec(self.pre_name)
            self.add_space_prefix, self.add_bos, self.clean_spaces = False, spec.add_bos, spec.clean_spaces
            self.ignore_merges = spec.ignore_merges
        else:
            self.pre_name = "default"
            self.add_space_prefix, self.add_bos = True, True
            self.clean_spaces, self.ignore_merges = False, False
        self.add_eos = False
        self.add_space_prefix = bool(md.get("tokenizer.ggml.add_space_prefix", self.add_space_prefix))

        # special ids: defaults out of range are dropped; metadata in range overrides
        for role, keys in _SPECIAL_KEYS.items():
            v = ids.get(role)
            if v is not None and v >= n:
                v = None
            for key in keys:
                new = md.get(key)
                if isinstance(new, int) and not isinstance(new, bool) and 0 <= new < n:
                    v = new
            ids[role] = v
        self._ids = ids
        if "tokenizer.ggml.add_bos_token" in md:
            self.add_bos = bool(md["tokenizer.ggml.add_bos_token"])
        if "tokenizer.ggml.add_eos_token" in md:
            self.add_eos = bool(md["tokenizer.ggml.add_eos_token"])

    # --- ids known without parsing the vocabulary ---
    @property
    def bos_id(self) -> int | None:
        return self._ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._ids["eos"]

    @property
    def pad_id(self) -> int | None:
        return self._ids["pad"]

    @property
    def unk_id(self) -> int | None:
        return self._ids["unk"]

    # --- the bulk parse ---
    @cached_property
    def texts(self) -> list[str]:
        """Token texts, raw bytes decoded with surrogateescape (so any byte string round-trips)."""
        raw = self._tokens.tobytes_list()
        joined = b"\x00".join(raw)
        if joined.count(b"\x00") == len(raw) - 1:  # one decode for all, unless a token holds a NUL
            texts = joined.decode("utf-8", "surrogateescape").split("\x00")
        else:
            texts = [b.decode("utf-8", "surrogateescape") for b in raw]
        for i, t in enumerate(texts):
            if not t:
                texts[i] = f"[EMPTY_{i}]"  # as llama.cpp does
        return texts

    @cached_property
    def token_to_id(self) -> dict[str, int]:
        return dict(zip(self.texts, range(self.n_tokens), strict=True))

    @cached_property
    def scores(self) -> list[float]:
        return [0.0] * self.n_tokens if self._scores is None else self._scores[: self.n_tokens].tolist()

    @cached_property
    def attrs(self) -> list[int]:
        self._resolve()
        return self._attrs

    @cached_property
    def eog_ids(self) -> frozenset[int]:
        self._resolve()
        return self._eog

    def special_id(self, role: str) -> int | None:
        """Id for a role (bos, eos, eot, eom, unk, sep, pad, mask, fim_pre …), after text detection."""
        if role not in ("bos", "eos", "pad", "unk"):
            self._resolve()
        return self._ids[role]

    @property
    def special_tokens(self) -> list[int]:
        """cache_special_tokens: control, user-defined and unknown tokens, longest text first."""
        self._resolve()
        return self._special

    def _resolve(self) -> None:
        """Attributes, detected special ids and the EOG set, in llama_vocab::impl::load's order."""
        if hasattr(self, "_eog"):
            return
        n = self.n_tokens
        if self._types is None:
            attrs = [ATTR_NORMAL] * n
        else:
            attrs = [_TYPE_ATTR.get(t, 0) for t in self._types[:n].tolist()]
        t2i = self.token_to_id

        def set_attr(i: int, a: int) -> None:
            attrs[i] = a

        for role, texts in _DETECT.items():
            if self._ids.get(role) is None:
                for t in texts:
                    if t in t2i:
                        i = self._ids[role] = t2i[t]
                        set_attr(i, attrs[i] | ATTR_CONTROL)
                        break
        eog = {self._ids[r] for r in ("fim_pad", "fim_rep", "fim_sep") if self._ids.get(r) is not None}
        for t in _EOG_TEXTS:
            i = t2i.get(t)
            if i is not None:
                eog.add(i)
                set_attr(i, attrs[i] | ATTR_CONTROL)
        for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss: always rendered
            if t in t2i:
                set_attr(t2i[t], ATTR_USER_DEFINED)
        eog.update(self._ids[r] for r in ("eos", "eot", "eom") if self._ids.get(r) is not None)
        texts = {self.texts[i]: i for i in eog}
        if "<|end|>" in texts and (
            ("<|return|>" in texts and "<|call|>" in texts) or ("<|calls|>" in texts and "<|flush|>" in texts)
        ):
            eog.discard(texts["<|end|>"])
            set_attr(texts["<|end|>"], ATTR_USER_DEFINED)
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])
            set_attr(texts["</s>"], ATTR_NORMAL)
        mask = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
        special = [i for i, a in enumerate(attrs) if a & mask]
        special.sort(key=lambda i: -len(token_bytes(self.texts[i])))  # std::sort by length; ties: id order
        self._attrs, self._eog, self._special = attrs, frozenset(eog), special
        self._strip_attributes()

    def _strip_attributes(self) -> None:
        """load(): per-model lstrip/rstrip attributes, set after the special-token cache is built."""
        attrs, t2i = self._attrs, self.token_to_id
        name = self.general_name.lower()
        if any(s in self.pre_name for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) and "<mask>" in t2i:
            attrs[t2i["<mask>"]] |= ATTR_LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for i in self._special:
                attrs[i] |= ATTR_RSTRIP
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if t in t2i:
                    attrs[t2i[t]] = attrs[t2i[t]] | ATTR_RSTRIP if on else attrs[t2i[t]] & ~ATTR_RSTRIP
        elif "modern-bert" in name and "[MASK]" in t2i:
            attrs[t2i["[MASK]"]] |= ATTR_LSTRIP

    # --- id -> bytes ---
    @cached_property
    def _pieces(self) -> list[bytes | None]:
        return [None] * self.n_tokens

    def piece(self, i: int, special: bool) -> bytes:
        """llama_token_to_piece(id, lstrip=0, special): the bytes this token stands for."""
        if not 0 <= i < self.n_tokens:
            raise IndexError(f"token id {i} out of range for a vocabulary of {self.n_tokens}")
        attr = self.attrs[i]
        if not special and attr & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        p = self._pieces[i]
        if p is None:
            p = self._pieces[i] = self._make_piece(i, attr)
        return p

    def _make_piece(self, i: int, attr: int) -> bytes:
        text = self.texts[i]
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return token_bytes(text)
        if attr & ATTR_NORMAL:
            if self.kind == "spm":
                return token_bytes(text.replace("\u2581", " "))
            return _bpe_decode_text(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""


def _bpe_decode_text(text: str) -> bytes:
    """llama_decode_text: GPT-2 byte stand-ins back to bytes; other characters become [UNK_BYTE_…] markers."""
    mapped = text.translate(_UNICODE_TO_BYTE)
    try:
        return mapped.encode("latin-1")
    except UnicodeEncodeError:
        pass
    out = bytearray()
    raw = token_bytes(text)
    for ch in text:
        b = _UNICODE_TO_BYTE.get(ord(ch))
        if b is not None:
            out.append(ord(b))
            continue
        cp = 0xFFFD if 0xDC80 <= ord(ch) <= 0xDCFF else ord(ch)  # an invalid byte reads as U+FFFD there
        out += b"[UNK_BYTE_0x" + chr(cp).encode("utf-8", "surrogatepass").hex().encode() + raw + b"]"
    return bytes(out)
