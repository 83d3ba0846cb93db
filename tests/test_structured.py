"""Structured output (edgellm/structured.py, tools.py): every constrained answer of the real SmolLM2
parses and validates against its schema, grammar or regex; constrained and free rows decoded together
give each row what it gets alone; a forced tool call on the real Qwen2.5-Coder-0.5B parses into
OpenAI's tool_calls; bad schemas and grammars fail before any token."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

import edgellm  # noqa: E402
from edgellm import tools  # noqa: E402
from edgellm.engine import GenRequest, RequestRejected  # noqa: E402
from edgellm.openai_api import APIError  # noqa: E402
from edgellm.structured import Grammar, GrammarError  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "color": {"enum": ["red", "green", "blue"]},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "score", "color", "code", "tags", "address"],
    "additionalProperties": False,
}
LIST = {
    "type": "array",
    "items": {"type": "integer", "minimum": -5, "maximum": 5},
    "minItems": 2,
    "maxItems": 4,
}


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return edgellm.LLM(smollm2_path, backend="native", threads=1, n_ctx=1024)


def _chat(llm, content: str, **kw):
    return llm.chat([{"role": "user", "content": content}], max_tokens=kw.pop("max_tokens", 200), **kw)


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_json_schema_answers_parse_and_validate(llm, seed):
    """Objects, arrays with bounds, enums, bounded integers and numbers, patterns, a nested object and
    additionalProperties: false, greedy and sampled."""
    sampling = {"temperature": 0} if seed is None else {"temperature": 0.9, "seed": seed}
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    out = _chat(llm, "Describe a person as JSON.", response_format=rf, **sampling)
    assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(out.text), PERSON)
    rf = {"type": "json_schema", "json_schema": {"schema": LIST}}
    arr = _chat(llm, "Some numbers:", response_format=rf, **sampling)
    jsonschema.validate(json.loads(arr.text), LIST)
    obj = _chat(llm, "Any JSON object.", response_format="json", max_tokens=120, **sampling)
    if obj.finish_reason == "stop":  # an unbounded object may run to max_tokens; when it ends, it parses
        assert isinstance(json.loads(obj.text), dict)
    else:
        assert obj.text.startswith("{")


def test_gbnf_lark_regex_and_choice_constraints(llm):
    gbnf = r"""root ::= "(" num " + " num ") = " num
