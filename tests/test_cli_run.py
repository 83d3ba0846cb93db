"""`edgellm run`, `perplexity` and `tokenize` end to end on SmolLM2 (reference backend, greedy)."""

from __future__ import annotations

import inspect
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from edgellm.cli import main

TEXT = Path(__file__).parent / "fixtures" / "text" / "licenses.txt"


@pytest.fixture(autouse=True)
def _models(smollm2_path):  # the default model must be in the cache before `run` resolves it
    return smollm2_path


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_run_with_p_uses_the_default_model_and_streams_an_answer(capsys):
    rc, out, err = run(capsys, "run", "-p", "What is 2+2?", "-n", "8", "--temp", "0", "--verbose")
    assert rc == 0, err
    assert out.strip()
    assert "generation:" in err and "tokens/s" in err
    assert "chat template: from the file (using the file's own chat template" in err
    rc, _, err = run(capsys, "run", "-p", "Hi", "--raw", "-n", "1", "--verbose")
    assert rc == 0 and "chat template: none (--raw: plain completion)" in err


def test_run_positional_model_and_prompt_raw_completion_is_deterministic(capsys):
    a = run(capsys, "run", "smollm2-135m", "The capital of France is", "--raw", "-n", "6", "--temp", "0")
    b = run(
        capsys, "run", "smollm2-135m", "-p", "The capital of France is", "--raw", "-n", "6", "--temp", "0"
    )
    c = run(
        capsys, "run", "-m", "smollm2-135m", "The capital of France is", "--raw", "-n", "6", "--temp", "0"
    )
    assert a[0] == b[0] == c[0] == 0
    assert a[1] == b[1] == c[1] and "Paris" in a[1]
    assert "context full" not in a[2]  # -n ended it, not the context


def test_first_positional_that_is_not_a_model_is_an_error_not_a_prompt(capsys):
    rc, out, err = run(capsys, "run", "Why is the sky blue?")
    assert rc == 1 and out == ""
    assert err.startswith("error:") and "neither a known model" in err and "edgellm run -p" in err
    assert len(err.strip().splitlines()) == 1


def test_prompt_from_file_and_from_stdin(capsys, tmp_path, monkeypatch):
    f = tmp_path / "q.txt"
    f.write_text("The capital of France is")
    from_file = run(capsys, "run", "-f", str(f), "--raw", "-n", "6", "--temp", "0")
    monkeypatch.setattr("sys.stdin", io.StringIO("The capital of France is"))
    from_stdin = run(capsys, "run", "--raw", "-n", "6", "--temp", "0")
    assert from_file[0] == from_stdin[0] == 0
    assert from_file[1] == from_stdin[1]


def test_prompt_longer_than_context_and_bad_flags_are_clear_errors(capsys):
    rc, _, err = run(capsys, "run", "-p", "word " * 100, "-c", "32", "-n", "4")
    assert rc == 1 and "context holds 32" in err
    rc, _, err = run(capsys, "run", "-p", "hi", "--temp", "-1")
    assert rc == 1 and err.strip() == "error: --temp must be a finite number >= 0 (0 = greedy), got -1.0"
    rc, _, err = run(capsys, "run", "-p", "hi", "-ctk", "q4_0")
    assert rc == 1 and err.strip() == "error: K cache type 'q4_0' is not supported (choose from f16, q8_0)"


def test_a_q8_0_kv_cache_answers_and_says_so(capsys):
    rc, out, err = run(capsys, "run", "-p", "The capital of France is", "--raw", "-n", "4", "--temp", "0",
                       "-ctk", "q8_0", "-ctv", "q8_0", "-v")  # fmt: skip
    assert rc == 0 and out.strip() and "KV q8_0/q8_0" in err


def test_stop_string_ends_the_answer_without_printing_it(capsys):
    rc, out, _ = run(capsys, "run", "-p", "The capital of France is", "--raw", "-n", "20", "--temp", "0",
                     "--stop", "Paris")  # fmt: skip
    assert rc == 0 and "Paris" not in out


