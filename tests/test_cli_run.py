"""`edgellm run`, `perplexity` and `tokenize` end to end on SmolLM2 (reference backend, greedy)."""

from __future__ import annotations

import io
import json
from pathlib import Path

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
    assert "generation:" in err and "tokens/s" in err and "chat template: gguf" in err


def test_run_positional_model_and_prompt_raw_completion_is_deterministic(capsys):
    a = run(capsys, "run", "smollm2-135m", "The capital of France is", "--raw", "-n", "6", "--temp", "0")
    b = run(
        capsys, "run", "smollm2-135m", "-p", "The capital of France is", "--raw", "-n", "6", "--temp", "0"
    )
    assert a[0] == b[0] == 0
    assert a[1] == b[1] and "Paris" in a[1]


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
    assert rc == 1 and "temperature" in err


def test_stop_string_ends_the_answer_without_printing_it(capsys):
    rc, out, _ = run(capsys, "run", "-p", "The capital of France is", "--raw", "-n", "20", "--temp", "0",
                     "--stop", "Paris")  # fmt: skip
    assert rc == 0 and "Paris" not in out


def test_interactive_chat_commands(capsys, monkeypatch):
    from edgellm import cli_run
    from edgellm.llm import LLM

    lines = iter(["/set temp 0", "/set n_predict 6", "/show", '"""', "Say one", "word.", '"""', "/clear",
                  "/nonsense", "/bye"])  # fmt: skip
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    llm = LLM("smollm2-135m", backend="reference", n_ctx=512)
    cli_run._interactive(llm, None, {"max_tokens": 64, "stop": None}, verbose=False)
    out = capsys.readouterr().out
    assert "set temperature = 0.0" in out and "set max_tokens = 6" in out
    assert "(conversation cleared)" in out and "unknown command /nonsense" in out


def test_perplexity_command_and_kl_against_itself(capsys, tmp_path):
    saved = tmp_path / "base.npz"
    rc, out, err = run(capsys, "perplexity", "-f", str(TEXT), "-c", "128", "--chunks", "1", "--save-logits",
                       str(saved))  # fmt: skip
    assert rc == 0, err
    assert "Final estimate: PPL = " in out and saved.exists()
    rc, out, err = run(
        capsys, "perplexity", "-f", str(TEXT), "-c", "128", "--chunks", "1", "--kl-base", str(saved)
    )
    assert rc == 0, err
    assert "mean 0.000000" in out and "top-1 agreement 100.00%" in out


def test_tokenize_command_ids_only(capsys):
    rc, out, _ = run(capsys, "tokenize", "smollm2-135m", "Hello world", "--ids-only")
    assert rc == 0 and json.loads(out) == [19556, 905]


def test_bench_reports_speed_memory_and_weight_bytes_as_json(capsys, smollm2_path):
    rc, out, err = run(capsys, "bench", "-p", "8", "-n", "3", "-r", "2", "--backend", "reference", "--json")
    assert rc == 0, err
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
    assert rc == 1 and "does not fit" in err
