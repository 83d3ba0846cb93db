"""Structured output's cost: decode tokens/s with a nested JSON schema against the same prompt
unconstrained, and the time llguidance takes per mask (p50, p99), on each model; with --tools also the
tool_choice auto grammar (tools.py: free text, calls held to their schemas) on the same prompt, where
the model's template renders tools (the answer stays free text: what the lazy grammar costs there).

    python scripts/bench_structured.py [--models smollm2-135m qwen2.5-coder-0.5b] [-t 2] [-n 128] [-r 3]
        [--tools]

The mask of step k is computed on a worker thread while step k's forward runs (engine.ModelRunner), so
the mask time is hidden unless it exceeds the forward; what the constrained run adds is applying it to
the logits and sampling from the whole row (unconstrained greedy takes only the argmax from the backend).
"""

from __future__ import annotations

import argparse
import statistics
import time

import edgellm
from edgellm import structured, tools
from edgellm.engine import GenRequest

SCHEMA = {
    "type": "object",
    "properties": {
        "team": {"type": "string", "maxLength": 24},
        "members": {
            "type": "array", "minItems": 3, "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "age": {"type": "integer", "minimum": 18, "maximum": 70},
                    "role": {"enum": ["engineer", "designer", "manager"]},
                    "skills": {"type": "array", "items": {"type": "string", "maxLength": 12},
                               "minItems": 2, "maxItems": 3},
                },
                "required": ["name", "age", "role", "skills"], "additionalProperties": False,
            },
        },
    },
    "required": ["team", "members"], "additionalProperties": False,
}  # fmt: skip
PROMPT = [{"role": "user", "content": "Describe a software team of three people as JSON."}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--tools", action="store_true", help="also the tool_choice auto grammar")
    a = ap.parse_args()
    times: list[float] = []
    inner = structured.Constraint.allowed

    def timed(self):  # the mask computation, as the worker thread runs it
        t0 = time.perf_counter()
        m = inner(self)
        times.append(time.perf_counter() - t0)
        return m

    structured.Constraint.allowed = timed  # type: ignore[method-assign]
    for alias in a.models:
        llm = edgellm.LLM(alias, backend=a.backend, threads=a.threads, n_ctx=2048)
        rf = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
        llm.chat(PROMPT, max_tokens=4, temperature=0, response_format=rf)  # warm up (the vocabulary index)
        kinds = ["free", "json"]
        if a.tools and tools.renders_tools(llm.template.source):
            kinds.append("tools")
            req = tools.parse({"tools": [WEATHER]})
            auto = llm.engine.compile_grammar(tools.grammar(req))
            prompt = llm.chat_prompt(PROMPT, tools=req.tools)
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        n_json = 0
        times.clear()
        for _ in range(a.repetitions):
            for kind in kinds:
                if kind == "tools":  # the same prompt with the tool shown, free and under the auto grammar
                    for key, g in (("shown", None), ("tools", auto)):
                        req = GenRequest(prompt, llm.params(temperature=0), a.n_predict, grammar=g)
                        t = llm._collect([req])[0].timings
                        rates.setdefault(key, []).append(t.generated_tokens / t.generation_s)
                    continue
                kw = {"response_format": rf} if kind == "json" else {}
                out = llm.chat(PROMPT, max_tokens=a.n_predict, temperature=0, **kw)
                t = out.timings
                rates[kind].append(t.generated_tokens / t.generation_s if t.generation_s else 0.0)
                if kind == "json":
                    n_json = t.generated_tokens
        free, js = statistics.median(rates["free"]), statistics.median(rates["json"])
        ms = sorted(x * 1e3 for x in times)
        p50, p99 = ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        print(f"{alias} ({llm.backend.name}, {a.threads} threads): free {free:.1f} tok/s, json schema "
              f"{js:.1f} tok/s ({n_json} tokens) = {js / free:.2f}x; mask p50 {p50:.3f} ms, p99 {p99:.3f} ms "
              f"over {len(ms)} masks, vocabulary {llm.model.config.n_vocab}")  # fmt: skip
        if "tools" in rates:
            shown, lazy = statistics.median(rates["shown"]), statistics.median(rates["tools"])
            print(f"  tool_choice auto grammar: {lazy:.1f} tok/s against {shown:.1f} with the tool shown and "
                  f"no grammar = {lazy / shown:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
