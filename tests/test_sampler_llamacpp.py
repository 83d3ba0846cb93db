"""The samplers beyond the default chain (DRY, top-n-sigma, XTC, min_keep, dynamic temperature,
mirostat 1 and 2) against llama.cpp's own, over the real vocabularies of SmolLM2 and Qwen2.5-Coder.

The fixtures (tests/fixtures/sampler/*.json) come from scripts/make_sampler_fixtures.py, which runs
libllama's samplers on the same seeded logits; they hold only seeds, parameters and llama.cpp's answers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from edgellm.gguf import ModelFile
from edgellm.sampler import (
    RowSampler,
    SamplingParams,
    candidates,
    dry_penalties,
    dynamic_temperature,
    infill,
    min_p,
    mirostat_top,
    mirostat_v2_top,
    softmax,
    temperature,
    top_k,
    top_n_sigma,
    top_p,
    typical_p,
    vocab_dry_breakers,
    xtc,
)
from edgellm.tokenizer import Tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "sampler"
MODELS = {"smollm2": "smollm2_path", "qwen2.5-coder": "qwen_coder_path"}


def logits(seed: int, n: int, scale: float) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


class Always:
    """An RNG whose uniforms are all 0: XTC's chance always fires."""

    def random(self) -> float:
        return 0.0


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    fx = json.loads((FIXTURES / f"{request.param}.json").read_text())
    tok = Tokenizer.from_gguf(ModelFile(request.getfixturevalue(MODELS[request.param])))
    assert tok.vocab_size == fx["n_vocab"]
    return fx, tok


def test_dry_matches_llamacpp(case):
    fx, tok = case
    n = fx["n_vocab"]
    assert sum(len(c["changed"]) > 0 for c in fx["dry"]) >= 10  # the cases do penalize something
    for c in fx["dry"]:
        assert tok.encode(c["text"], add_special=False) == c["history"]
        x = logits(c["seed"], n, 2.0)
        y = dry_penalties(
            x,
            c["history"],
            multiplier=c["multiplier"],
            base=c["base"],
            allowed_length=c["allowed_length"],
            last_n=c["last_n"],
            breakers=vocab_dry_breakers(tok, c["breakers"]),
        )
        changed = np.flatnonzero(y != x)
        assert changed.tolist() == c["changed"], (c["text"], c["breakers"], c["last_n"])
        np.testing.assert_array_equal(y[changed], np.asarray(c["values"], np.float32))


def test_dry_in_the_chain_is_what_the_step_gives(case):
    """A greedy row sampler with DRY picks the argmax of llama.cpp's penalized logits."""
    fx, tok = case
    n = fx["n_vocab"]
    for c in fx["dry"]:
        if not c["changed"]:
            continue
        params = SamplingParams(temperature=0.0, dry_multiplier=c["multiplier"], dry_base=c["base"],
                                dry_allowed_length=c["allowed_length"], dry_penalty_last_n=c["last_n"],
                                dry_sequence_breakers=tuple(c["breakers"]))  # fmt: skip
        x = logits(c["seed"], n, 2.0)
        want = x.copy()
        want[c["changed"]] = c["values"]
        row = RowSampler(params, dry_breakers=vocab_dry_breakers(tok, c["breakers"]))
        assert row(x, c["history"]) == int(np.argmax(want))


def test_top_n_sigma_matches_llamacpp(case):
    fx, _ = case
    n = fx["n_vocab"]
    for c in fx["top_n_sigma"]:
        x = logits(c["seed"], n, c["scale"])
        x[np.random.default_rng(c["seed"] + 50).choice(n, c["n_inf"], replace=False)] = -np.inf
        out = top_n_sigma(candidates(x), c["n"])
        assert out.logits.size == n  # masked in place, as llama.cpp
        kept = np.sort(out.ids[np.isfinite(out.logits)])
        assert kept.size == c["n_kept"]
        if c["kept"] is not None:
            assert kept.tolist() == c["kept"]


def test_xtc_matches_llamacpp(case):
    fx, _ = case
    n = fx["n_vocab"]
    assert any(c["removed"] for c in fx["xtc"]) and any(not c["removed"] for c in fx["xtc"])
    for c in fx["xtc"]:
        x = logits(c["seed"], n, c["scale"])
        out = xtc(candidates(x), 1.0, c["threshold"], c["min_keep"], Always())
        removed = np.setdiff1d(np.arange(n), out.ids)
        assert removed.tolist() == c["removed"], (c["threshold"], c["min_keep"])


