"""Speculative decoding by prompt lookup (edgellm/speculative.py): the n-gram guesser, exactness at
temperature 0 on the real SmolLM2 (the same tokens as plain decoding, greedy fast path and full-row path),
the speculative-sampling rule keeping the target's distribution (tested statistically), the per-request
switch and the load rule."""

from __future__ import annotations

import numpy as np
import pytest

import edgellm
from edgellm import speculative
from edgellm.engine import GenRequest
from edgellm.sampler import RowSampler, SamplingParams
from edgellm.speculative import SpecConfig, ngram_draft

COPY = (
    "Repeat this list exactly:\nalpha, beta, gamma, delta, epsilon, zeta, eta, theta\n"
    "alpha, beta, gamma, delta, epsilon, zeta, eta, theta\n"
)


def test_ngram_draft_takes_what_followed_the_latest_earlier_occurrence():
    t = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert ngram_draft(t, 2, n_max=3, n_min=2) == [7, 8]  # the latest earlier "1 2 3" is followed by 7 8
    assert ngram_draft(t, 5, n_max=3, n_min=2) == [7, 8, 5, 1, 2]
    assert ngram_draft([4, 5, 6], 3) == [] and ngram_draft([1], 3) == []
    assert ngram_draft([5, 6, 1, 5, 6], 2, n_max=2, n_min=2) == [1, 5]
    assert [speculative.bucket(n) for n in range(9)] == [0, 1, 1, 3, 3, 3, 3, 7, 7]
    with pytest.raises(ValueError):
        SpecConfig(kind="draft-model")


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return edgellm.LLM(smollm2_path, backend="native", threads=1, n_ctx=512)


def _tokens(llm, prompt: str, spec, n=48, **sampling) -> tuple[list[int], list[int], object]:
    engine = llm.open_engine(spec=spec)
    ids = llm.chat_prompt([{"role": "user", "content": prompt}])
    out = llm._collect([GenRequest(ids, llm.params(**sampling), n)])[0]
    return ids, out.tokens, engine.stats


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0, "repeat_penalty": 1.1}])
def test_greedy_text_is_plain_decodings_and_guesses_are_kept(llm, sampling):
    """Plain greedy rows go through the backend's argmax; a repeat penalty makes them full rows."""
    cfg = SpecConfig(adaptive=False)  # the lookup asked wherever it finds a guess
    for prompt in (COPY, "Write a haiku about the sea."):
        ids, plain, _ = _tokens(llm, prompt, None, **sampling)
        _, spec, stats = _tokens(llm, prompt, cfg, **sampling)
        assert spec == plain, prompt
        # the lookup was asked wherever it finds a guess on the plain text (not at the last token: no room
        # for one). Which text that is depends on near-ties that differ between CPUs: with a repeat penalty
        # SmolLM2 copies the list on one machine and writes about a name on another (AVX-512, Zen 4)
        found = [ngram_draft(ids + plain[:i], 1, cfg.ngram_max, cfg.ngram_min) for i in range(len(plain) - 1)]
        assert (stats.draft_tokens > 0) == any(found), prompt
        if prompt is COPY and "repeat_penalty" not in sampling:  # plain greedy copies the list: kept guesses
            assert stats.draft_tokens > 0 and stats.draft_accepted > 0


