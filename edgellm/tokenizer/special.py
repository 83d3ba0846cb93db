"""Split special tokens out of text before tokenizing, as llama.cpp's tokenizer_st_partition does.

Mirrors ggml-org/llama.cpp src/llama-vocab.cpp llama_vocab::impl::tokenizer_st_partition: every special
token (control, user-defined, unknown), longest first, is cut out of every fragment of text still
unprocessed, left to right. User-defined tokens are always cut out; control and unknown ones only when
parse_special is set. A token with the lstrip/rstrip attribute eats the whitespace beside it.
"""

from __future__ import annotations

from .vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN, Vocab

_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale


class SpecialSplitter:
    """tokenizer_st_partition for one vocabulary; only tokens that occur in the text are ever searched for."""

    def __init__(self, vocab: Vocab):
        self._vocab = vocab
        order = vocab.special_tokens
        texts = vocab.texts
        # group the tokens by their first three characters: one `in` test rules out a whole group
        groups: dict[str, list[int]] = {}
        for rank, i in enumerate(order):
            groups.setdefault(texts[i][:3], []).append(rank)
        self._groups = groups
        self._order = order

    def split(self, text: str, parse_special: bool) -> list[str | int]:
        """Fragments in order: str for text still to tokenize, int for a special token id."""
        if not text:
            return []
        ranks = [r for key, rs in self._groups.items() if key in text for r in rs]
        if not ranks:
            return [text]
        ranks.sort()
        vocab = self._vocab
        attrs, texts = vocab.attrs, vocab.texts
        frags: list[str | int] = [text]
        for rank in ranks:
            sid = self._order[rank]
            attr = attrs[sid]
            if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            tok = texts[sid]
            if not any(type(f) is str and tok in f for f in frags):
                continue
            out: list[str | int] = []
            for f in frags:
                if type(f) is not str or tok not in f:
                    out.append(f)
                    continue
                pos, n = 0, len(f)
                while pos < n:
                    m = f.find(tok, pos)
                    if m < 0:
                        break
                    left = f[pos:m]
                    if attr & ATTR_LSTRIP:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        out.append(left)
                    out.append(sid)
                    pos = m + len(tok)
                    if attr & ATTR_RSTRIP:
                        while pos < n and f[pos] in _C_SPACE:
                            pos += 1
                if pos < n:
                    out.append(f[pos:])
            frags = out
        return frags