def test_interactive_chat_commands(capsys, monkeypatch):
    from edgellm import cli_run
    from edgellm.llm import LLM

    lines = iter(["/set temp 0", "/set n_predict 6", "/show", '"""', "Say one", "word.", '"""', "/clear",
                  "/nonsense", "/set n_predict -2", "/set n_predict -1", "/show", "/bye"])  # fmt: skip
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    llm = LLM("smollm2-135m", backend="reference", n_ctx=512)
    cli_run._interactive(llm, "Be brief.", {"max_tokens": 64, "stop": None}, verbose=False)
    out = capsys.readouterr().out
    assert "set temperature = 0.0" in out and "set max_tokens = 6" in out
    assert "(conversation cleared)" in out and "unknown command /nonsense" in out
    assert (
        "invalid value: n_predict -2: give a number of tokens, or -1" in out
        and "set max_tokens = None" in out
    )
    first, second = [block.split("\n  template", 1)[0] for block in out.split("  model")[1:]]
    rows = dict(line.split(None, 1) for line in ("model" + first).splitlines())
    assert rows == {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf", "backend": "reference", "threads": "1",
        "context": "512 tokens", "n_predict": "6", "stop": "none", "constraint": "none", "temperature": "0.0",
        "top_k": "40",
        "top_p": "0.95", "min_p": "0.05", "typical_p": "1.0", "repeat_penalty": "1.0",
        "frequency_penalty": "0.0", "presence_penalty": "0.0", "repeat_last_n": "64", "logit_bias": "none",
        "seed": "random", "min_keep": "0", "top_n_sigma": "-1.0", "xtc_probability": "0.0",
        "xtc_threshold": "0.1", "dynatemp_range": "0.0", "dynatemp_exponent": "1.0", "dry_multiplier": "0.0",
        "dry_base": "1.75", "dry_allowed_length": "2", "dry_penalty_last_n": "64",
        "dry_sequence_breakers": repr(("\n", ":", '"', "*")), "mirostat": "0", "mirostat_tau": "5.0",
        "mirostat_eta": "0.1", "allowed_token_ids": "none", "banned_sequences": "()", "infill": "False",
        "adaptive_p": "False", "adaptive_target": "-1.0", "adaptive_decay": "0.9",
        "system": "'Be brief.'",
    }  # fmt: skip
    assert "  n_predict          -1 (until the end or the context is full)" in second
    assert "  template           from the file (using the file's own chat template" in out


