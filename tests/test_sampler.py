"""Sampler: llama.cpp's sampler chain steps on hand-made distributions, seeds, batching, validation."""

import math
import subprocess
import sys

import numpy as np
import pytest

from edgellm.sampler import (
    Candidates,
    Sampler,
    SamplingParams,
    apply_logit_bias,
    apply_penalties,
    candidates,
    draw,
    make_sampler,
    min_p,
    softmax,
    temperature,
    top_k,
    top_p,
    typical_p,
)

# A 4-token distribution whose steps are easy to work out by hand.
P4 = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS4 = np.log(P4).astype(np.float32)

PLAIN = dict(top_k=0, top_p=1.0, min_p=0.0)  # every filter off: sample from softmax(logits / T)


def ids(c: Candidates) -> list[int]:
    return c.ids.tolist()


def random_logits(shape, seed=0, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


class FixedUniform:
    """Stands in for a Generator whose next uniform is known."""

    def __init__(self, u):
        self.u = u

    def random(self):
        return self.u


# ---------------------------------------------------------------------------------------------- greedy


def test_greedy_picks_argmax_and_ties_go_to_lowest_id():
    f = make_sampler(SamplingParams(temperature=0.0))
    assert f(np.array([0.1, 2.0, -1.0, 1.9], np.float32)) == 1
    assert f(np.array([0.5, 3.0, 3.0, 3.0], np.float32)) == 1
    s = Sampler([SamplingParams(temperature=0.0)] * 2)
    out = s.sample(np.array([[0.0, 1.0, 1.0], [7.0, -2.0, 7.0]], np.float32))
    assert out.dtype == np.int64
    assert out.tolist() == [1, 0]


def test_greedy_applies_logit_bias_and_penalties_first():
    x = np.array([1.0, 3.0, 2.5], np.float32)
    assert make_sampler(SamplingParams(temperature=0, logit_bias={1: -1.0}))(x) == 2
    # repeat penalty 2 on token 1: 3.0 / 2 = 1.5 < 2.5
    assert make_sampler(SamplingParams(temperature=0, repeat_penalty=2.0))(x, [1]) == 2
    assert make_sampler(SamplingParams(temperature=0, repeat_penalty=2.0))(x, [0]) == 1


@pytest.mark.parametrize("temp", [0.1, 0.8, 1.0, 5.0, 100.0])
def test_top_k_1_equals_greedy_at_any_temperature(temp):
    logits = random_logits((8, 1000), seed=1)
    greedy = Sampler([SamplingParams(temperature=0)] * 8).sample(logits)
    k1 = Sampler([SamplingParams(temperature=temp, top_k=1, seed=s) for s in range(8)])
    for _ in range(3):
        np.testing.assert_array_equal(k1.sample(logits), greedy)


# ---------------------------------------------------------------------------------------------- filters


def test_top_k_keeps_the_k_largest_in_descending_order():
    c = candidates(np.array([1.0, 5.0, 3.0, 4.0, 2.0], np.float32))
    assert ids(top_k(c, 1)) == [1]
    assert ids(top_k(c, 3)) == [1, 3, 2]
    assert top_k(c, 3).logits.tolist() == [5.0, 4.0, 3.0]
    assert top_k(c, 3).sorted
    assert ids(top_k(c, 10)) == [1, 3, 2, 4, 0]  # k > n keeps all, sorted
    assert top_k(c, 0) is c and top_k(c, -1) is c  # <= 0: off


def test_top_k_ties_at_the_boundary_keep_the_lowest_ids():
    c = candidates(np.array([1.0, 5.0, 3.0, 3.0, 3.0, 2.0], np.float32))
    assert ids(top_k(c, 2)) == [1, 2]
    assert ids(top_k(c, 3)) == [1, 2, 3]
    big = np.zeros(5000, np.float32)
    big[[10, 4000]] = 1.0
    assert ids(top_k(candidates(big), 4)) == [10, 4000, 0, 1]


def test_top_p_keeps_the_smallest_prefix_whose_mass_reaches_p():
    c = candidates(LOGITS4[[2, 0, 3, 1]])  # unsorted on purpose: probs 0.15, 0.5, 0.05, 0.3
    assert ids(top_p(c, 0.4)) == [1]
    assert ids(top_p(c, 0.6)) == [1, 3]
    assert ids(top_p(c, 0.79)) == [1, 3]
    assert ids(top_p(c, 0.81)) == [1, 3, 0]
    assert ids(top_p(c, 0.99)) == [1, 3, 0, 2]
    assert top_p(c, 1.0) is c


def test_top_p_on_a_large_vocabulary_matches_a_full_sort():
    # more than 1024 candidates takes the partial-sort path; nucleus sizes from 1 to thousands
    for seed, scale in [(0, 0.5), (1, 3.0), (2, 8.0)]:
        x = random_logits(5000, seed=seed, scale=scale)
        order = np.argsort(-x, kind="stable")
        cum = np.cumsum(softmax(x)[order], dtype=np.float32)
        for p in [0.05, 0.5, 0.9, 0.95, 0.999]:
            last = int(np.argmax(cum >= np.float32(p))) + 1 if cum[-1] >= np.float32(p) else x.size
            got = top_p(candidates(x), p)
            assert sorted(ids(got)) == sorted(order[:last].tolist()), (seed, p)
            sorted_path = top_p(top_k(candidates(x), x.size), p)
            assert sorted(ids(sorted_path)) == sorted(ids(got))


def test_min_p_keeps_tokens_with_prob_at_least_p_times_the_max():
    c = candidates(LOGITS4)
    assert ids(min_p(c, 0.2)) == [0, 1, 2]  # threshold 0.1: 0.05 goes
    assert ids(min_p(c, 0.5)) == [0, 1]  # threshold 0.25
    assert ids(min_p(c, 1.0)) == [0]
    assert min_p(c, 0.0) is c
    shuffled = Candidates(np.array([7, 3, 5]), np.log(np.array([0.1, 0.6, 0.3], np.float32)))
    assert ids(min_p(shuffled, 0.4)) == [3, 5]  # order preserved


def test_typical_p_keeps_tokens_whose_surprise_is_closest_to_the_entropy():
    # H = 1.142 nats; |-log p - H| = 0.449, 0.062, 0.755, 1.853 -> typicality order 1, 0, 2, 3
    c = candidates(LOGITS4)
    assert ids(typical_p(c, 0.2)) == [1]  # the most likely token is not the most typical
    assert ids(typical_p(c, 0.5)) == [1, 0]
    assert ids(typical_p(c, 0.9)) == [1, 0, 2]
    assert ids(typical_p(c, 0.99)) == [1, 0, 2, 3]
    assert typical_p(c, 1.0) is c


def test_typical_p_on_a_large_vocabulary_matches_a_full_sort():
    for seed, scale in [(0, 0.5), (1, 3.0), (2, 8.0)]:
        x = random_logits(5000, seed=seed, scale=scale)
        probs = softmax(x)
        entropy = -np.sum(probs * np.log(probs), dtype=np.float32)
        order = np.argsort(np.abs(-np.log(probs) - entropy), kind="stable")
        cum = np.cumsum(probs[order], dtype=np.float32)
        for p in [0.05, 0.5, 0.9, 0.999]:
            last = int(np.argmax(cum > np.float32(p))) + 1 if cum[-1] > np.float32(p) else x.size
            assert ids(typical_p(candidates(x), p)) == order[:last].tolist(), (seed, p)


def test_typical_p_treats_banned_tokens_as_least_typical():
    x = np.append(LOGITS4, np.float32(-np.inf))
    assert ids(typical_p(candidates(x), 0.5)) == [1, 0]
    assert ids(typical_p(candidates(x), 0.99)) == [1, 0, 2, 3]


def test_temperature_divides_logits_and_zero_keeps_only_the_max():
    c = candidates(np.array([2.0, 4.0, -1.0], np.float32))
    assert temperature(c, 0.5).logits.tolist() == [4.0, 8.0, -2.0]
    assert temperature(c, 2.0).logits.tolist() == [1.0, 2.0, -0.5]
    assert ids(temperature(c, 0.0)) == [1]


# ---------------------------------------------------------------------------------------------- logits


def test_penalties_change_logits_by_the_exact_amounts():
    x = np.array([2.0, -1.0, 0.5, 3.0, 0.0], np.float32)
    history = [0, 1, 1, 4, 9]  # 9 is outside the vocabulary and ignored
    kw = dict(repeat=2.0, frequency=0.5, presence=0.25)
    # seen: 0 once (2/2 - 0.75), 1 twice (-1*2 - 1.25), 4 once (0*2 - 0.75); 2 and 3 unseen
    np.testing.assert_array_equal(
        apply_penalties(x, history, last_n=-1, **kw), np.array([0.25, -3.25, 0.5, 3.0, -0.75], np.float32)
    )
    np.testing.assert_array_equal(
        apply_penalties(x, history, last_n=64, **kw), apply_penalties(x, history, last_n=-1, **kw)
    )
    # window of 3: [1, 4, 9] -> 1 once, 4 once
    np.testing.assert_array_equal(
        apply_penalties(x, history, last_n=3, **kw), np.array([2.0, -2.75, 0.5, 3.0, -0.75], np.float32)
    )
    np.testing.assert_array_equal(apply_penalties(x, history, last_n=0, **kw), x)
    np.testing.assert_array_equal(
        apply_penalties(x, np.array(history), last_n=-1, repeat=1.25),
        np.array([2.0 / 1.25, -1.25, 0.5, 3.0, 0.0], np.float32),  # float32 division, as in llama.cpp
    )


def test_logit_bias_adds_exactly_and_minus_inf_bans_a_token():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(apply_logit_bias(x, {0: 0.5, 2: -1.0, 99: 5.0}), [1.5, 2.0, 2.0])
    params = SamplingParams(temperature=1.5, **PLAIN, logit_bias={2: -math.inf}, seed=3)
    f = make_sampler(params)
    drawn = {f(x) for _ in range(500)}
    assert drawn == {0, 1}
    assert make_sampler(SamplingParams(temperature=0, logit_bias={2: -math.inf}))(x) == 1


def test_draw_never_picks_a_zero_probability_token():
    c = Candidates(np.array([4, 5, 6, 7]), np.array([-np.inf, 0.0, -200.0, 0.0], np.float32))
    assert draw(c, FixedUniform(0.0)) == 5
    assert draw(c, FixedUniform(0.49)) == 5
    assert draw(c, FixedUniform(0.51)) == 7
    assert draw(c, FixedUniform(np.nextafter(1.0, 0.0))) == 7


def test_all_tokens_banned_is_a_clear_error():
    f = make_sampler(SamplingParams(seed=0, logit_bias={0: -math.inf, 1: -math.inf}))
    with pytest.raises(ValueError, match="banned"):
        f(np.array([1.0, 2.0], np.float32))
    with pytest.raises(ValueError, match="row 1: .*NaN"):
        Sampler([SamplingParams(temperature=0)] * 2).sample(np.array([[0.0, 1.0], [np.nan, 1.0]], np.float32))
    with pytest.raises(ValueError, match="row 0: .*banned"):
        Sampler([SamplingParams(seed=0, logit_bias={0: -math.inf})]).sample(
            np.array([[0.0, -np.inf]], np.float32)
        )


def test_callers_logits_are_not_modified():
    logits = random_logits((3, 2000), seed=5)
    before = logits.copy()
    params = [
        SamplingParams(seed=1, logit_bias={3: 2.0, 4: -math.inf}, repeat_penalty=1.3, presence_penalty=0.5),
        SamplingParams(seed=2, top_k=0, typical_p=0.9, temperature=0.7, frequency_penalty=0.2),
        SamplingParams(temperature=0, logit_bias={1: 10.0}, repeat_penalty=1.5),
    ]
    Sampler(params).sample(logits, [[1, 2, 3, 3], [5, 5], [7]])
    for p, row in zip(params, logits, strict=True):
        make_sampler(p)(row, [1, 2, 3])
    np.testing.assert_array_equal(logits, before)


# ---------------------------------------------------------------------------------------------- RNG


def test_same_seed_gives_the_same_draws_and_different_seeds_differ():
    logits = random_logits(3000, seed=2, scale=1.0)
    runs = {}
    for seed in (1234, 1234, 99):
        f = make_sampler(SamplingParams(seed=seed, top_k=0))
        runs.setdefault(seed, []).append([f(logits) for _ in range(40)])
    assert runs[1234][0] == runs[1234][1]
    assert runs[1234][0] != runs[99][0]


def test_same_seed_gives_the_same_draws_in_another_process():
    code = (
        "import numpy as np; from edgellm.sampler import *\n"
        "x = (np.random.default_rng(2).standard_normal(3000)).astype(np.float32)\n"
        "f = make_sampler(SamplingParams(seed=77, top_k=0))\n"
        "print([f(x) for _ in range(30)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    f = make_sampler(SamplingParams(seed=77, top_k=0))
    x = np.random.default_rng(2).standard_normal(3000).astype(np.float32)
    assert out.strip() == str([f(x) for _ in range(30)])


def test_no_seed_draws_a_fresh_one_and_reports_it():
    a, b = make_sampler(SamplingParams()), make_sampler(SamplingParams())
    assert a.seed != b.seed
    assert make_sampler(SamplingParams(seed=5)).seed == 5


def test_empirical_frequencies_match_probabilities_at_temperature_1():
    probs = np.array([0.2, 0.3, 0.5])
    f = make_sampler(SamplingParams(temperature=1.0, seed=0, **PLAIN))
    x = np.log(probs).astype(np.float32)
    n = 20000
    counts = np.bincount([f(x) for _ in range(n)], minlength=3)
    np.testing.assert_allclose(counts / n, probs, atol=0.01)  # 3 sigma is ~0.01 at n = 20000


def test_default_chain_samples_only_from_the_filtered_set():
    # top_p 0.9 keeps 0.5 + 0.3 + 0.15; min_p 0.05 (threshold 0.025) then keeps all three
    f = make_sampler(SamplingParams(seed=11, top_p=0.9, min_p=0.05))
    assert {f(LOGITS4) for _ in range(400)} == {0, 1, 2}
    # min_p 0.2 alone: threshold 0.1 drops only token 3
    g = make_sampler(SamplingParams(seed=11, top_p=1.0, min_p=0.2))
    assert {g(LOGITS4) for _ in range(400)} == {0, 1, 2}


# ---------------------------------------------------------------------------------------------- batch


def test_batched_rows_with_different_params_are_independent():
    params = [
        SamplingParams(temperature=0),
        SamplingParams(seed=1),
        SamplingParams(seed=2, top_k=0, top_p=0.9, repeat_penalty=1.3, frequency_penalty=0.1),
        SamplingParams(seed=3, temperature=1.2, typical_p=0.8, logit_bias={0: -math.inf}),
    ]
    batch = Sampler(params)
    alone = [make_sampler(p) for p in params]
    history = [[1, 2], [3], [4, 4, 5], []]
    for step in range(15):
        logits = random_logits((4, 500), seed=100 + step, scale=2.0)
        out = batch.sample(logits, history)
        expected = [f(logits[b], history[b]) for b, f in enumerate(alone)]
        assert out.tolist() == expected
        for b in range(4):
            history[b].append(int(out[b]))


def test_rows_come_and_go_without_disturbing_the_others():
    logits = random_logits((3, 400), seed=9, scale=2.0)
    s = Sampler([SamplingParams(seed=1), SamplingParams(seed=2)])
    ref = make_sampler(SamplingParams(seed=2))
    assert s.sample(logits[:2])[1] == ref(logits[1])
    assert s.add_row(SamplingParams(temperature=0)) == 2
    assert s.sample(logits)[1:].tolist() == [ref(logits[1]), int(np.argmax(logits[2]))]
    s.remove_row(0)
    assert len(s) == 2
    assert s.sample(logits[1:])[0] == ref(logits[1])
    s.set_row(1, SamplingParams(seed=2))
    assert s.sample(logits[:2]).tolist() == [ref(logits[0]), make_sampler(SamplingParams(seed=2))(logits[1])]


def test_sample_rejects_logits_of_the_wrong_shape():
    s = Sampler([SamplingParams(seed=0)] * 2)
    with pytest.raises(ValueError, match=r"\(2, V\)"):
        s.sample(np.zeros((3, 10), np.float32))
    with pytest.raises(ValueError, match="history"):
        s.sample(np.zeros((2, 10), np.float32), [[1]])


# ---------------------------------------------------------------------------------------------- params

BAD = [
    ("temperature", math.nan),
    ("temperature", -0.1),
    ("temperature", math.inf),
    ("top_k", -2),
    ("top_k", 1.5),
    ("top_k", True),
    ("top_p", 0.0),
    ("top_p", 1.1),
    ("top_p", math.nan),
    ("min_p", -0.1),
    ("min_p", 1.5),
    ("typical_p", 0.0),
    ("typical_p", 2.0),
    ("repeat_penalty", 0.0),
    ("repeat_penalty", -1.0),
    ("repeat_penalty", math.inf),
    ("frequency_penalty", math.nan),
    ("presence_penalty", math.inf),
    ("repeat_last_n", -2),
    ("repeat_last_n", 3.0),
    ("seed", -1),
    ("seed", 1.5),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {1: math.nan}),
    ("logit_bias", {1: math.inf}),
    ("logit_bias", {"a": 1.0}),
    ("temperature", "0.7"),
]


@pytest.mark.parametrize("field,value", BAD)
def test_validate_rejects_nan_negative_and_absurd_values(field, value):
    params = SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=f"SamplingParams.{field} "):
        params.validate()
    with pytest.raises(ValueError):
        Sampler([params])
    with pytest.raises(ValueError):
        make_sampler(params)


