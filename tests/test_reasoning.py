"""A thinking model's <think> reasoning taken apart from its answer (reasoning.py), whole and streamed."""

from __future__ import annotations

import json

import pytest

from edgellm import openai_api as oa
from edgellm import reasoning

CASES = [  # (answer, the prompt opened <think>, reasoning, content)
    ("<think>\nLet me see.\n</think>\n\nThe answer is 4.", False, "Let me see.", "The answer is 4."),
    ("  <think>a < b, so </thin is not the end</think>b", False, "a < b, so </thin is not the end", "b"),
    ("Hello <think>x</think>", False, None, "Hello <think>x</think>"),  # not at the start: content
    ("<think>\ncut short by max_tokens  ", False, "cut short by max_tokens", ""),
    ("<thi", False, None, "<thi"),
    ("", False, None, ""),
    ("<think></think>\n\nx", False, "", "x"),
    ("I add them.\n</think>\n\n2", True, "I add them.", "2"),  # DeepSeek-R1: the prompt ends in <think>
    ("", True, "", ""),
]


@pytest.mark.parametrize("text,inside,thought,content", CASES)
def test_reasoning_comes_apart_whole_and_in_any_pieces(text, inside, thought, content):
    assert reasoning.split(text, inside) == (thought, content)
    for size in (1, 2, 3, 5):
        s = reasoning.ReasoningStream(inside)
        parts = [p for k in range(0, len(text), size) for p in s.push(text[k : k + size])] + s.finish()
        got = "".join(t for k, t in parts if k == "reasoning"), "".join(t for k, t in parts if k == "content")
        assert got == (thought or "", content) and s.thought == (thought is not None), size
        assert all(t for _, t in parts)  # no empty pieces


def test_reasoning_streams_before_the_answer_ends():
    s = reasoning.ReasoningStream()
    assert s.push("<think>\nFirst") == [("reasoning", "First")]
    assert s.push(" second  \n") == [("reasoning", " second")]  # blanks held: they may end the reasoning
    assert s.push("</th") == []
    assert s.push("ink>\n\nDone") == [("content", "Done")]


def test_a_prompt_that_opens_the_reasoning_is_seen():
    assert reasoning.opens_in_thought("<｜User｜>Hi<｜Assistant｜><think>\n")
    assert not reasoning.opens_in_thought("<think>old</think>\n<|im_start|>assistant\n")
    assert not reasoning.opens_in_thought("<|im_start|>assistant\n")


def test_a_whole_chat_answer_carries_reasoning_content_then_its_calls():
    shaper = oa.Shaper(chat=True, model="m", reasoning=True, tool_names=["f"])
    text = '<think>Call f.</think>\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    [choice] = shaper.whole([text], ["stop"], {})["choices"]
    msg = choice["message"]
    assert (
        msg["reasoning_content"] == "Call f."
        and msg["content"] is None
        and choice["finish_reason"] == "tool_calls"
    )
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
    off = oa.Shaper(chat=True, model="m").whole(["<think>x</think>y"], ["stop"], {})["choices"][0]["message"]
    assert off == {"role": "assistant", "content": "<think>x</think>y"}


def test_a_responses_reasoning_item_joins_the_turn_it_led_to():
    """Clients that keep no server state (store false, the Agents SDK) send a reasoning item back before
    the calls or message it led to: it becomes that assistant turn's reasoning_content."""
    from edgellm import responses_api as ra

    rs = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "t"}],
    }
    fc = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    msgs = ra.input_messages({"input": [{"role": "user", "content": "q"}, rs, fc, {**fc, "call_id": "c2"}]})
    assert [m["role"] for m in msgs] == ["user", "assistant"] and msgs[1]["reasoning_content"] == "t"
    assert [c["id"] for c in msgs[1]["tool_calls"]] == ["c1", "c2"]
    said = ra.input_messages({"input": [rs, {"role": "assistant", "content": "a"}]})
    assert said == [{"role": "assistant", "content": "a", "reasoning_content": "t"}]
    summary = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}
    alone = ra.input_messages({"input": [{"role": "user", "content": "q"}, summary]})
    assert alone[-1] == {"role": "assistant", "content": None, "reasoning_content": "s"}