def test_chat_turn_that_fills_the_context_says_so_and_the_next_turn_is_an_error(capsys, monkeypatch):
    from edgellm import cli_run
    from edgellm.llm import LLM

    lines = iter(["Tell me a long story about a dragon.", "And then?", "/bye"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    llm = LLM("smollm2-135m", n_ctx=64)
    cli_run._interactive(llm, None, {"max_tokens": None, "stop": None, "temperature": 0}, verbose=False)
    err = capsys.readouterr().err
    assert "context full (64 tokens): stopped; /clear starts over, or raise -c/--ctx-size" in err
    assert "but the context holds 64" in err and "(/clear starts over)" in err


def test_perplexity_command_and_kl_against_itself(capsys, tmp_path):
    saved = tmp_path / "base.npz"
    rc, out, err = run(capsys, "perplexity", "-f", str(TEXT), "-c", "128", "--chunks", "1", "--save-logits",
                       str(saved))  # fmt: skip
    assert rc == 0, err
    assert "Final estimate: PPL = " in out and saved.exists()
    rc, out, err = run(
        capsys, "perplexity", "-m", "smollm2-135m", "-f", str(TEXT), "-c", "128", "--chunks", "1",
        "--kl-base", str(saved)
    )  # fmt: skip
    assert rc == 0, err
    assert "mean 0.000000" in out and "top-1 agreement 100.00%" in out


def test_tokenize_command_ids_only(capsys):
    rc, out, _ = run(capsys, "tokenize", "smollm2-135m", "Hello world", "--ids-only")
    assert rc == 0 and json.loads(out) == [19556, 905]
    rc, out, _ = run(capsys, "tokenize", "-m", "smollm2-135m", "Hello world", "--ids-only")
    assert rc == 0 and json.loads(out) == [19556, 905]
    rc, out, err = run(capsys, "tokenize", "smollm2-135m")
    assert (
        rc == 2
        and out == ""
        and err.strip() == "error: missing TEXT: edgellm tokenize MODEL TEXT (or -m MODEL TEXT)"
    )


def test_bench_reports_speed_memory_and_weight_bytes_as_json(capsys, smollm2_path):
    rc, out, err = run(capsys, "bench", "-m", "smollm2-135m", "-p", "8", "-n", "3", "-r", "2", "--backend",
                       "reference", "--json")  # fmt: skip
    assert rc == 0, err
    assert "bench:" not in err  # no progress line when stderr is not a terminal
    r = json.loads(out)
    assert r["n_prompt"] == 8 and r["n_gen"] == 3 and r["backend"] == "reference"
    assert len(r["runs"]["pp_tok_s"]) == 2 and len(r["runs"]["tg_tok_s"]) == 2
    assert r["pp_tok_s"] > 0 and r["tg_tok_s"] > 0 and 0 < r["ttft_s"] < 60
    # every weight of SmolLM2 is read once per token, and the tied output matrix is the embedding
    size = Path(smollm2_path).stat().st_size
    assert 0.9 * size < r["weight_bytes_per_token"] <= size
    assert r["peak_rss_mb"] > 0


def test_bench_rejects_a_context_too_small(capsys):
    rc, out, err = run(capsys, "bench", "-p", "64", "-n", "64", "-c", "32", "--backend", "reference")
    assert rc == 1 and "-p 64 and -n 64 do not fit a context of 32" in err


# -- what a llama.cpp user expects --------------------------------------------------------------------------

FRANCE = ("-p", "The capital of France is", "--raw", "--temp", "0")  # 5 prompt tokens, BOS included


def test_a_context_that_fills_up_says_so_on_stderr(capsys):
    rc, out, err = run(capsys, "run", *FRANCE, "-c", "16", "-n", "64")
    assert rc == 0 and out.strip()
    assert err.strip() == "context full (16 tokens): stopped; raise -c/--ctx-size"
    rc, _, err = run(capsys, "run", *FRANCE, "-c", "16", "-n", "11")  # -n and the context end together
    assert rc == 0 and "context full (16 tokens)" in err
    rc, _, err = run(capsys, "run", *FRANCE, "-c", "16", "-n", "10")
    assert rc == 0 and err == ""


def test_n_minus_one_runs_to_the_end_of_the_context_and_other_negatives_are_usage_errors(capsys):
    from edgellm import cli_run

    n_predict = inspect.signature(cli_run.run).parameters["n_predict"].default
    assert n_predict.default == 512  # unchanged: llama.cpp's "-1 = until the end" is asked for with -n -1
    to_context = run(capsys, "run", *FRANCE, "-c", "16", "-n", "64")
    unbounded = run(capsys, "run", *FRANCE, "-c", "16", "-n", "-1")
    assert unbounded[0] == 0 and unbounded[1] == to_context[1]
    assert "context full (16 tokens)" in unbounded[2]
    for bad in ("-2", "0"):
        rc, out, err = run(capsys, "run", *FRANCE, "-n", bad)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert err.startswith(f"error: -n/--n-predict {bad}: give a number of tokens, or -1")


def test_ctx_size_above_the_trained_context_warns_once_with_the_kv_cost(capsys):
    rc, out, err = run(capsys, "run", *FRANCE, "-c", "8200", "-n", "1")
    assert rc == 0 and out.strip()
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x K and V x 2 bytes = 23,040 bytes a token
    assert err.strip() == (
        "warning: -c 8200 is above the 8192 tokens this model was trained on: past 8192 its output degrades, "
        "and the KV cache of one context takes 188.9 MB"
    )
    rc, _, err = run(capsys, "run", *FRANCE, "-c", "8192", "-n", "1")
    assert rc == 0 and "warning" not in err


def test_an_empty_prompt_is_a_usage_error_not_free_generation(capsys, tmp_path, monkeypatch):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    cases = {
        ("-p", ""): "error: empty prompt (-p/PROMPT and stdin gave no text); to chat, run it on a terminal",
        (
            "-f",
            str(empty),
        ): f"error: empty prompt (-f {empty} and stdin gave no text); to chat, run it on a terminal",
        (): "error: empty prompt (stdin gave no text); to chat, run it on a terminal",
    }
    for args, message in cases.items():
        rc, out, err = run(capsys, "run", *args, "-n", "4")
        assert (rc, out, err.strip()) == (2, "", message), args


def test_piped_stdin_is_appended_to_the_prompt_after_a_blank_line(capsys, monkeypatch):
    rc, out, err = run(capsys, "run", "--help")
    assert "Piped stdin is appended to it after a blank line" in " ".join(out.replace("│", " ").split())
    joined = run(capsys, "run", "-p", "Capitals:\n\nFrance: Paris. Italy:", "--raw", "-n", "4", "--temp", "0")
    monkeypatch.setattr("sys.stdin", io.StringIO("France: Paris. Italy:"))
    piped = run(capsys, "run", "-p", "Capitals:", "--raw", "-n", "4", "--temp", "0")
    assert joined[0] == piped[0] == 0 and piped[1] == joined[1] and "Rome" in piped[1]


def test_sampling_flags_name_their_defaults_in_help(capsys):
    from edgellm.sampler import SamplingParams

    rc, out, _ = run(capsys, "run", "--help")
    text = " ".join(out.replace("│", " ").split())
    d = SamplingParams()
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.repeat_penalty, d.repeat_last_n) == (
        0.8,
        40,
        0.95,
        0.05,
        1.0,
        64,
    )  # llama.cpp's common/common.h
    for phrase in ("0 = greedy (default 0.8)", "0 = off (default 40)", "1 = off (default 0.95)",
                   "probability (default 0.05)", "1 = off (default 1.0)", "-1 = all (default 64)",
                   "same seed, same text (default: random)", "[default: 512]"):  # fmt: skip
        assert phrase in text, phrase


def test_verbose_rates_come_from_the_tokens_that_arrived_and_the_time_they_took(capsys):
    from edgellm.cli_run import Seen, _print_timings, _rate

    class FakeLLM:
        last_timings = None

        class generator:  # noqa: N801 - the attribute edgellm.LLM had before last_timings
            from edgellm.generate import Timings

            timings = Timings(cached_tokens=0)

    done = Seen(10, started=100.0, first=101.0, last=103.0, tokens=5, finish="length")
    _print_timings(FakeLLM(), done)
    assert capsys.readouterr().err.splitlines() == [
        "prompt eval: 10 tokens, 1.00 s, 10.0 tokens/s",
        "generation:  5 tokens, 2.00 s after the first, 2.0 tokens/s",  # 4 tokens after the first, in 2 s
    ]
    _print_timings(FakeLLM(), Seen(10, started=100.0, first=101.0, last=101.0, tokens=1))
    assert capsys.readouterr().err.splitlines()[1] == (
        "generation:  1 tokens, 0.00 s after the first, - tokens/s (interrupted)"
    )
    assert (
        _rate(1, 1e-7) == "- tokens/s" and _rate(0, 5.0) == "- tokens/s" and _rate(3, 2.0) == "1.5 tokens/s"
    )


def test_ctrl_c_during_an_answer_exits_130_with_sane_verbose_rates(capsys, monkeypatch):
    from edgellm.llm import LLM

    real = LLM.stream

    def interrupted(self, prompt, **kw):  # Ctrl-C arriving while the fourth token is being made
        for n, chunk in enumerate(real(self, prompt, **kw)):
            if n == 3:
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(LLM, "stream", interrupted)
    rc, out, err = run(capsys, "run", *FRANCE, "-n", "20", "--verbose")
    assert rc == 130 and err.strip().splitlines()[-1] == "interrupted"
    gen = next(line for line in err.splitlines() if line.startswith("generation:"))
    assert gen.startswith("generation:  3 tokens, ") and gen.endswith(" (interrupted)")
    rate = gen.split(" after the first, ")[1].split(" tokens/s")[0]
    assert rate == "-" or float(rate) > 0


def test_bench_reports_each_stage_to_a_progress_callback(smollm2_path):
    from edgellm.bench import run_bench
    from edgellm.cli_eval import _progress_line

    stages: list[str] = []
    run_bench("smollm2-135m", n_prompt=4, n_gen=2, reps=2, progress=stages.append)
    assert stages == ["warm-up", "pp4 1/2", "tg2 1/2", "pp4 2/2", "tg2 2/2"]
    with _progress_line() as progress:  # stderr is not a terminal here: no spinner, no callback
        assert progress is None


def test_bench_depth_fills_the_cache_before_each_test(monkeypatch, smollm2_path):
    """-d as llama-bench's: every repetition first fills the cache (untimed), the prompt follows it."""
    import edgellm.bench as bench

    calls: list[tuple[int, int]] = []
    real = bench._prefill

    def spy(model, kv, ids, seq=0, start=0, ubatch=bench.UBATCH):
        calls.append((len(ids), start))
        return real(model, kv, ids, seq, start, ubatch)

    monkeypatch.setattr(bench, "_prefill", spy)
    stages: list[str] = []
    r = bench.run_bench("smollm2-135m", n_prompt=4, n_gen=2, reps=2, n_depth=20, progress=stages.append)
    assert stages == ["warm-up", "depth 20 1/2", "pp4 1/2", "tg2 1/2", "depth 20 2/2", "pp4 2/2", "tg2 2/2"]
    assert calls[1:] == [(20, 0), (4, 20)] * 2  # (the first: the warm-up's)
    assert r.n_depth == 20 and r.pp_tok_s > 0 and r.tg_tok_s > 0
    assert "pp4 @ d20" in bench.format_result(r)


def test_bench_prompts_go_in_ubatches_with_the_last_logits_of_one_forward(monkeypatch, smollm2_path):
    """-ub as llama-bench's: a prompt longer than the ubatch takes several forwards (which bounds the
    scratch a depth of 2048 needs), and its last token's logits are those of the whole prompt at once."""
    import edgellm.bench as bench
    from edgellm.llm import LLM

    m = LLM(smollm2_path, backend="native").model
    ids = bench._ids(m.config.n_vocab, 45)
    forwards: list[int] = []
    real = m.forward

    def spy(tokens, *args, **kwargs):
        forwards.append(len(tokens))
        return real(tokens, *args, **kwargs)

    whole = bench._prefill(m, m.new_kv_cache(64, 1), ids)
    monkeypatch.setattr(m, "forward", spy)
    chunked = bench._prefill(m, m.new_kv_cache(64, 1), ids, ubatch=16)
    assert forwards == [16, 16, 13]
    np.testing.assert_allclose(chunked[-1], whole[-1], rtol=0, atol=2e-3 * float(np.abs(whole[-1]).max()))
    assert int(np.argmax(chunked[-1])) == int(np.argmax(whole[-1]))
    with pytest.raises(ValueError, match="ubatch must be positive"):
        bench.run_bench(smollm2_path, n_prompt=4, n_gen=0, reps=1, ubatch=0)


def test_chat_line_editing_falls_back_silently_without_readline(monkeypatch, tmp_path):
    from edgellm import cli_run

    monkeypatch.setitem(sys.modules, "readline", None)  # `import readline` now raises ImportError
    save = cli_run._line_editing(tmp_path / "chat_history")
    save()
    assert not (tmp_path / "chat_history").exists()


class _Terminal:
    """`edgellm run` (the chat) on a pseudo-terminal, read until what a step waits for appears."""

    def __init__(self, env: dict):
        import os
        import pty
        import subprocess

        self.master, slave = pty.openpty()
        cmd = [sys.executable, "-m", "edgellm", "run", "--backend", "reference"]
        self.proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.seen = b""

    def until(self, needle: bytes, count: int = 1) -> None:
        import os
        import select

        while self.seen.count(needle) < count:
            ready, _, _ = select.select([self.master], [], [], 120)  # a guard against a hang, not a timing
            assert ready, f"no {needle!r} in {self.seen[-400:]!r}"
            self.seen += os.read(self.master, 4096)

    def type(self, keys: bytes, then: bytes, count: int = 1) -> None:
        import os

        os.write(self.master, keys)
        self.until(then, count)

    def close(self) -> int:
        import os

        try:
            return self.proc.wait(timeout=60)
        finally:
            self.proc.kill()
            os.close(self.master)


UP = b"\x1b[A"


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_chat_recalls_earlier_lines_with_the_up_arrow_in_this_session_and_the_next(tmp_path, smollm2_path):
    """readline in the real chat: ↑ brings back `/set seed 7`, and the history file keeps it for later."""
    import os

    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / smollm2_path.name).symlink_to(smollm2_path)
    env = dict(os.environ, EDGELLM_HOME=str(home), TERM="xterm")
    t = _Terminal(env)
    t.until(b">>> ")
    t.type(b"/set seed 7\r", b"set seed = 7")
    t.type(b"/clear\r", b"(conversation cleared)")
    t.type(UP + UP + b"\r", b"set seed = 7", count=2)  # up, up: past /clear to /set seed 7
    t.type(b"/bye\r", b"/bye")
    assert t.close() == 0
    assert (home / "chat_history").read_text().splitlines() == [
        "/set seed 7",
        "/clear",
        "/set seed 7",
        "/bye",
    ]
    t = _Terminal(env)  # a new session starts with the saved history: up, up is /set seed 7 again
    t.until(b">>> ")
    t.type(UP + UP + b"\r", b"set seed = 7")
    t.type(b"/bye\r", b"/bye")
    assert t.close() == 0


