"""Embeddings (edgellm/embed.py, LLM.embed): SmolLM2's pooled final-norm hidden states against llama.cpp's
`llama-embedding` (fixtures from scripts/make_embedding_fixtures.py), pooling and normalization against
their definitions, and embeddings computed on a running engine's thread; the fill-in-the-middle prompt
(llama_api.infill_ids) against llama.cpp's layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import edgellm
from edgellm import embed
from edgellm import llama_api as la

FIXTURES = Path(__file__).parent / "fixtures" / "embeddings"


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return edgellm.LLM(smollm2_path, backend="native", threads=1, n_ctx=256)


@pytest.mark.parametrize("pooling", ["last", "mean", "cls"])
def test_embeddings_match_llama_cpp(smollm2, smollm2_path, pooling):
    """Cosine > 0.999 with llama.cpp's vector, and nearer to it than 0.15 of the distance between the two
    sentences' vectors (llama.cpp quantizes activations to 8 bits in the matmuls; edgellm's reference
    backend, which keeps them float, is as far from it as native is)."""
    ref = json.loads((FIXTURES / f"{smollm2_path.stem}.json").read_text())[pooling]
    refs = [np.asarray(v) for v in ref.values()]
    apart = float(np.linalg.norm(refs[0] - refs[1]))  # how far two different sentences are
    for prompt, vec in zip(ref, refs):
        v = smollm2.embed(prompt, pooling=pooling)[0]
        assert v.shape == (576,) and abs(np.linalg.norm(v) - 1) < 1e-5
        assert float(v @ vec) > 0.999, (pooling, prompt)
        assert np.linalg.norm(v - vec) < 0.15 * apart, (pooling, prompt)  # much nearer than the other


def test_pooling_and_normalization_are_their_definitions():
    rng = np.random.default_rng(1)
    h = rng.standard_normal((5, 8)).astype(np.float32)
    assert np.allclose(embed.pool(h, "mean"), h.mean(axis=0), atol=1e-6)
    assert np.array_equal(embed.pool(h, "cls"), h[0]) and np.array_equal(embed.pool(h, "last"), h[-1])
    assert embed.pool(h, "none") is h
    v = h[0]
    assert np.allclose(embed.normalize(v, 2), v / np.linalg.norm(v), atol=1e-6)
    assert np.allclose(embed.normalize(v, 0), v / (np.abs(v).max() / 32760.0), rtol=1e-5)
    assert np.allclose(embed.normalize(v, 3), v / (np.abs(v) ** 3).sum() ** (1 / 3), atol=1e-6)
    assert embed.normalize(v, -1) is v
    assert np.allclose(np.linalg.norm(embed.normalize(h, 2), axis=1), 1)  # row-wise for "none"
    assert embed.default_pooling(1) == "mean" and embed.default_pooling(None) == "last"
    with pytest.raises(ValueError, match="pooling"):
        embed.pool(h, "max")


def test_embeddings_on_a_running_engine_run_between_its_steps(smollm2):
    """With the engine's own thread running generations, an embedding is computed on that thread (the
    backend is not thread-safe) and equals the one computed with the engine idle."""
    idle = smollm2.embed_ids(smollm2.tokenize("hello there"), "mean")
    engine = smollm2.open_engine(max_seqs=2)
    engine.start()
    try:
        from edgellm.engine import GenRequest

        streams = [engine.submit(GenRequest(smollm2.tokenize("Once upon a time"), smollm2.params(), 24))]
        busy = smollm2.embed_ids(smollm2.tokenize("hello there"), "mean")
        assert np.allclose(busy, idle, atol=1e-6)
        assert [ev.finish_reason for ev in streams[0] if ev.finish_reason] == ["length"]
    finally:
        engine.shutdown(0.0)
    with pytest.raises(ValueError, match="empty"):
        smollm2.embed_ids([], "mean")
    with pytest.raises(edgellm.engine.ContextOverflow):
        smollm2.embed_ids([1] * 300, "mean")


class _Vocab:
    def __init__(self, ids: dict, add_bos: bool = False, bos_id: int | None = None):
        self.ids, self.add_bos, self.bos_id = ids, add_bos, bos_id

    def special_id(self, role: str):
        return self.ids.get(role)


class _Tok:
    """Characters as token ids (ord), FIM roles at ids >= 1000."""

    def __init__(self, vocab: _Vocab):
        self.vocab = vocab

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        assert not add_special and not parse_special
        return [ord(c) for c in text]


def test_the_infill_prompt_is_llama_cpps_repo_level_layout():
    PRE, SUF, MID, REP, SEP, BOS = 1000, 1001, 1002, 1003, 1004, 1005
    full = _Tok(
        _Vocab({"fim_pre": PRE, "fim_suf": SUF, "fim_mid": MID, "fim_rep": REP, "fim_sep": SEP}, True, BOS)
    )
    t = [ord(c) for c in "x"]
    ids = la.infill_ids(full, "def f(", "):\n", [{"filename": "a.py", "text": "x"}], "a")
    want = [REP, *map(ord, "myproject\n"), SEP, *map(ord, "a.py\n"), *t, SEP, *map(ord, "filename\n"),
            BOS, PRE, *map(ord, "def f("), ord("a"), SUF, *map(ord, "):\n"), MID]  # fmt: skip
    assert ids == want
    bare = _Tok(_Vocab({"fim_pre": PRE, "fim_suf": SUF, "fim_mid": MID}))
    assert la.infill_ids(bare, "ab", "cd") == [PRE, 97, 98, SUF, 99, 100, MID]
    # the prefix keeps its end (3/4 of a batch), the suffix its start (a quarter, less the prompt and 2)
    ids = la.infill_ids(bare, "p" * 50 + "END", "START" + "s" * 50, n_batch=16)
    assert ids == [PRE, *map(ord, "pEND"[-12:].rjust(12, "p")), SUF, *map(ord, "ST"), MID]
    with pytest.raises(la.NoInfill, match="middle"):
        la.infill_ids(_Tok(_Vocab({"fim_pre": PRE, "fim_suf": SUF})), "a", "b")
