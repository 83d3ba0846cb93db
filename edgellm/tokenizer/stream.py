"""Ids back to text: llama.cpp's detokenize, and a streaming version that only ever yields whole characters.

detokenize() mirrors ggml-org/llama.cpp src/llama-vocab.cpp llama_vocab::impl::detokenize: the pieces
joined, the first one's leading space dropped when the vocabulary adds a space prefix, and -- for BPE
vocabularies that ask for it (clean_spaces) -- the three "clean up tokenization spaces" passes.
StreamDecoder yields the same text one id at a time: bytes of a character split across byte tokens (an
emoji) wait for the rest, and text the clean-up passes could still change waits for what follows.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from .vocab import Vocab


def clean_spaces(text: bytes) -> bytes:
    """The three in-place passes of llama_vocab::impl::detokenize, byte for byte."""
    t = bytearray(text)
    # pass 1: " ?", " !", " .", " ," lose the space
    n, total = len(t), 1 if t else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    # pass 2: " ' " -> "'"
    n, total, i = total, 1 if total else 0, 1
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0  # llama.cpp writes a NUL over the skipped space, and later reads it as t[i - 1]
        t[total] = x
        total += 1
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it)
    n, total = total, 1 if total else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm" or (x1 in b"rv" and i + 2 < n and t[i + 2] == 0x65):  # 're, 've
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


def detokenize(
    vocab: Vocab, ids: Iterable[int], special: bool = False, remove_special: bool = False
) -> bytes:
    """llama_detokenize(vocab, ids, remove_special, unparse_special=special), as raw bytes."""
    ids = list(ids)
    remove_space = vocab.add_space_prefix
    if remove_special and vocab.add_bos and ids and ids[0] == vocab.bos_id:
        remove_space = False
        ids = ids[1:]
    if remove_special and vocab.add_eos and ids and ids[-1] == vocab.eos_id:
        ids = ids[:-1]
    pieces = [vocab.piece(i, special) for i in ids]
    if remove_space and pieces and pieces[0][:1] == b" ":
        pieces[0] = pieces[0][1:]
    text = b"".join(pieces)
    return clean_spaces(text) if vocab.clean_spaces else text


_SETTLED = 4  # clean-up passes look at most this far back: bytes before 4 plain ones are final


class StreamDecoder:
    """push(id) -> the text that is now certain; flush() -> the rest. Concatenated: detokenize(ids)."""

    def __init__(self, vocab: Vocab, special: bool = False):
        self._vocab = vocab
        self._special = special
        self._first = True
        self._pending = bytearray()  # bytes the clean-up passes may still change
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        piece = self._vocab.piece(token_id, self._special)
        if self._first:
            self._first = False
            if self._vocab.add_space_prefix and piece[:1] == b" ":
                piece = piece[1:]
        if not self._vocab.clean_spaces:
            return self._utf8.decode(piece)
        buf = self._pending
        buf += piece
        # cut after the last run of _SETTLED bytes that are neither spaces nor quotes: every clean-up rule
        # needs a space or a quote right before the position it changes, so none reaches across the cut
        run, cut = 0, 0
        for k in range(len(buf) - 1, -1, -1):
            if buf[k] in b" '":
                run = 0
                continue
            run += 1
            if run == _SETTLED:
                cut = k + _SETTLED
                break
        if cut == 0:
            return ""
        done = clean_spaces(bytes(buf[:cut]))
        del buf[:cut]
        return self._utf8.decode(done)

    def flush(self) -> str:
        rest = clean_spaces(bytes(self._pending)) if self._pending else b""
        self._pending.clear()
        return self._utf8.decode(rest, final=True)