def test_speculative_sampling_keeps_the_targets_distribution():
    """verify() on fixed logits: the first token's distribution over many draws equals the sampler's
    own (chi-square), whether the guess is likely, unlikely or outside the candidates; a kept guess is
    followed by a draw from the next row's distribution."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 50)).astype(np.float32) * 2
    sampler = RowSampler(SamplingParams(temperature=0.8, top_k=8, top_p=0.95, min_p=0.0, seed=1))
    ids, probs = sampler.distribution(logits[0])
    want = dict(zip(ids.tolist(), probs.tolist()))
    n = 20000
    for guess in (int(ids[np.argmax(probs)]), int(ids[np.argmin(probs)]), 49 if 49 not in want else 0):
        counts: dict[int, int] = {}
        for _ in range(n):
            first = speculative.verify(sampler, logits, [guess], [])[0]
            counts[first] = counts.get(first, 0) + 1
        assert set(counts) <= set(want)
        chi2 = sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in want.items())
        assert chi2 < 40, (guess, chi2)  # 7 degrees of freedom: p < 1e-5 of failing by chance
    kept = [speculative.verify(sampler, logits, [int(ids[np.argmax(probs)])], []) for _ in range(2000)]
    seconds = [k[1] for k in kept if len(k) == 2]
    ids2, _ = sampler.distribution(logits[1])
    assert seconds and set(seconds) <= set(ids2.tolist())


def test_constrained_rows_guess_only_what_the_grammar_allows_and_keep_plain_decodings_text(llm):
    """A grammar row speculates too: the lookup's guesses are cut where the grammar refuses them and each
    checked row is masked as plain sampling's would be, so at temperature 0 the text is constrained plain
    decoding's, guesses kept where the grammar and the model agree."""
    pytest.importorskip("llguidance")
    from edgellm import structured
    from edgellm.structured import Grammar

    ids = llm.chat_prompt([{"role": "user", "content": COPY}])
    words = "alpha, beta, gamma, delta, epsilon, zeta, eta, theta"
    free = Grammar("lark", "start: /(?s:.*)/")
    bent = Grammar("regex", f"(Sure! )?({words.replace('gamma', 'GAMMA')}\\n?)+")  # the copy must bend
    for grammar in (free, bent):
        runs = []
        for spec in (None, SpecConfig(adaptive=False)):
            engine = llm.open_engine(spec=spec)
            g = engine.compile_grammar(grammar)
            out = llm._collect([GenRequest(ids, llm.params(temperature=0), 40, grammar=g)])[0]
            runs.append((out.tokens, engine.stats.draft_tokens, engine.stats.draft_accepted))
        (plain, _, _), (spec_toks, drafted, kept) = runs
        assert spec_toks == plain and drafted > 0 and kept > 0, (grammar.kind, drafted, kept)
        if grammar is bent:
            assert "GAMMA" in llm.detokenize(plain) and "gamma" not in llm.detokenize(plain)
    c = structured.Constraint(g, structured.guided_tokenizer(llm.tokenizer, llm.model.config.n_vocab))
    words = llm.tokenizer.encode("alpha, beta", add_special=False)
    eos = min(llm.tokenizer.eog_ids)
    assert c.valid_prefix([*words, eos, *words]) == len(words)  # a guess never ends the answer
    toks = llm.tokenizer.encode("alpha, beta, gamma", add_special=False)
    assert c.valid_prefix(toks) == len(toks) - 1  # the bent copy refuses " gamma"
    masks = c.allowed_along(words)
    assert len(masks) == len(words) + 1 and c.valid_prefix(words) == len(words)  # and it did not move
    llm.open_engine(spec=None)


def test_requests_can_opt_out_and_a_busy_engine_does_not_guess(llm):
    engine = llm.open_engine(spec=SpecConfig(max_batch=2, adaptive=False))
    ids = llm.chat_prompt([{"role": "user", "content": COPY}])
    llm._collect([GenRequest(ids, llm.params(temperature=0), 32, speculative=False)])
    assert engine.stats.draft_tokens == 0
    llm._collect([GenRequest(ids, llm.params(temperature=0), 32) for _ in range(3)])  # 3 decode > 2
    assert engine.stats.draft_tokens == 0
    out = llm._collect([GenRequest(ids, llm.params(temperature=0.2, seed=4), 32)])[0]
    assert engine.stats.draft_tokens > 0 and len(out.tokens) > 0  # sampled rows guess too
    llm.open_engine(spec=None)


def test_a_draft_model_with_the_same_vocabulary_guesses_and_another_is_refused(smollm2_path, gemma3_path):
    """SmolLM2 drafting for itself: every guess is kept and the text is plain decoding's; a draft with
    another vocabulary (Gemma 3) is refused in one line. (Not adaptive: a draft as slow as its target
    never pays, so the engine would rarely ask it.)"""
    spec = SpecConfig(kind="draft", model=str(smollm2_path), draft_max=4, adaptive=False)
    llm = edgellm.LLM(smollm2_path, backend="native", threads=1, n_ctx=512, spec=spec)
    ids = llm.chat_prompt([{"role": "user", "content": "Write a haiku about the sea."}])
    drafted = llm._collect([GenRequest(ids, llm.params(temperature=0), 40)])[0]
    stats = llm.engine.stats
    assert stats.draft_tokens > 0 and stats.draft_accepted == stats.draft_tokens
    llm.open_engine(spec=SpecConfig(kind="none"))  # the same LLM, plain decoding
    assert llm.engine.spec is None
    assert llm._collect([GenRequest(ids, llm.params(temperature=0), 40)])[0].tokens == drafted.tokens
    with pytest.raises(ValueError, match="another vocabulary"):
        edgellm.LLM(smollm2_path, backend="native", threads=1, n_ctx=256,
                    spec=SpecConfig(kind="draft", model=str(gemma3_path)))  # fmt: skip