def test_run_constrains_the_answer_with_a_grammar_or_a_json_schema(capsys, tmp_path):
    pytest.importorskip("llguidance")
    rc, out, err = run(capsys, "run", "-p", "Is water wet?", "--grammar", 'root ::= "yes" | "no"')
    assert rc == 0 and out.strip() in ("yes", "no"), err
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}  # fmt: skip
    rc, out, err = run(capsys, "run", "-p", "A number as JSON.", "-j", json.dumps(schema), "--temp", "0")
    assert rc == 0 and 1 <= json.loads(out)["n"] <= 9, err
    f = tmp_path / "g.gbnf"
    f.write_text('root ::= "A" | "B"')
    rc, out, _ = run(capsys, "run", "-p", "Pick.", "--grammar-file", str(f))
    assert rc == 0 and out.strip() in ("A", "B")
    rc, out, _ = run(capsys, "run", "-p", "JSON please.", "--json", "-n", "40", "--temp", "0")
    assert rc == 0 and out.lstrip().startswith("{")
    rc, out, err = run(capsys, "run", "-p", "x", "-j", '{"type": "objekt"}')
    assert rc == 1 and out == "" and err.startswith("error:") and "objekt" in err and err.count("\n") == 1
    rc, _, err = run(capsys, "run", "-p", "x", "--json", "--grammar", 'root ::= "a"')
    assert rc == 1 and "give one" in err