num ::= [0-9] [0-9]?"""
    out = _chat(llm, "Write a sum.", grammar=gbnf, temperature=0)
    assert re.fullmatch(r"\([0-9]{1,2} \+ [0-9]{1,2}\) = [0-9]{1,2}", out.text), out.text
    lark = 'start: "Answer: " ("yes" | "no")'
    assert _chat(llm, "Is fire hot?", grammar=lark, temperature=0).text in ("Answer: yes", "Answer: no")
    rx = Grammar("regex", r"[A-Z][a-z]{2,8}, [0-9]{1,3}")
    out = _chat(llm, "A name and a number.", grammar=rx, temperature=0.8, seed=3)
    assert re.fullmatch(r"[A-Z][a-z]{2,8}, [0-9]{1,3}", out.text), out.text
    pick = _chat(
        llm, "Pick a fruit.", grammar=Grammar("choice", ["apple", "banana", "cherry"]), temperature=0
    )
    assert pick.text in ("apple", "banana", "cherry") and pick.finish_reason == "stop"


def test_constrained_and_free_rows_decoded_together_get_what_they_get_alone(llm):
    engine = llm.engine
    asks = [
        ("Describe a person as JSON.", Grammar("json_schema", PERSON)),
        ("Tell me about the sea.", None),
        ("A name and a number.", Grammar("regex", r"[A-Z][a-z]{2,8}, [0-9]{1,3}")),
        ("Name a color.", None),
    ]
    reqs = [
        GenRequest(llm.chat_prompt([{"role": "user", "content": q}]), llm.params(temperature=0), 40,
                   grammar=engine.compile_grammar(g) if g else None)
        for q, g in asks
    ]  # fmt: skip

    def run(batch):
        streams = [engine.submit(r) for r in batch]
        while not all(s.done for s in streams):
            engine.step()
            for s in streams:
                s.ready()
        return streams

    alone = []
    for r in reqs:
        st = engine.submit(r)
        toks = []
        while not st.done:
            engine.step()
            toks += [ev.token for ev in st.ready() if ev.token is not None]
        alone.append(toks)
    streams = [engine.submit(r) for r in reqs]
    together = [[] for _ in reqs]
    while not all(s.done for s in streams):
        engine.step()
        for i, s in enumerate(streams):
            together[i] += [ev.token for ev in s.ready() if ev.token is not None]
    assert together == alone
    assert engine.runner._masker is not None  # the masks were computed on the worker thread


def test_bad_schemas_and_grammars_fail_before_any_token(llm):
    engine = llm.engine
    for g, what in [
        (Grammar("json_schema", {"type": "objekt"}), "objekt"),
        (Grammar("json_schema", {"type": "string", "format": "hostname-ish"}, strict=True), "format"),
        (Grammar("json_schema", '{"type": '), "not valid JSON"),
        (Grammar("gbnf", "root ::= [a-z"), "GBNF"),
        (Grammar("regex", "(ab"), "regex"),
        (Grammar("choice", []), "choice"),
    ]:
        with pytest.raises(GrammarError, match=what):
            engine.compile_grammar(g)
    with pytest.raises(GrammarError):
        Grammar("xml", "<a/>")
    # not strict: what llguidance does not implement is skipped (as llama.cpp's converter), the rest holds
    lax = engine.compile_grammar(Grammar("json_schema", {"type": "string", "format": "hostname-ish"}))
    assert _accepted(llm, lax, '"abc"') and not _accepted(llm, lax, "12")
    with pytest.raises(GrammarError, match="Unimplemented keys"):
        engine.compile_grammar(Grammar("json_schema", {"not": {"type": "string"}}, strict=True))
    long = engine.compile_grammar(Grammar("choice", ["the quick brown fox jumps over the lazy dog"]))
    with pytest.raises(RequestRejected, match="at least"):
        engine.submit(GenRequest(llm.tokenize("x"), llm.params(), 3, grammar=long))
    with pytest.raises(ValueError, match="not both"):
        _chat(llm, "x", response_format="json", grammar='root ::= "a"')


def test_tool_call_blocks_are_split_from_text_and_streamed_safely():
    names = ["get_weather"]
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = tools.split(text, names)
    assert content == "Sure." and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert tools.split("<tool_call>{bad}</tool_call>", names) == ("<tool_call>{bad}</tool_call>", [])
    deep = "<tool_call>" + "[" * 100_000 + "</tool_call>"
    assert tools.split(deep, names) == (deep, [])
    said = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[" * 100_000}}]}]
    with pytest.raises(APIError):  # a client's arguments nested past Python's limit: a 400, not a 500
        tools.template_messages(said)
    assert tools.split('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', names)[1] == []
    s = tools.StreamSplitter(names)
    pieces = [
        s.push(p)
        for p in [
            "Sure.",
            "\n<tool",
            "_call>\n{",
            '"name": "get_weather", ',
            '"arguments": {}}',
            "\n</tool_call>",
        ]
    ]
    assert "".join(pieces) == "Sure.\n" and "<" not in "".join(pieces)
    rest, calls = s.finish()
    assert rest == "" and len(calls) == 1
    plain = tools.StreamSplitter(names)
    assert plain.push("a <to") == "a " and plain.push("ast> c") == "<toast> c"  # a held tail, not a call


def test_bare_json_calls_without_tags_are_calls_and_are_held_back_when_streamed():
    names = ["get_weather"]
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    for text in (call, f"  {call}\n", f"```json\n{call}\n```", f"```\n{call}```", f"{call}\n{call}"):
        content, calls = tools.split(text, names)
        assert content == "" and calls and all(c["function"]["name"] == "get_weather" for c in calls), text
    assert len(tools.split(f"{call}\n{call}", names)[1]) == 2
    llama = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'  # Llama 3.x's JSON call
    [lc] = tools.split(llama, names)[1]
    assert json.loads(lc["function"]["arguments"]) == {"city": "Oslo"}
    block = f"<tool_call>\n{call}\n</tool_call>"
    for text in (f"{call}\n{call}", f"{block}\n{block}"):  # parallel_tool_calls false: the first call only
        assert len(tools.split(text, names, single=True)[1]) == 1
        one = tools.StreamSplitter(names, single=True)
        one.push(text)
        assert len(one.finish()[1]) == 1
    for text in (
        f"Here: {call}",  # text around it: an answer that quotes JSON
        f"{call} and more",
        '{"name": "rm_rf", "arguments": {}}',  # not a tool of the request
        '{"name": "get_weather", "arguments": "Oslo"}',
        '{"name": "get_weather", "arguments": {}',
        '{"arguments": {"city": "Oslo"}, "name": "get_weather"}',  # the name first, as the grammar has it
        "```python\nprint(1)\n```",
        "[" * 100_000,  # nested past Python's recursion limit: text, not a crash
    ):
        assert tools.split(text, names) == (text, []), text
    s = tools.StreamSplitter(names)
    assert [s.push(p) for p in ["\n", "```", "json\n", call[:9], call[9:], "\n```"]] == [""] * 6
    assert s.finish()[0] == "" and len(s.finish()[1]) == 1
    code = tools.StreamSplitter(names)
    assert code.push("```") == "" and code.push("py") == "```py" and code.push("thon") == "thon"
    quoted = tools.StreamSplitter(names)  # bare-looking but not a call: all of it comes out at the end
    assert quoted.push('{"a": ') == "" and quoted.push("1}") == ""
    assert quoted.finish() == ('{"a": 1}', [])


def _streamed(
    text: str, size: int, live: bool = True, names=("get_weather", "f")
) -> tuple[list, tools.CallStream]:
    """`text` through a CallStream in pieces of `size` characters: its parts, text and arguments joined."""
    s = tools.CallStream(list(names), live=live)
    parts = [p for k in range(0, len(text), size) for p in s.push(text[k : k + size])] + s.finish()
    out: list = []
    for p in parts:
        if out and p.kind in ("text", "args") and out[-1][0] == p.kind and out[-1][2] == p.index:
            out[-1] = (p.kind, out[-1][1] + p.text, p.index)
        else:
            out.append((p.kind, p.text, p.index))
    return out, s


def test_tool_calls_stream_as_they_are_written():
    """Under the tools' grammar a call begins once its name and its arguments' brace are written, and the
    arguments stream as they come (braces and quotes inside strings are not the end); the same parts
    however the text is cut into tokens; blanks between calls are not text, text after one is."""
    args = '{"city": "Os\\"lo}", "n": [1, {"a": "]"}]}'
    one = f'<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>'
    text = f'Sure.\n{one}\n<tool_call>\n{{"name": "f", "arguments": {{}}}}\n</tool_call>\nDone.'
    want = [("text", "Sure.\n", -1), ("begins", "", 0), ("args", args, 0), ("ends", "", 0),
            ("begins", "", 1), ("args", "{}", 1), ("ends", "", 1), ("text", "\nDone.", -1)]  # fmt: skip
    for size in (1, 2, 3, 7, len(text)):
        parts, s = _streamed(text, size)
        assert parts == want, size
        assert s.ended == 2 and [c["function"]["arguments"] for c in s.calls] == [args, "{}"]
    s = tools.CallStream(["get_weather"], live=True)
    early = s.push('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert [p.kind for p in early] == ["begins", "args"] and early[1].text == '{"city": "Pa'  # not held
    assert s.ended == 0 and s.finish() == []  # cut short (max_tokens): begun, never ended
    assert _streamed(f"{one}\n\n", 3)[0][-1] == ("ends", "", 0)  # trailing blanks are not text
    bare = (
        f'```json\n{{"name": "get_weather", "arguments": {args}}}\n{{"name": "f", "parameters": {{}}}}\n```'
    )
    parts, s = _streamed(bare, 2)
    assert parts == [("begins", "", 0), ("args", args, 0), ("ends", "", 0),
                     ("begins", "", 1), ("args", "{}", 1), ("ends", "", 1)]  # fmt: skip


def test_a_tool_call_that_does_not_read_as_one_is_text_or_comes_whole():
    cut = '<tool_call>\n{"name": "get_wea'
    assert _streamed(cut, 4)[0] == [("text", cut, -1)]  # its head cut short
    other = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert _streamed("a " + other, 5)[0] == [("text", "a " + other, -1)]  # not a tool's name
    assert _streamed('{"a": 1}', 2)[0] == [("text", '{"a": 1}', -1)]
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    parts, s = _streamed("Hi.\n" + block, 3, live=False)  # calls not held by the grammar: whole, at the end
    assert [p[0] for p in parts] == ["text", "begins", "args", "ends"] and parts[0][1] == "Hi.\n"
    assert json.loads(parts[2][1]) == {"city": "Oslo"} and s.ended == 1


def test_streamed_calls_become_anthropic_blocks_and_responses_items_in_order():
    """Text, a call, text again: three blocks / items in that order; a call cut short is closed (a
    Responses item `incomplete`); an empty answer is one empty text block."""
    from edgellm import anthropic_api as an
    from edgellm import responses_api as ra

    call = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    text = f'Sure.{call}\nDone.<tool_call>{{"name": "f", "arguments": {{"y'
    s = tools.CallStream(["f"], live=True)
    parts = [p for k in range(0, len(text), 4) for p in s.push(text[k : k + 4])] + s.finish()
    blocks = an.Blocks(s.calls)
    evs = [e for p in parts for e in blocks.feed(p)] + blocks.close()
    starts = [(d["index"], d["content_block"]["type"]) for k, d in evs if k == "content_block_start"]
    assert starts == [(0, "text"), (1, "tool_use"), (2, "text"), (3, "tool_use")]
    assert [d["index"] for k, d in evs if k == "content_block_stop"] == [0, 1, 2, 3]
    json_1 = "".join(
        d["delta"]["partial_json"] for k, d in evs if k == "content_block_delta" and d["index"] == 1
    )
    assert json.loads(json_1) == {"x": 1} and "".join(blocks.shown) == "Sure.\nDone."
    items = ra.Items("msg_1", s.calls)
    evs = [e for p in parts for e in items.feed(p)] + items.close()
    added = [(d["output_index"], d["item"]["type"]) for k, d in evs if k == "response.output_item.added"]
    assert added == [(0, "message"), (1, "function_call"), (2, "message"), (3, "function_call")]
    assert [i["type"] for i in items.items] == ["message", "function_call", "message", "function_call"]
    assert items.items[0]["id"] == "msg_1" != items.items[2]["id"]
    assert [i.get("status") for i in items.items[1::2]] == ["completed", "incomplete"]
    assert json.loads(items.items[1]["arguments"]) == {"x": 1} and items.items[3]["arguments"] == '{"y'
    done = [d["arguments"] for k, d in evs if k == "response.function_call_arguments.done"]
    deltas = "".join(d["delta"] for k, d in evs if k == "response.function_call_arguments.delta")
    assert "".join(done) == deltas
    empty = an.Blocks().close()
    assert [k for k, _ in empty] == ["content_block_start", "content_block_stop"]


def test_a_forced_tool_call_on_qwen_parses(qwen_coder_path):
    """Qwen2.5-Coder-0.5B's template renders the tools; tool_choice required constrains the answer to a
    <tool_call> whose arguments match the function's schema."""
    llm = edgellm.LLM(qwen_coder_path, backend="native", threads=2, n_ctx=1024)
    fn = {"name": "get_weather", "description": "Current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                         "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
                         "additionalProperties": False}}  # fmt: skip
    req = tools.parse({"tools": [{"type": "function", "function": fn}], "tool_choice": "required"})
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    ids = llm.chat_prompt(msgs, tools=req.tools)
    assert "get_weather" in llm.detokenize(ids)  # the template showed the model the tool
    grammar = llm.engine.compile_grammar(tools.grammar(req))
    out = llm._collect([GenRequest(ids, llm.params(temperature=0), 60, grammar=grammar)])[0]
    content, calls = tools.split(out.text, req.names)
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather", out.text
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), fn["parameters"])
    assert content == ""


