"""Byte-level BPE (tokenizer.ggml.model = "gpt2"), token for token as llama.cpp's llm_tokenizer_bpe_session.

Mirrors ggml-org/llama.cpp src/llama-vocab.cpp llm_tokenizer_bpe_session::tokenize: pre-tokenize into words
(pretokenize.py), map each word's UTF-8 bytes to GPT-2's printable stand-ins, then repeatedly merge the
adjacent pair with the lowest rank in tokenizer.ggml.merges (ties: leftmost). A final symbol that is not a
token falls back to its single bytes, and bytes with no token are dropped, as llama.cpp does. Words repeat a
lot in real text, so word -> ids is cached (LRU, bounded).
"""

from __future__ import annotations

from functools import cached_property
from heapq import heapify, heappop, heappush

from .pretokenize import PreTokenizer
from .vocab import BYTE_TO_UNICODE, Vocab

_BYTE_ENCODE = {b: c for b, c in BYTE_TO_UNICODE.items()}  # str.translate table over latin-1 decoded bytes
_CACHE_SIZE = 65536
_SHORT_WORD = 24  # up to this many symbols, a plain scan per merge beats the heap


class BPE:
    """Encodes text fragments (special tokens already split out) with one GGUF BPE vocabulary."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.pre = PreTokenizer(vocab.pre_name)
        self._cache: dict[str, list[int]] = {}

    @cached_property
    def ranks(self) -> dict[str, int]:
        """merge "left right" -> rank (its index; the first of duplicates wins, like bpe_ranks.emplace)."""
        raw = self.vocab.merges.tobytes_list()
        ranks: dict[str, int] = {}
        for i, m in enumerate(b.decode("utf-8", "surrogateescape") for b in raw):
            if m.find(" ", 1) > 0 and m not in ranks:
                ranks[m] = i
        return ranks

    def prepare(self) -> None:
        """Build the merge table now rather than on first use."""
        _ = self.ranks

    def encode(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for word in self.pre.split(text):
            ids = cache.pop(word, None)
            if ids is None:
                ids = self._encode_word(word)
                if len(cache) >= _CACHE_SIZE:
                    del cache[next(iter(cache))]  # least recently used: hits are re-inserted at the end
            cache[word] = ids
            out += ids

    def _encode_word(self, word: str) -> list[int]:
        t2i = self.vocab.token_to_id
        enc = word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_ENCODE)
        if self.vocab.ignore_merges:
            i = t2i.get(enc)
            if i is not None:
                return [i]
        out: list[int] = []
        for sym in self._merge(enc):
            i = t2i.get(sym)
            if i is not None:
                out.append(i)
                continue
            for b in sym.encode("utf-8"):  # single bytes of the symbol's own UTF-8, usually not tokens
                j = t2i.get(chr(b) if b < 0x80 else chr(0xDC00 + b))
                if j is not None:
                    out.append(j)
        return out

    def _merge(self, s: str) -> list[str]:
        """The symbols left after merging: always the lowest-ranked adjacent pair, leftmost on ties."""
        n = len(s)
        if n < 2:
            return [s]
        ranks = self.ranks
        if n <= _SHORT_WORD:
            parts = list(s)
            while len(parts) > 1:
                best, best_rank = -1, 1 << 62
                for i in range(len(parts) - 1):
                    r = ranks.get(parts[i] + " " + parts[i + 1])
                    if r is not None and r < best_rank:
                        best, best_rank = i, r
                if best < 0:
                    break
                parts[best : best + 2] = [parts[best] + parts[best + 1]]
            return parts
        # llama.cpp's priority queue over a linked list of symbols, for long words (e.g. 5000 x "a")
        sym = list(s)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []
        for i in range(n - 1):
            r = ranks.get(sym[i] + " " + sym[i + 1])
            if r is not None:
                heap.append((r, i, i + 1, sym[i] + sym[i + 1]))
        heapify(heap)
        while heap:
            _, left, right, text = heappop(heap)
            if not sym[left] or not sym[right] or sym[left] + sym[right] != text:
                continue  # outdated: one side has changed since this pair was queued
            sym[left], sym[right] = text, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            for a, b in ((prev[left], left), (left, nxt[left])):
                if a >= 0 and b >= 0:
                    r = ranks.get(sym[a] + " " + sym[b])
                    if r is not None:
                        heappush(heap, (r, a, b, sym[a] + sym[b]))
        return [x for x in sym if x]