def test_validate_accepts_defaults_and_edge_values():
    SamplingParams().validate()
    SamplingParams(temperature=0, top_k=-1, top_p=1.0, min_p=1.0, typical_p=1.0, repeat_last_n=-1).validate()
    edge = SamplingParams(min_p=0.0, seed=2**64, logit_bias={5: -math.inf}, frequency_penalty=-2.0)
    edge.validate(n_vocab=6)
    with pytest.raises(ValueError, match="< 6"):
        SamplingParams(logit_bias={6: 1.0}).validate(n_vocab=6)


def test_logit_bias_is_frozen_against_later_edits():
    bias = {1: 1.0}
    params = SamplingParams(logit_bias=bias)
    bias[2] = -math.inf
    assert dict(params.logit_bias) == {1: 1.0}


def test_from_gguf_metadata_reads_general_sampling_keys_and_overrides_win():
    meta = {
        "general.sampling.temp": 0.6,
        "general.sampling.top_k": 20,
        "general.sampling.top_p": 0.9,
        "general.sampling.min_p": 0.0,
        "general.sampling.penalty_last_n": 128.0,  # a float for an int key reads as llama.cpp's strtol would
        "general.sampling.penalty_repeat": "1.1",
        "general.sampling.sequence": "kt",  # a sampler order: edgellm runs one order, ignored
        "general.architecture": "llama",
    }
    p = SamplingParams.from_gguf_metadata(meta, top_k=50)
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_last_n, p.repeat_penalty) == (
        0.6,
        50,
        0.9,
        0.0,
        128,
        1.1,
    )
    assert SamplingParams.from_gguf_metadata({}) == SamplingParams()
    assert SamplingParams.from_gguf_metadata({"general.sampling.temp": "warm"}).temperature == 0.8


