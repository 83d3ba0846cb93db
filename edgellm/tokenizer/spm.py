"""SentencePiece-style BPE (tokenizer.ggml.model = "llama"), token for token as llama.cpp's llm_tokenizer_spm.

Mirrors ggml-org/llama.cpp src/llama-vocab.cpp llm_tokenizer_spm_session: spaces become U+2581 ("▁"), the
fragment is split into characters, and the adjacent pair whose concatenation is the highest-scoring token
is merged first (ties: leftmost) until no pair forms a token; characters left over fall back to <0xNN> byte
tokens. llama.cpp runs this over a whole fragment. We cut the fragment before each "▁" that follows a
character no token ever has right before a "▁" -- no merge can cross such a cut, so the ids are the same --
and cache chunk -> ids, which makes prose fast.
"""

from __future__ import annotations

import re
from functools import cached_property
from heapq import heapify, heappop, heappush

from .errors import TokenizerError
from .vocab import Vocab

_SPACE = "\u2581"
_CACHE_SIZE = 65536


class SPM:
    """Encodes text fragments (special tokens already split out) with one GGUF SentencePiece vocabulary."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._cache: dict[str, list[int]] = {}

    @cached_property
    def _chunks(self) -> re.Pattern[str]:
        # characters c with "c▁" inside some token: a cut after them could split a token, so none is made
        glue = set()
        for t in self.vocab.texts:
            i = t.find(_SPACE, 1)
            while i > 0:
                if t[i - 1] != _SPACE:
                    glue.add(t[i - 1])
                i = t.find(_SPACE, i + 1)
        if glue:
            g = "".join(re.escape(c) for c in sorted(glue))
            body = f"[^{_SPACE}{g}]|[{g}]{_SPACE}*"
        else:
            body = f"[^{_SPACE}]"
        return re.compile(f"{_SPACE}+(?:{body})*|(?:{body})+")

    def prepare(self) -> None:
        """Build the lookup tables now rather than on first use."""
        _ = self.vocab.scores
        _ = self._chunks

    def encode(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for chunk in self._chunks.findall(text.replace(" ", _SPACE)):
            ids = cache.pop(chunk, None)
            if ids is None:
                ids = self._encode_chunk(chunk)
                if len(cache) >= _CACHE_SIZE:
                    del cache[next(iter(cache))]  # least recently used: hits are re-inserted at the end
            cache[chunk] = ids
            out += ids

    def _encode_chunk(self, text: str) -> list[int]:
        t2i = self.vocab.token_to_id
        n = len(text)
        size = [1] * n  # symbol i covers text[i : i + size[i]]; 0 once merged into its left neighbour
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        if n > 1:
            scores = self.vocab.scores
            prev = list(range(-1, n - 1))
            heap = []
            for i in range(n - 1):
                t = t2i.get(text[i : i + 2])
                if t is not None:
                    heap.append((-scores[t], i, i + 1, 2))
            heapify(heap)
            while heap:  # highest score first, then leftmost (llm_bigram_spm::comparator)
                _, left, right, width = heappop(heap)
                if not size[left] or not size[right] or size[left] + size[right] != width:
                    continue  # outdated
                size[left] += size[right]
                size[right] = 0
                nxt[left] = nxt[right]
                if nxt[right] >= 0:
                    prev[nxt[right]] = left
                for a, b in ((prev[left], left), (left, nxt[left])):
                    if a >= 0 and b >= 0:
                        w = size[a] + size[b]
                        t = t2i.get(text[a : a + w])
                        if t is not None:
                            heappush(heap, (-scores[t], a, b, w))
        out: list[int] = []
        i = 0
        while i != -1:
            piece = text[i : i + size[i]]
            t = t2i.get(piece)
            if t is not None:
                out.append(t)
            else:  # only single characters can be left without a token: spell them in bytes
                out.extend(self._byte_token(b) for b in piece.encode("utf-8", "surrogatepass"))
            i = nxt[i]
        return out

    def _byte_token(self, b: int) -> int:
        """llama_vocab::byte_to_token for SPM: <0xNN>, else the byte itself as a token."""
        t2i = self.vocab.token_to_id
        t = t2i.get(f"<0x{b:02X}>")
        if t is None:
            t = t2i.get(chr(b) if b < 0x80 else chr(0xDC00 + b))
        if t is None:
            raise TokenizerError(f"the vocabulary has no token for byte 0x{b:02X} (nor <0x{b:02X}>)")
        return t