def test_bench_takes_a_prompt_longer_than_a_sliding_window_forward(tmp_path):
    """gemma3's ring layers take at most 512 tokens of a sequence per forward: a longer -p runs as
    forwards of 512 (llama-bench's ubatches), not the refusal a single forward gets."""
    from test_config_validation import _gemma3_spec
    from tiny_models import random_weights, write_gguf

    from edgellm.bench import run_bench

    spec = _gemma3_spec()
    path = write_gguf(tmp_path / "gemma3.gguf", spec, random_weights(spec))
    r = run_bench(str(path), backend="native", n_prompt=600, n_gen=2, reps=1)
    assert r.pp_tok_s > 0 and r.tg_tok_s > 0


def test_reasoning_flag_tells_the_template_whether_to_think(capsys, monkeypatch):
    """llama.cpp's -rea/--reasoning on|off|auto: the chat template's enable_thinking (auto: its default)."""
    from edgellm.llm import LLM

    seen = []
    chat_prompt = LLM.chat_prompt

    def spy(self, msgs, **kw):
        seen.append(kw.get("template_kwargs"))
        return chat_prompt(self, msgs, **kw)

    monkeypatch.setattr(LLM, "chat_prompt", spy)
    for flag, want in (("off", {"enable_thinking": False}), ("on", {"enable_thinking": True}), ("auto", {})):
        rc, _, err = run(capsys, "run", "-p", "Hi", "-n", "1", "-rea", flag)
        assert rc == 0 and seen[-1] == want, err
    rc, _, err = run(capsys, "run", "-p", "Hi", "-n", "1", "--reasoning", "maybe")
    assert rc != 0 and "--reasoning must be on, off or auto" in err