def test_lookup_first_then_the_draft_model(smollm2_path):
    """kind ngram-simple with a draft model: the lookup guesses where the text repeats, the model where it
    does not. SmolLM2 drafting for itself keeps every model guess, so the draft's cache caught up on the
    tokens the lookup steps took; the text is plain decoding's."""
    spec = SpecConfig(model=str(smollm2_path), draft_max=4, adaptive=False)
    llm = edgellm.LLM(smollm2_path, backend="native", threads=1, n_ctx=512, spec=spec)
    steps: list[tuple[int, int]] = []
    kept = llm.engine.draft.kept
    llm.engine.draft.kept = lambda seq, n0, nd, nk: (steps.append((nd, nk)), kept(seq, n0, nd, nk))[1]
    ids = llm.chat_prompt([{"role": "user", "content": COPY}])
    both = llm._collect([GenRequest(ids, llm.params(temperature=0), 48)])[0]
    stats = llm.engine.stats
    by_model = sum(nd for nd, _ in steps)
    assert steps and all(nk == nd for nd, nk in steps)  # the model's guesses: all kept
    assert stats.draft_tokens > by_model  # and the lookup guessed too
    llm.open_engine(spec=None)
    assert llm._collect([GenRequest(ids, llm.params(temperature=0), 48)])[0].tokens == both.tokens
    with pytest.raises(ValueError, match="needs a draft model"):
        SpecConfig(kind="draft")
    with pytest.raises(ValueError, match="not kind 'none'"):
        SpecConfig(kind="none", model="x.gguf")


def test_step_costs_pick_the_guesses_that_pay():
    """Tokens per second of k guesses kept with chance a: (b - 1 + (1 - a^(k+1)) / (1 - a)) / (T(b + k) +
    k g) against plain decoding's b / T(b), with 3% to spare; sizes not timed yet are hoped cheap."""
    c = speculative.StepCosts()
    assert c.guesses(0.9, 1, 7) == 0  # the plain step is not timed yet: no guess
    for n, t in ((1, 0.040), (2, 0.046), (4, 0.056), (8, 0.080)):
        c.step(n, 1.0)  # the first step of a size is left out (a plan capture)
        c.step(n, t)
    assert c.step_s[1] == 0.040 and c.estimate(3) == pytest.approx(0.051)
    assert c.estimate(16) == pytest.approx(0.080 * 1.4)
    c.guessed(4, 0.048)  # 12 ms per draft step
    assert c.guess_s == pytest.approx(0.012)
    # a = 0.9: k = 3 gives 3.44 tokens in 92 ms (37/s), k = 7 5.7 in 164 ms (35/s), k = 1 1.9 in 58 ms
    assert c.guesses(0.9, 1, 7) == 3
    assert c.guesses(0.9, 1, 1) == 1
    # a = 0.45: k = 1 gives 1.45 tokens in 58 ms (25.0/s), under 1.03 * 25/s: plain
    assert c.guesses(0.45, 1, 7) == 0
    c.guess_s = 0.0  # free guesses: a = 0.45 pays, k = 1 (1.45 tokens in 46 ms) more than k = 3 (1.74 in 56)
    assert c.guesses(0.45, 1, 7) == 1
    assert c.guesses(0.45, 8, 7) == 0  # 8 decoding: 8.45 tokens in 84 ms (hoped) < 1.03 * 8 in 80 ms
    # two sequences guessing in one step: the second's guesses must pay on top of the first's
    c = speculative.StepCosts()
    for n, t in ((1, 0.040), (2, 0.046), (4, 0.056), (8, 0.120)):  # compute-bound from 4 tokens
        c.step(n, 1.0)
        c.step(n, t)
    c.guessed(1, 0.004)
    step = speculative.StepGuesses()
    # the first: 3 guesses, 2 + 2.44 tokens in T(5) = 72 ms + 12 ms (52.8/s) beat 1.03 * 2 in 46 ms (44.8/s)
    assert c.guesses(0.9, 2, 3, True, step) == 3
    assert (step.fed, step.spent) == (3, pytest.approx(0.012)) and step.expected == pytest.approx(2.439)
    # the second, as likely kept: 1 more would give 5.44 tokens in 88 + 16 ms (51/s), 3 more 6.9 in
    # 120 + 24 ms (48/s), under 1.03 * 52.8/s: none; alone it would guess 3
    assert c.guesses(0.9, 2, 3, True, step) == 0 and step.fed == 3
    assert c.guesses(0.9, 2, 3) == 3