def test_auto_tool_calls_are_held_to_their_schemas_and_the_text_around_them_is_free(qwen_coder_path):
    """tool_choice auto: the lazy grammar lets any text through (a JSON answer that is not a call too),
    and from `<tool_call>` or a bare `{"name":` on, a call must name a tool and match its schema
    (OpenAI's `strict`, always); an answer that opens as a bare call is nothing but calls."""

    llm = edgellm.LLM(qwen_coder_path, backend="native", threads=2, n_ctx=256)
    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
               "additionalProperties": False}  # fmt: skip
    fns = [{"name": "get_weather", "parameters": weather, "strict": True}, {"name": "get_time"}]
    req = tools.parse({"tools": [{"type": "function", "function": f} for f in fns]})
    compiled = llm.engine.compile_grammar(tools.grammar(req))

    def accepted(text: str) -> bool:
        return _accepted(llm, compiled, text)

    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    block = f"<tool_call>\n{call}\n</tool_call>"
    for text in (
        call.replace("arguments", "parameters"),  # Llama 3.x's JSON call, held to the schema too
        "The weather in Paris is mild in spring.",
        f"Let me look.\n{block}",
        f'{block}\n<tool_call>\n{{"name": "get_time", "arguments": {{"tz": "CET"}}}}\n</tool_call>\nDone.',
        call,
        f"```json\n{call}\n```",
        f'{call}\n\n{{"name": "get_time", "arguments": {{}}}}',
        '{"answer": 42}',
        "```python\nprint(1)\n```",
        'Here is one: {"name": "x"}',
    ):
        assert accepted(text), text
        assert tools.split(text, req.names)[1] or "get_" not in text, text  # what is allowed parses
    for text in (
        block.replace("city", "town"),  # not the schema's property
        call.replace("city", "town"),
        call.replace("arguments", "parameters").replace("city", "town"),
        block.replace("get_weather", "rm_rf"),  # not a tool
        '{"name": "rm_rf", "arguments": {}}',
        f"{call} and then some text",  # a bare call is the whole answer
        f"<tool_call>\n{call}",  # an open block cannot end the answer
    ):
        assert not accepted(text), text
    listed = [{"type": "function", "function": f} for f in fns]
    one = tools.parse({"tools": listed, "parallel_tool_calls": False})
    compiled = llm.engine.compile_grammar(tools.grammar(one))  # parallel_tool_calls false: one call at most
    for text in (f"Let me look.\n{block}\nDone.", call, f"```json\n{call}\n```", "No call."):
        assert accepted(text), text
    for text in (f"{block}\n{block}", f"{call}\n{call}", f"{block} then <tool_call>"):
        assert not accepted(text), text
    rf = Grammar("json_object")
    assert tools.grammar(req, rf) is rf  # the request's own response format wins
    off = tools.parse({"tools": [{"type": "function", "function": fns[1]}], "tool_choice": "none"})
    assert tools.grammar(off) is None and tools.grammar(off, rf) is rf