def test_prompt_cache_file_is_written_then_read_back_by_the_next_run(capsys, tmp_path):
    """--prompt-cache (llama-cli's): the first run writes the prompt's K/V, the next (a new LLM) reads them
    back and computes only the last token, with the same answer; a file it cannot use is one warning
    line, the prompt computed and the file rewritten."""
    cache = tmp_path / "prompt.bin"
    text = TEXT.read_text()[:1200]
    args = ["run", "-p", text, "--raw", "-n", "6", "--temp", "0", "-v", "--prompt-cache", str(cache)]
    rc, first, err = run(capsys, *args)
    assert rc == 0 and cache.exists() and "from the prefix cache" not in err, err
    n_prompt = int(re.search(r"prompt eval: (\d+) tokens", err).group(1))
    rc, again, err = run(capsys, *args)
    assert rc == 0 and again == first
    assert f"prompt cache: {n_prompt} tokens read from {cache}" in err
    assert f"({n_prompt - 1} from the prefix cache)" in err
    cache.write_bytes(cache.read_bytes()[:100])
    rc, third, err = run(capsys, *args)
    assert rc == 0 and third == first
    assert f"warning: --prompt-cache {cache}: prompt.bin: its header" in err and "rewritten" in err
    assert "from the prefix cache" not in err
    rc, _, err = run(capsys, *args)
    assert rc == 0 and f"({n_prompt - 1} from the prefix cache)" in err  # rewritten whole


