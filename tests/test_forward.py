"""The three real models on the reference backend against llama.cpp's own numbers (committed fixtures made
by scripts/make_llama_fixtures.py): greedy tokens, teacher-forced KL, perplexity, chat; plus batching."""

from __future__ import annotations

import pytest
from forward_checks import (
    CONFIDENT,
    KL_MAX,
    check_forced_steps,
    check_greedy,
    chunk_perplexity,
    greedy,
    load_fixture,
    teacher_forced_kl,
)

ALIASES = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]
FIXTURES = {a: load_fixture(a) for a in ALIASES}
# qwen2.5-coder-0.5b's 24 layers are slow on the numpy reference: one of its prompts here, all six on the
# native backend (tests/test_native_backend.py)
GREEDY_CASES = [
    pytest.param(a, c, id=f"{a}:{c['prompt'][:20]}")
    for a in ALIASES
    for c in FIXTURES[a]["greedy"][: 1 if a.startswith("qwen") else None]
]
_LLMS: dict = {}


@pytest.fixture(scope="module")
def llm_of(request):
    """alias -> LLM on the reference backend, loaded once per module."""
    import edgellm

    def get(alias: str):
        if alias not in _LLMS:
            path = request.getfixturevalue(
                {
                    "smollm2-135m": "smollm2_path",
                    "gemma3-270m": "gemma3_path",
                    "qwen2.5-coder-0.5b": "qwen_coder_path",
                }[alias]  # fmt: skip
            )
            _LLMS[alias] = edgellm.LLM(path, backend="reference", n_ctx=1024)
        return _LLMS[alias]

    yield get
    _LLMS.clear()


@pytest.mark.parametrize("alias,case", GREEDY_CASES)
def test_greedy_continuation_matches_llama_cpp_token_for_token(llm_of, alias, case):
    check_greedy(llm_of(alias), case)  # identical up to the first near-tie; the message shows the margins


@pytest.mark.parametrize("alias,case", GREEDY_CASES)
def test_every_greedy_step_agrees_with_llama_cpp_when_fed_its_tokens(llm_of, alias, case):
    n, notes = check_forced_steps(llm_of(alias), case)
    assert n <= len(case["ids"]) // 10, notes


@pytest.mark.parametrize("alias", ALIASES)
def test_chat_answer_matches_llama_cpp(llm_of, alias):
    llm, case = llm_of(alias), FIXTURES[alias]["chat"]
    assert llm.chat_prompt(case["messages"]) == case["prompt_ids"]
    check_greedy(llm, dict(case, prompt=f"chat {case['messages'][0]['content']}"))
    check_forced_steps(llm, dict(case, prompt="chat"))


@pytest.mark.parametrize("alias", ALIASES)
def test_prompt_tokenization_matches_the_fixture(llm_of, alias):
    llm = llm_of(alias)
    for case in FIXTURES[alias]["greedy"]:
        assert llm.tokenize(case["prompt"]) == case["prompt_ids"], case["prompt"]


@pytest.mark.parametrize("alias", ALIASES)
def test_teacher_forced_kl_and_no_more_confident_disagreements_than_llama_cpp_itself(llm_of, alias):
    kl, confident, agree = teacher_forced_kl(llm_of(alias), alias)
    noise = FIXTURES[alias]["self_noise"]
    assert kl <= KL_MAX, f"mean KL {kl:.5f} (top-1 agreement {agree:.3f}; llama.cpp vs itself: {noise})"
    assert confident <= noise["confident_disagreements"], (
        f"{confident} positions where llama.cpp's top-1 leads our pick by > {CONFIDENT} nats; "
        f"llama.cpp with flash attention on vs off has {noise['confident_disagreements']}"
    )


@pytest.mark.parametrize("alias", ALIASES)
def test_perplexity_within_one_percent_of_llama_cpp_on_first_chunks(llm_of, alias):
    ours, ref = chunk_perplexity(llm_of(alias), FIXTURES[alias], n_chunks=4)
    assert abs(ours / ref - 1) < 0.01, f"PPL {ours:.4f} vs llama.cpp {ref:.4f}"


@pytest.mark.slow
@pytest.mark.parametrize("alias", ALIASES)
def test_perplexity_within_one_percent_of_llama_cpp_whole_text(llm_of, alias):
    ours, ref = chunk_perplexity(
        llm_of(alias), FIXTURES[alias], n_chunks=FIXTURES[alias]["perplexity"]["chunks"]
    )
    assert abs(ours / ref - 1) < 0.01, f"PPL {ours:.4f} vs llama.cpp {ref:.4f}"


def test_generate_api_follows_the_model_greedily(llm_of):
    llm = llm_of("smollm2-135m")
    case = FIXTURES["smollm2-135m"]["greedy"][0]
    ids, _ = greedy(llm, case["prompt_ids"], 12)
    out = llm.generate(case["prompt_ids"], max_tokens=12, temperature=0)
    assert out.tokens == ids[: len(out.tokens)]
    assert out.finish_reason in ("length", "stop")


def test_batched_generation_equals_each_sequence_alone(llm_of):
    llm = llm_of("smollm2-135m")
    prompts = [
        "Hi",
        "The capital of France is",
        "Once upon a time, in a land far, far away, there lived",
        "1, 2, 3, 4,",
    ]
    together = llm.generate(prompts, max_tokens=12, temperature=0)
    for p, t in zip(prompts, together):
        alone = llm.generate(p, max_tokens=12, temperature=0)
        assert t.tokens == alone.tokens, p
        assert t.text == alone.text


def test_seeded_sampling_is_reproducible(llm_of):
    llm = llm_of("smollm2-135m")
    a = llm.generate("Once upon a time", max_tokens=12, temperature=0.9, seed=7)
    b = llm.generate("Once upon a time", max_tokens=12, temperature=0.9, seed=7)
    assert a.tokens == b.tokens


def test_prompt_longer_than_context_is_a_clear_error(smollm2_path):
    import edgellm
    from edgellm.engine import ContextOverflow

    small = edgellm.LLM(smollm2_path, backend="reference", n_ctx=16)
    with pytest.raises(ContextOverflow, match="context holds 16"):
        small.generate("word " * 40, max_tokens=4)
