"""Tokenizer: text <-> token ids for a GGUF file, with the same ids and text as llama.cpp.

encode() is llama_tokenize(vocab, text, add_special, parse_special) (src/llama-vocab.cpp
llama_vocab::impl::tokenize): special tokens are split out first (special.py), the text between them goes
through the vocabulary's model (bpe.py or spm.py), BOS/EOS are added as the file asks. decode() is
llama_detokenize(vocab, ids, remove_special=False, unparse_special=special) (stream.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any

from .bpe import BPE
from .errors import TokenizerError
from .special import SpecialSplitter
from .spm import SPM
from .stream import StreamDecoder, detokenize
from .vocab import ATTR_CONTROL, ATTR_UNKNOWN, Vocab


class Tokenizer:
    """A GGUF vocabulary's tokenizer. Build with Tokenizer.from_gguf(model_file); opening costs nothing,
    the vocabulary is parsed in bulk on first use."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._model: BPE | SPM = BPE(vocab) if vocab.kind == "bpe" else SPM(vocab)

    @classmethod
    def from_gguf(cls, model_file: Any) -> Tokenizer:
        """From a ModelFile (or its metadata mapping). The vocabulary is read from the file on first use,
        so keep the file open until then, or call load()."""
        md: Mapping[str, Any] = getattr(model_file, "metadata", model_file)
        return cls(Vocab(md))

    def load(self) -> Tokenizer:
        """Parse everything now (~0.3 s for a 262k vocabulary) instead of on the first encode/decode."""
        _ = self.vocab.attrs
        _ = self._splitter
        self._model.prepare()
        return self

    # --- what the file says ---
    @property
    def vocab_size(self) -> int:
        return self.vocab.n_tokens

    @property
    def model(self) -> str:
        """tokenizer.ggml.model: "gpt2" or "llama"."""
        return self.vocab.model

    @property
    def pre(self) -> str:
        """tokenizer.ggml.pre (BPE pre-tokenizer name; "default" for SentencePiece)."""
        return self.vocab.pre_name

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.vocab.eos_id

    @property
    def pad_id(self) -> int | None:
        return self.vocab.pad_id

    @property
    def eot_id(self) -> int | None:
        """End of turn: tokenizer.ggml.eot_token_id, else found by text (<|im_end|>, <end_of_turn> …)."""
        return self.vocab.special_id("eot")

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def eog_ids(self) -> frozenset[int]:
        """Ids that end generation: EOS, EOT, EOM, FIM pad/repo/sep and llama.cpp's list of end texts."""
        return self.vocab.eog_ids

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (GPT-2 byte stand-ins, ▁ for spaces …)."""
        self._check(token_id)
        return self.vocab.texts[token_id].encode("utf-8", "surrogateescape").decode("utf-8", "replace")

    def is_special(self, token_id: int) -> bool:
        """Control or unknown token: one that decode() leaves out unless special=True."""
        self._check(token_id)
        return bool(self.vocab.attrs[token_id] & (ATTR_CONTROL | ATTR_UNKNOWN))

    # --- text -> ids ---
    @cached_property
    def _splitter(self) -> SpecialSplitter:
        return SpecialSplitter(self.vocab)

    def has_special_text(self, text: str) -> bool:
        """Whether `text` spells a control token that encode(parse_special=True) would turn into its id."""
        return self._splitter.split(text, True) != self._splitter.split(text, False)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize: add_special adds BOS/EOS as the file asks; parse_special turns the text of
        control tokens (e.g. "<|im_start|>") into those tokens instead of tokenizing it as text."""
        v = self.vocab
        out: list[int] = []
        if add_special and v.add_bos:
            out.append(self._required(v.bos_id, "BOS"))
        spm = v.kind == "spm"
        prev_special = True  # SentencePiece: a space prefix goes on text at the start or after a special
        for frag in self._splitter.split(text, parse_special):
            if type(frag) is int:
                out.append(frag)
                prev_special = True
                continue
            if spm and v.add_space_prefix and prev_special:
                frag = " " + frag
            self._model.encode(frag, out)
            prev_special = False
        if add_special and v.add_eos:
            out.append(self._required(v.eos_id, "EOS"))
        return out

    # --- ids -> text ---
    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """llama_token_to_piece: the bytes of one token (b"" for control tokens unless special)."""
        return self.vocab.piece(token_id, special)

    def detokenize(self, ids: Iterable[int], special: bool = False) -> bytes:
        """decode() before UTF-8 decoding: exactly llama_detokenize's bytes."""
        return detokenize(self.vocab, ids, special)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """llama_detokenize(remove_special=False, unparse_special=special), invalid UTF-8 as U+FFFD."""
        return self.detokenize(ids, special).decode("utf-8", "replace")

    def stream(self, special: bool = False) -> StreamDecoder:
        """A streaming detokenizer: push(id) -> complete text so far, flush() -> the rest."""
        return StreamDecoder(self.vocab, special)

    def _check(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab.n_tokens:
            raise IndexError(f"token id {token_id} out of range for a vocabulary of {self.vocab.n_tokens}")

    @staticmethod
    def _required(token_id: int | None, what: str) -> int:
        if token_id is None:
            raise TokenizerError(f"the file asks to add a {what} token but defines none")
        return token_id

    def __repr__(self) -> str:
        return f"Tokenizer({self.model}, pre={self.pre!r}, n_vocab={self.vocab_size})"


def format_tokens(tok: Tokenizer, ids: Iterable[int]) -> list[tuple[int, str]]:
    """(id, printable piece) per token, for `edgellm tokenize`: control characters escaped (\\n), bytes
    that are not a whole UTF-8 character (part of an emoji) shown as <0xNN>."""
    rows = []
    for i in ids:
        text = tok.token_to_piece(i, special=True).decode("utf-8", "surrogateescape")
        shown = []
        for c in text:
            if 0xDC80 <= ord(c) <= 0xDCFF:  # an undecodable byte
                shown.append(f"<0x{ord(c) - 0xDC00:02X}>")
            elif c.isprintable() or c == " ":
                shown.append(c)
            else:
                shown.append(repr(c)[1:-1])
        rows.append((i, "".join(shown)))
    return rows