def test_llama_cpp_sampler_flags_run_and_bad_values_name_the_flag(capsys):
    """--dry-multiplier etc. (llama.cpp's flags) reach the sampler: DRY breaks greedy's loop, a seeded
    mirostat run repeats; a bad value is one error line naming the flag."""
    prompt = ["run", "-p", "one two three one two three one two three one two", "--raw", "-n", "12"]
    rc, plain, err = run(capsys, *prompt, "--temp", "0")
    assert rc == 0 and "one two three" in plain, err
    rc, dry, err = run(capsys, *prompt, "--temp", "0", "--dry-multiplier", "5", "--dry-allowed-length", "1")
    assert rc == 0 and "one two three" not in dry, err
    rc, same, _ = run(capsys, *prompt, "--temp", "0", "--dry-multiplier", "5", "--dry-allowed-length", "1",
                      "--dry-sequence-breaker", "none", "--dry-penalty-last-n", "-1")  # fmt: skip
    assert rc == 0 and same == dry  # no breakers occur in the prompt: the same answer
    seeded = [*prompt, "--seed", "3", "--mirostat", "2", "--mirostat-ent", "3", "--mirostat-lr", "0.2",
              "--xtc-probability", "0", "--top-nsigma", "1.5", "--dynatemp-range", "0.3"]  # fmt: skip
    a, b = run(capsys, *seeded), run(capsys, *seeded)
    assert a[0] == 0 and a[1] == b[1], a[2]
    for flag, value in (("--mirostat", "3"), ("--xtc-probability", "2"), ("--dry-allowed-length", "-1")):
        rc, out, err = run(capsys, *prompt, flag, value)
        assert rc != 0 and out == "" and flag in err and len(err.strip().splitlines()) == 1, (flag, err)