def test_min_keep_matches_llamacpp(case):
    fx, _ = case
    n = fx["n_vocab"]
    steps = {"top_p": top_p, "min_p": min_p, "typical_p": typical_p}
    for c in fx["min_keep"]:
        x = logits(c["seed"], n, c["scale"])
        out = steps[c["kind"]](top_k(candidates(x), 2000), c["p"], min_keep=c["min_keep"])
        assert np.sort(out.ids).tolist() == c["kept"], (c["kind"], c["p"], c["min_keep"])


def test_dynamic_temperature_matches_llamacpp(case):
    fx, _ = case
    n = fx["n_vocab"]
    for c in fx["dynatemp"]:
        x = logits(c["seed"], n, c["scale"])
        cand = top_k(candidates(x), c["top_k"])
        out = dynamic_temperature(cand, c["temp"], c["delta"], c["exponent"])
        assert out.logits.size == c["n"]
        order = np.argsort(out.ids)
        assert out.ids[order][:50].tolist() == c["ids"]
        got, want = out.logits[order][:50], np.asarray(c["logits"], np.float32)
        fin = np.isfinite(want)
        assert (np.isfinite(got) == fin).all()
        np.testing.assert_array_equal(got[fin], want[fin])


def test_mirostat_matches_llamacpp(case):
    """Each step keeps as many tokens as llama.cpp's; mu follows llama.cpp's picks (its RNG is not
    ours), updated from the pick's probability among the kept tokens."""
    fx, _ = case
    n = fx["n_vocab"]
    for m in fx["mirostat"]:
        mu = 2.0 * m["tau"]
        for s in m["steps"]:
            c = candidates(logits(s["seed"], n, 3.0))
            if m["temp"] != 1.0:
                c = temperature(c, m["temp"])
            kept = mirostat_top(c, mu, n) if m["version"] == 1 else mirostat_v2_top(c, mu)
            assert kept.ids.size == s["kept"], (m, s)
            assert s["selected"] in kept.ids
            p = float(softmax(kept.logits)[kept.ids.tolist().index(s["selected"])])
            mu = float(np.float32(mu - m["eta"] * (-math.log2(p) - m["tau"])))


def test_xtc_fires_by_chance_and_keeps_the_stream_deterministic():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    params = SamplingParams(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0, xtc_probability=0.5,
                            xtc_threshold=0.1, seed=7)  # fmt: skip
    row, again = RowSampler(params), RowSampler(params)
    a = [row(x) for _ in range(400)]
    assert a == [again(x) for _ in range(400)]  # the chance comes from the row's seeded stream
    # when XTC fires (half the time) 0 and 1 go (at or above 0.1, not the last such): 2 and 3 stay, 3:1
    counts = np.bincount(a, minlength=4) / len(a)
    assert counts[0] == pytest.approx(0.5 * 0.5, abs=0.08)
    assert counts[2] == pytest.approx(0.5 * 0.15 + 0.5 * 0.75, abs=0.08)


def test_greedy_stays_argmax_unless_a_later_step_moves_it():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    assert RowSampler(SamplingParams(temperature=0.0, top_n_sigma=1.0, min_keep=3)).is_greedy
    row = RowSampler(SamplingParams(temperature=0.0, xtc_probability=1.0, xtc_threshold=0.1))
    assert not row.is_greedy  # XTC removes 0 and 1 (above 0.1, not the last of them), temperature 0
    assert row(x) == 2  # keeps the largest of what is left, as llama.cpp's temp_ext(0) does
    assert RowSampler(SamplingParams(temperature=0.0, mirostat=2)).is_greedy


def test_mirostat_row_moves_mu_and_refuses_top_k_shortcut():
    row = RowSampler(SamplingParams(mirostat=2, mirostat_tau=3.0, mirostat_eta=0.2, seed=3))
    assert row.stateful and not row.top_k_first
    x = logits(11, 5000, 3.0)
    mu0 = row.mu
    tok = row(x)
    ids, p = row.last_distribution()
    want = mu0 - 0.2 * (-math.log2(p[list(ids).index(tok)]) - 3.0)
    assert row.mu == pytest.approx(want, rel=1e-6)