THINKING_TEMPLATE = (  # ChatML whose generation prompt opens the reasoning (DeepSeek-R1's way)
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def test_the_python_api_takes_the_reasoning_apart(smollm2_path, tmp_path):
    """LLM.chat: Completion.reasoning and the text after </think>; chat_stream: reasoning chunks (their
    text empty) then the text; an answer a grammar shapes is read as it starts (JSON: content; a grammar
    that writes <think> first: reasoning); reasoning_format none leaves it all in the text."""
    import edgellm

    tmpl = tmp_path / "thinking.jinja"
    tmpl.write_text(THINKING_TEMPLATE)
    llm = edgellm.LLM(smollm2_path, backend="native", threads=1, n_ctx=512, chat_template=str(tmpl))
    msgs = [{"role": "user", "content": "Name a colour."}]
    cut = llm.chat(msgs, max_tokens=8, temperature=0)  # the prompt opened it, nothing closed it
    assert cut.reasoning and cut.text == "" and cut.finish_reason == "length"
    chunks = list(llm.chat_stream(msgs, max_tokens=8, temperature=0))
    assert "".join(c.reasoning for c in chunks) == cut.reasoning and not any(c.text for c in chunks)
    grammar = 'root ::= "<think>I will name one.</think>\\n\\n" [A-Z] [a-z]+ "."'
    out = llm.chat(msgs, max_tokens=30, temperature=0, grammar=grammar)
    assert out.reasoning == "I will name one." and out.text[0].isupper() and out.text.endswith(".")
    chunks = list(llm.chat_stream(msgs, max_tokens=30, temperature=0, grammar=grammar))
    assert (
        "".join(c.reasoning for c in chunks) == out.reasoning and "".join(c.text for c in chunks) == out.text
    )
    assert all(not (c.reasoning and c.text) for c in chunks) and chunks[-1].finish_reason == "stop"
    js = llm.chat(msgs, max_tokens=30, temperature=0, response_format={"type": "json_object"})
    assert js.reasoning is None and js.text.startswith("{")
    raw = llm.chat(msgs, max_tokens=30, temperature=0, grammar=grammar, reasoning_format="none")
    assert raw.reasoning is None and raw.text == f"<think>I will name one.</think>\n\n{out.text}"
    with pytest.raises(ValueError, match="reasoning_format"):
        llm.chat(msgs, reasoning_format="deepseek-legacy")


def test_the_python_api_turns_thinking_off_and_holds_it_to_a_budget(smollm2_path, tmp_path):
    """LLM.chat's enable_thinking (False: the template's switch, and a <think> it opens regardless closed,
    as DeepSeek-R1's) and reasoning_budget (the end tag written after so many tokens), chat_stream's too."""
    import edgellm

    tmpl = tmp_path / "r1.jinja"  # the generation prompt always opens the reasoning
    tmpl.write_text(THINKING_TEMPLATE)
    llm = edgellm.LLM(smollm2_path, backend="native", threads=1, n_ctx=512, chat_template=str(tmpl))
    msgs = [{"role": "user", "content": "Name a colour."}]
    assert llm.chat_text(msgs).endswith("<think>\n")
    free = llm.chat(msgs, max_tokens=16, temperature=0)
    assert free.reasoning and free.text == ""  # 16 tokens of reasoning, never closed
    off = llm.chat(msgs, max_tokens=16, temperature=0, enable_thinking=False)
    assert off.reasoning is None and llm.chat_text(msgs, template_kwargs={"enable_thinking": False}).endswith(
        "<think>\n</think>"
    )
    capped = llm.chat(msgs, max_tokens=16, temperature=0, reasoning_budget=2)
    assert capped.reasoning and free.reasoning.startswith(capped.reasoning) and capped.text, capped
    assert len(llm.tokenize(capped.reasoning, add_special=False)) <= 2
    chunks = list(llm.chat_stream(msgs, max_tokens=16, temperature=0, reasoning_budget=2))
    assert "".join(c.reasoning for c in chunks) == capped.reasoning
    assert "".join(c.text for c in chunks) == capped.text
    with pytest.raises(ValueError, match="reasoning_budget"):
        llm.chat(msgs, reasoning_budget=-5)


def test_reasoning_then_a_tool_call_streams_as_both():
    """DeepSeek-R1's way with `auto` tools (whose grammar leaves the text free until a call): the
    reasoning the prompt opened, then a call written as it comes."""
    from edgellm import tools

    text = 'Use f.\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    for size in (1, 4, len(text)):
        think, calls = reasoning.ReasoningStream(True), tools.CallStream(["f"], live=True)
        parts = [
            p for k in range(0, len(text), size) for p in tools.stream_parts(think, calls, text[k : k + size])
        ]
        parts += tools.stream_parts(think, calls, None)
        kinds = [p.kind for p in parts if p.kind != "args"]
        assert kinds[-3:] == ["reasoning", "begins", "ends"] and set(kinds[:-2]) == {"reasoning"}, size
        assert "".join(p.text for p in parts if p.kind == "reasoning") == "Use f."
        assert json.loads("".join(p.text for p in parts if p.kind == "args")) == {"a": 1}
    shaper = oa.Shaper(chat=True, model="m", reasoning=True, inside=True, tool_names=["f"])
    msg = shaper.whole([text], ["stop"], {})["choices"][0]["message"]
    assert msg["reasoning_content"] == "Use f." and msg["tool_calls"][0]["function"]["name"] == "f"


# -- the reasoning budget (llama.cpp's common/reasoning-budget.cpp) ------------------------------------------
START, END, MSG = (7,), (8, 9), (5,)  # token ids of <think>, </think> (two tokens) and a message
PIECES = {3: b"\xc3", 4: b"\xa9"}  # 3 then 4: one character (é) in two tokens


def _budget(n: int, inside: bool = False, forced=MSG + END) -> reasoning.Budget:
    spec = reasoning.BudgetSpec(START, (END,), tuple(forced), n, inside)
    return reasoning.Budget(spec, lambda t: PIECES.get(t, b"x"))


def _run(b: reasoning.Budget, sampled: list[int]) -> list[int]:
    return [b.take(t) for t in sampled]


def test_a_reasoning_budget_writes_the_end_after_so_many_tokens_of_reasoning():
    # idle until <think>; then 3 tokens of reasoning; then the message and </think> whatever is sampled
    assert _run(_budget(3), [1, 7, 1, 1, 1, 1, 1, 1, 1, 1]) == [1, 7, 1, 1, 1, 5, 8, 9, 1, 1]
    # the prompt opened it: counting from the first token; budget 0: the end at once
    assert _run(_budget(2, inside=True), [1, 1, 1, 1, 1, 1]) == [1, 1, 5, 8, 9, 1]
    assert _run(_budget(0, inside=True), [1, 1, 1, 1]) == [5, 8, 9, 1]
    # the model ends it itself: left alone, for good (a later <think> is not counted)
    assert _run(_budget(3, inside=True), [1, 8, 9, 1, 7, 1, 1, 1, 1]) == [1, 8, 9, 1, 7, 1, 1, 1, 1]
    # spent in the middle of a character: its last byte first
    assert _run(_budget(1, inside=True), [3, 4, 1, 1, 1, 1]) == [3, 4, 5, 8, 9, 1]
    # no limit: nothing forced, until forced on request (llama-server's reasoning control)
    b = _budget(-1, inside=True)
    assert _run(b, [1] * 50) == [1] * 50 and b.force() and _run(b, [1, 1, 1, 1]) == [5, 8, 9, 1]
    assert not b.force()  # done: nothing to end
    idle = _budget(-1)
    assert not idle.force() and _run(idle, [1, 1]) == [1, 1]  # not reasoning