def _accepted(llm, compiled: str, text: str) -> bool:
    """Whether a compiled constraint takes `text` (as the tokenizer splits it) and may end there."""
    from edgellm import structured

    c = structured.Constraint(compiled, structured.guided_tokenizer(llm.tokenizer, llm.model.config.n_vocab))
    for t in llm.tokenizer.encode(text, add_special=False, parse_special=True):
        if not c.allowed()[t]:
            return False
        c.consume(t)
    return bool(c.allowed()[sorted(llm.tokenizer.eog_ids)].any())


def test_tool_schemas_resolve_their_own_refs_and_unsupported_keywords_are_strict_only(qwen_coder_path):
    """Each function's parameters are their own schema root, so a pydantic schema's `#/$defs/...`
    resolves (forced calls with one used to fail to compile); a keyword llguidance does not implement
    is skipped for a non-strict function (the rest still holds) and refuses a strict one by name; a
    wrong schema is a 400 naming the function."""
    llm = edgellm.LLM(qwen_coder_path, backend="native", threads=2, n_ctx=1024)
    unit = {"enum": ["celsius", "fahrenheit"], "title": "Unit", "type": "string"}
    pydantic = {"$defs": {"Unit": unit}, "title": "GetWeather", "type": "object",
                "required": ["city", "unit"],
                "properties": {"city": {"title": "City", "type": "string", "maxLength": 20},
                               "unit": {"$ref": "#/$defs/Unit"}}}  # fmt: skip
    fn = {"name": "get_weather", "parameters": pydantic}
    req = tools.parse({"tools": [{"type": "function", "function": fn}], "tool_choice": "required"})
    ids = llm.chat_prompt([{"role": "user", "content": "What is the weather in Paris?"}], tools=req.tools)
    out = llm._collect([GenRequest(ids, llm.params(temperature=0), 60,
                                   grammar=llm.engine.compile_grammar(tools.grammar(req)))])[0]  # fmt: skip
    [call] = tools.split(out.text, req.names)[1]
    jsonschema.validate(json.loads(call["function"]["arguments"]), pydantic)

    negated = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}, "required": ["a"],
               "additionalProperties": False}  # fmt: skip

    def one(fn: dict, choice: str) -> tools.ToolRequest:
        return tools.parse({"tools": [{"type": "function", "function": fn}], "tool_choice": choice})

    for choice in ("auto", "required"):
        lax = one({"name": "f", "parameters": negated}, choice)
        lenient = llm.engine.compile_grammar(tools.grammar(lax))  # what it can, it holds: "a" only
        call = '<tool_call>\n{"name": "f", "arguments": {"%s": 1}}\n</tool_call>'
        assert _accepted(llm, lenient, call % "a") and not _accepted(llm, lenient, call % "b")
        strict = {"name": "f", "parameters": negated, "strict": True}
        with pytest.raises(APIError, match="'f' \\(strict\\) cannot be enforced: Unimplemented keys"):
            tools.grammar(one(strict, choice))
        wrong = {"name": "g", "parameters": {"type": "object", "properties": {"a": {"type": "text"}}}}
        with pytest.raises(APIError, match="function 'g' cannot be enforced: Invalid type"):
            tools.grammar(one(wrong, choice))