def test_from_gguf_metadata_names_the_key_of_an_invalid_value():
    with pytest.raises(ValueError, match="general.sampling.temp"):
        SamplingParams.from_gguf_metadata({"general.sampling.temp": math.nan})
    # an explicit override of the bad key makes the file's value irrelevant
    p = SamplingParams.from_gguf_metadata({"general.sampling.temp": math.nan}, temperature=0.0)
    assert p.temperature == 0.0


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, seed=11),  # llama.cpp's defaults: top_k 40, top_p 0.95, min_p 0.05
        SamplingParams(temperature=1.3, top_k=5, top_p=1.0, min_p=0.0, seed=2),
        SamplingParams(temperature=0.7, top_k=64, typical_p=0.9, seed=5),
        SamplingParams(temperature=0.0),
    ],
    ids=["defaults", "top-k-only", "typical", "greedy"],
)
def test_sampling_from_top_k_candidates_picks_the_whole_rows_token(params):
    """A device hands the sampler each row's top-k candidates (backends.base.top_k_rows) instead of the
    row: the chain gives the same token, ties included, draw after draw."""
    from edgellm.backends.base import top_k_rows
    from edgellm.sampler import RowSampler

    rng = np.random.default_rng(8)
    full, top = RowSampler(params), RowSampler(params)
    assert top.top_k_first
    for _ in range(50):
        row = rng.standard_normal(3000).astype(np.float32) * 3
        row[rng.integers(0, 3000, 40)] = row.max()  # ties at the top and around the k-th
        ids, vals = top_k_rows(row[None], max(params.top_k, 1) + 7)  # more than needed is fine
        assert top.from_top(ids[0], vals[0]) == full(row)