def test_new_fields_are_validated():
    bad_fields = [
        dict(min_keep=-1),
        dict(xtc_probability=1.5),
        dict(dynatemp_range=-0.1),
        dict(mirostat=3),
        dict(dry_multiplier=-1.0),
        dict(dry_allowed_length=-1),
        dict(dry_penalty_last_n=-2),
        dict(mirostat_tau=math.nan),
        dict(top_n_sigma=math.inf),
        dict(dry_sequence_breakers=(1,)),
    ]
    for bad in bad_fields:
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad).validate()


def test_gguf_sampling_keys_for_mirostat_and_xtc():
    meta = {"general.sampling.mirostat": 2, "general.sampling.mirostat_tau": "4.5",
            "general.sampling.xtc_probability": 0.25}  # fmt: skip
    p = SamplingParams.from_gguf_metadata(meta)
    assert (p.mirostat, p.mirostat_tau, p.xtc_probability) == (2, 4.5, 0.25)
    with pytest.raises(ValueError, match="general.sampling.mirostat"):
        SamplingParams.from_gguf_metadata({"general.sampling.mirostat": 5})


def test_infill_matches_llamacpp(case):
    """llama.cpp's infill sampler after top_k, on logits where code-like tokens (some the beginning of
    others) and, in some cases, the end of generation are likely: the same tokens remain."""
    fx, tok = case
    n = fx["n_vocab"]
    eot = tok.eot_id if tok.eot_id is not None else tok.eos_id
    piece = lambda t: tok.token_to_piece(t, False)  # noqa: E731
    for c in fx["infill"]:
        rng = np.random.default_rng(c["seed"])
        x = logits(c["seed"], n, 1.0)
        x[c["boost"]] += rng.uniform(5.0, 9.0, len(c["boost"])).astype(np.float32)
        if (c["seed"] - 300) % 3 == 0:
            x[c["eog"]] += np.float32(6.0 + c["seed"] - 300)
        out = infill(top_k(candidates(x), c["top_k"]), tok.eog_ids, piece, eot)
        order = np.argsort(out.ids)
        assert out.ids[order].tolist() == c["kept"], c["seed"]
        np.testing.assert_array_equal(out.logits[order], np.asarray(c["logits"], np.float32))


def test_adaptive_p_matches_llamacpp(case):
    """llama.cpp's adaptive-p over 5 draws: the transformed logits equal libllama's, with the moving
    average following llama.cpp's picks (its RNG is not ours), decay clamped to 0.99."""
    from edgellm.sampler import _probs_in_order, adaptive_p

    fx, _ = case
    n = fx["n_vocab"]
    for run in fx["adaptive_p"]:
        decay = np.float32(min(max(run["decay"], 0.0), 0.99))
        ws = float(np.float32(run["target"]) / (np.float32(1) - decay))
        tw = float(np.float32(1) / (np.float32(1) - decay))
        for s in run["steps"]:
            c = candidates(logits(s["seed"], n, 2.5))
            c = top_k(c, run["top_k"]) if run["top_k"] else c
            out = adaptive_p(c, run["target"], ws, tw)
            got = dict(zip(out.ids.tolist(), out.logits.tolist(), strict=True))
            assert [got[i] for i in s["ids"]] == [float(np.float32(v)) for v in s["logits"]], (run, s["seed"])
            p = _probs_in_order(c)[c.ids.tolist().index(s["selected"])]
            ws = float(p + decay * np.float32(ws))
            tw = float(np.float32(1) + decay * np.float32(tw))


def test_adaptive_p_row_is_stateful_and_off_unless_named():
    x = logits(12, 3000, 2.0)
    assert not RowSampler(SamplingParams(adaptive_target=0.3, seed=1)).stateful  # not in the chain: off
    row = RowSampler(SamplingParams(adaptive_p=True, adaptive_target=0.3, top_k=0, seed=1))
    assert row.stateful and not row.top_k_first
    before = row.weighted_sum
    tok = row(x)
    ids, _ = row.last_distribution()
    assert tok in ids and row.weighted_sum != before  # the drawn token's probability moved the average