def test_the_python_api_takes_tools_and_returns_parsed_calls(qwen_coder_path, llm):
    """LLM.chat(tools=...): the calls the model writes (held to their schemas) come back in
    Completion.tool_calls (chat_stream: a chunk's tool_call, once written), the result goes back as a
    tool message and the model answers in text; a template without tools (SmolLM2's) and a bad tool are
    ValueErrors."""
    qwen = edgellm.LLM(qwen_coder_path, backend="native", threads=2, n_ctx=1024)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = qwen.chat(msgs, tools=[weather], max_tokens=60, temperature=0)
    [call] = out.tool_calls
    assert out.finish_reason == "tool_calls" and out.text == "" and call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city"}
    follow = [*msgs, {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "tool_call_id": call["id"], "content": '{"temp_c": 18}'}]  # fmt: skip
    answer = qwen.chat(follow, tools=[weather], max_tokens=24, temperature=0)  # the call and its result read
    assert answer.prompt_tokens > out.prompt_tokens + 20 and (answer.text or answer.tool_calls)
    plain = qwen.chat(msgs, tools=[weather], tool_choice="none", max_tokens=8, temperature=0)
    assert plain.tool_calls == [] and plain.prompt_tokens < out.prompt_tokens  # none: the tools not shown
    pick = {"type": "function", "function": {"name": "get_weather"}}
    named = qwen.chat(msgs, tools=[weather], tool_choice=pick, max_tokens=60, temperature=0)
    assert named.tool_calls[0]["function"]["arguments"] == call["function"]["arguments"]
    with pytest.raises(ValueError, match="does not render tools"):
        llm.chat(msgs, tools=[weather], max_tokens=4)  # SmolLM2
    with pytest.raises(ValueError, match="tools"):
        qwen.chat(msgs, tools=[{"type": "function"}], max_tokens=4)
    chunks = list(qwen.chat_stream(msgs, tools=[weather], max_tokens=60, temperature=0))
    [streamed] = [c.tool_call for c in chunks if c.tool_call is not None]
    assert streamed["function"]["name"] == "get_weather" and chunks[-1].finish_reason == "tool_calls"
    assert json.loads(streamed["function"]["arguments"]) == json.loads(call["function"]["arguments"])
    assert "".join(c.text for c in chunks) == "" and len([c for c in chunks if c.token is not None]) > 5
    with pytest.raises(ValueError, match="does not render tools"):
        next(llm.chat_stream(msgs, tools=[weather]))