def test_a_draft_whose_guesses_do_not_pay_is_paused(smollm2_path):
    """With step costs where guessing never pays (fixed: the engine's own timings are not taken), the
    draft model is asked only for one probe guess after each pause (1, 2, 4 steps), then no more; where
    guesses are free it is asked for every step; the text is plain decoding's either way."""
    spec = SpecConfig(kind="draft", model=str(smollm2_path), draft_max=4)
    llm = edgellm.LLM(smollm2_path, backend="native", threads=1, n_ctx=512, spec=spec)
    ids = llm.chat_prompt([{"role": "user", "content": "Write a haiku about the sea."}])
    texts = []
    for guess_s, steps in ((0.05, {1: 0.01, 2: 0.02, 4: 0.04}), (0.0, {1: 0.01, 2: 0.01, 4: 0.01})):
        llm.open_engine(spec=spec)
        costs = llm.engine.costs
        costs.step_s, costs.guess_s = dict(steps), guess_s
        costs.step = costs.guessed = lambda *a: None
        texts.append(llm._collect([GenRequest(ids, llm.params(temperature=0), 40)])[0].tokens)
        texts.append(llm.engine.stats.draft_tokens)
    plain_paused, n_paused, plain_free, n_free = texts
    assert plain_paused == plain_free
    assert n_paused == 3  # probes after pauses of 1, 2 and 4 steps
    assert n_free >= 20  # every step guessed, 3 at a time (SmolLM2 drafting for itself keeps them all)
    llm.open_engine(spec=None)
    assert llm._collect([GenRequest(ids, llm.params(temperature=0), 40)])[0].tokens == plain_paused


def test_llama_cpps_spec_type_lists_and_names():
    from edgellm.cli_serve import ServeError, spec_config

    assert spec_config("none", 8, 1) is None
    assert spec_config("ngram-simple", 4, 1) == SpecConfig(draft_max=4)
    assert spec_config("none", 8, 1, "d.gguf") == SpecConfig(kind="draft", model="d.gguf")  # -md alone
    assert spec_config("draft-simple", 8, 1, "d.gguf") == SpecConfig(kind="draft", model="d.gguf")
    both = SpecConfig(kind="ngram-simple", model="d.gguf")
    assert spec_config("draft-simple,ngram-simple", 8, 1, "d.gguf") == both
    assert spec_config("ngram-simple", 8, 1, "d.gguf") == both
    for bad, says in [("ngram-mod", "ngram-mod: not supported"), ("draft", "needs a draft model"),
                      ("ngram-simple", "draft_min <= draft_max")]:  # fmt: skip
        with pytest.raises(ServeError, match=says):
            spec_config(bad, 2 if "draft_min" in says else 8, 3 if "draft_min" in says else 1)


def test_a_guessing_rows_failing_mask_fails_that_row_alone(llm, monkeypatch):
    """A constrained row whose masks fail on a speculative step ends with the constraint's error (a 500's
    message) while an unconstrained row beside it finishes."""
    pytest.importorskip("llguidance")
    from edgellm import structured
    from edgellm.structured import Grammar

    engine = llm.open_engine(spec=SpecConfig(adaptive=False, max_batch=4))
    free = engine.compile_grammar(Grammar("lark", "start: /(?s:.*)/"))

    def boom(self, draft):
        raise RuntimeError("mask boom")

    monkeypatch.setattr(structured.Constraint, "allowed_along", boom)
    ids = llm.chat_prompt([{"role": "user", "content": COPY}])
    bad = engine.submit(GenRequest(ids, llm.params(temperature=0), 40, grammar=free))
    good = engine.submit(GenRequest(ids, llm.params(temperature=0), 40))
    events: dict = {bad: [], good: []}
    for _ in range(200):  # this engine is stepped by its caller
        if bad.done and good.done:
            break
        engine.step()
        for st in events:
            events[st] += st.ready()
    last_bad, last_good = events[bad][-1], events[good][-1]
    assert last_bad.finish_reason == "error" and "the constraint failed: mask boom" in last_bad.error
    assert last_good.finish_reason == "length"
    llm.open_engine(spec=None)