def test_a_row_with_penalties_or_no_top_k_needs_the_whole_row():
    from edgellm.sampler import RowSampler

    whole = [SamplingParams(repeat_penalty=1.1), SamplingParams(top_k=0), SamplingParams(logit_bias={3: 1.0})]
    for p in whole:
        s = RowSampler(p)
        assert not s.top_k_first
        with pytest.raises(ValueError, match="whole row"):
            s.from_top(np.array([1]), np.array([0.0], np.float32))


def test_vllm_allowed_token_ids_and_banned_sequences():
    from edgellm.sampler import RowSampler, allow_only, ban_sequences

    x = np.array([3.0, 2.0, 1.0, 0.0, -1.0], np.float32)
    assert allow_only(x, [4, 2, 99]).tolist() == [-np.inf, -np.inf, 1.0, -np.inf, -1.0]
    assert RowSampler(SamplingParams(temperature=0.0, allowed_token_ids=[3, 4]))(x) == 3
    banned = ((0,), (2, 1))  # token 0 always; token 1 right after a 2
    assert ban_sequences(x, [4], banned).tolist() == [-np.inf, 2.0, 1.0, 0.0, -1.0]
    assert ban_sequences(x, [3, 2], banned).tolist() == [-np.inf, -np.inf, 1.0, 0.0, -1.0]
    row = RowSampler(SamplingParams(temperature=0.0, banned_sequences=[[0], [2, 1]]))
    assert row(x, [2]) == 2 and row(x, [3]) == 1
    for bad in (dict(allowed_token_ids=[]), dict(allowed_token_ids=[5]), dict(banned_sequences=[[]])):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad).validate(n_vocab=5)
