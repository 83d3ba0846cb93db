"""The tokenizer against llama.cpp: ids, detokenized text and vocabulary facts recorded in fixtures.

The fixtures (tests/fixtures/tokenizer/*.json) come from scripts/make_tokenizer_fixtures.py, which runs
llama.cpp through llama-cpp-python on the corpus in corpus.json; these tests need only the fixtures.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from edgellm.gguf import ModelFile
from edgellm.tokenizer import StreamDecoder, Tokenizer, TokenizerError, bpe, format_tokens
from edgellm.tokenizer.stream import clean_spaces

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"
VOCABS = Path(__file__).resolve().parent.parent / "models" / "vocab"
CORPUS: list[str] = json.loads((FIXTURES / "corpus.json").read_text(encoding="utf-8"))
COMBOS = {"ff": (False, False), "ft": (False, True), "tf": (True, False), "tt": (True, True)}


def _fixture(name: str) -> dict:
    """A fixture with the ids the generator left out (derivable ones, see its compact()) filled back in."""
    fx = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    assert len(fx["cases"]) == len(CORPUS), "stale fixture: rerun scripts/make_tokenizer_fixtures.py fixtures"
    pre = [fx["bos"]] if fx["add_bos"] else []
    post = [fx["eos"]] if fx["add_eos"] else []
    for c in fx["cases"]:
        c.setdefault("ft", c["ff"])
        c.setdefault("tf", pre + c["ff"] + post)
        c.setdefault("tt", pre + c["ft"] + post)
    return fx


def _bytes(text: str) -> bytes:
    return bytes.fromhex(text[4:]) if text.startswith("hex:") else text.encode("utf-8")


def _mismatches(tok: Tokenizer, fx: dict) -> list[str]:
    bad = []
    for s, case in zip(CORPUS, fx["cases"], strict=True):
        for key, (add_special, parse_special) in COMBOS.items():
            got = tok.encode(s, add_special=add_special, parse_special=parse_special)
            if got != case[key]:
                bad.append(f"{key} {s[:80]!r}\n  llama.cpp {case[key][:40]}\n  edgellm   {got[:40]}")
        for ids, special, want in ((case["ff"], False, case["d"]), (case["tt"], True, case["ds"])):
            got_text = tok.detokenize(ids, special=special)
            if got_text != _bytes(want):
                bad.append(
                    f"detok(special={special}) {s[:60]!r}\n  llama.cpp {want[:60]!r}\n  got {got_text[:60]!r}"
                )
    return bad


def _vocab_facts_match(tok: Tokenizer, fx: dict) -> None:
    v = tok.vocab
    assert tok.vocab_size == fx["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (fx["bos"], fx["eos"], fx["pad"])
    assert (tok.add_bos, tok.add_eos) == (fx["add_bos"], fx["add_eos"])
    assert sorted(tok.eog_ids) == fx["eog"]
    # llama.cpp takes the first EOT-looking text it meets in an unordered_map, so with several candidates
    # its pick depends on the C++ library; ours is its list order. Both are in the EOG set.
    assert (tok.eot_id is None) == (fx["eot"] is None)
    assert fx["eot"] is None or (tok.eot_id in tok.eog_ids and fx["eot"] in tok.eog_ids)
    for key, special in (("pieces_sha256", False), ("pieces_special_sha256", True)):
        h = hashlib.sha256()
        for i in range(tok.vocab_size):
            p = v.piece(i, special)
            h.update(len(p).to_bytes(4, "little") + p)
        assert h.hexdigest() == fx[key], f"token_to_piece(special={special}) differs for some token"
    control = bytes(int(bool(a & 8)) for a in v.attrs)
    assert hashlib.sha256(control).hexdigest() == fx["control_sha256"]


# --- the real models -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(ModelFile(smollm2_path))


@pytest.fixture(scope="module")
def gemma3(gemma3_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(ModelFile(gemma3_path))


@pytest.fixture(scope="module")
def qwen_coder(qwen_coder_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(ModelFile(qwen_coder_path))


_FIXTURE_NAMES = {"smollm2": "smollm2", "gemma3": "gemma3", "qwen_coder": "qwen2.5-coder"}


def test_corpus_is_large_and_varied():
    assert len(CORPUS) >= 300
    assert "" in CORPUS and "a" * 5000 in CORPUS and " " * 2000 in CORPUS
    joined = "".join(CORPUS)
    probes = ["的", "ا", "न", "П", "ส", "ש", "Γ", "👍🏽", "\u200d", "<|im_start|>", "<start_of_turn>", "'ll"]
    for probe in probes:
        assert probe in joined, probe


@pytest.mark.parametrize("name", ["smollm2", "gemma3", "qwen_coder"])
def test_ids_and_text_identical_to_llama_cpp(name: str, request: pytest.FixtureRequest):
    tok = request.getfixturevalue(name)
    bad = _mismatches(tok, _fixture(_FIXTURE_NAMES[name]))
    assert not bad, f"{len(bad)} mismatches with llama.cpp:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("name", ["smollm2", "gemma3", "qwen_coder"])
def test_vocabulary_facts_identical_to_llama_cpp(name: str, request: pytest.FixtureRequest):
    _vocab_facts_match(request.getfixturevalue(name), _fixture(_FIXTURE_NAMES[name]))


@pytest.mark.parametrize("name", ["smollm2", "gemma3", "qwen_coder"])
def test_decode_encode_round_trips_where_llama_cpp_does(name: str, request: pytest.FixtureRequest):
    tok = request.getfixturevalue(name)
    n = 0
    for s, case in zip(CORPUS, _fixture(_FIXTURE_NAMES[name])["cases"], strict=True):
        if case["d"] == s:  # llama.cpp's own round trip holds
            assert tok.decode(tok.encode(s, add_special=False)) == s
            assert tok.decode(tok.encode(s, add_special=True)) == s  # BOS decodes to nothing
            n += 1
    assert n > 0.8 * len(CORPUS)


def test_eog_ids_contain_the_end_of_turn_tokens(smollm2: Tokenizer, gemma3: Tokenizer):
    im_end = smollm2.encode("<|im_end|>", add_special=False, parse_special=True)
    assert len(im_end) == 1 and im_end[0] in smollm2.eog_ids and smollm2.eot_id == im_end[0]
    end_of_turn = gemma3.encode("<end_of_turn>", add_special=False, parse_special=True)
    assert len(end_of_turn) == 1 and end_of_turn[0] in gemma3.eog_ids and gemma3.eot_id == end_of_turn[0]
    assert smollm2.eos_id in smollm2.eog_ids and gemma3.eos_id in gemma3.eog_ids


def test_special_token_text_is_plain_text_unless_parse_special(smollm2: Tokenizer):
    plain = smollm2.encode("<|im_start|>", add_special=False)
    assert len(plain) > 1 and smollm2.encode("<|im_start|>", add_special=False, parse_special=True) == [1]
    assert smollm2.is_special(1) and not smollm2.is_special(plain[0])
    assert smollm2.decode([1]) == "" and smollm2.decode([1], special=True) == "<|im_start|>"


def test_gemma_adds_bos_and_splits_user_defined_whitespace_tokens(gemma3: Tokenizer):
    ids = gemma3.encode("a\n\n\nb")
    assert ids[0] == gemma3.bos_id and gemma3.token_text(ids[2]) == "\n\n\n"


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_stream_never_splits_a_character_and_adds_up_to_decode(name: str, request: pytest.FixtureRequest):
    tok = request.getfixturevalue(name)
    for s in ["👨‍👩‍👧‍👦 family 👍🏽", "😀" * 5, "中文和日本語", "plain ascii text", "x\U0010fffd\U0001f9ffy"]:
        ids = tok.encode(s)
        st = tok.stream()
        parts = [st.push(i) for i in ids] + [st.flush()]
        assert "".join(parts) == tok.decode(ids) == s
        assert not any("\ufffd" in p for p in parts)


class _PieceVocab:
    """Just enough of a Vocab for StreamDecoder: token i is the i-th piece."""

    add_space_prefix = False
    clean_spaces = True

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    def piece(self, i: int, special: bool) -> bytes:
        return self.pieces[i]


def test_stream_with_clean_up_spaces_adds_up_to_the_whole_text_cleaned():
    # BPE vocabularies with clean_spaces (gpt2, llama3 …) drop the space in " ," " 's" " ' " …; text the
    # rule could still change must wait for what follows, and the pieces must add up to the whole
    rng = random.Random(0)
    for _ in range(2000):
        text = bytes(rng.choice(b" ' ' asrevmt,.?!x") for _ in range(rng.randrange(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randrange(1, 8))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)], strict=True)]
        st = StreamDecoder(_PieceVocab(pieces))  # type: ignore[arg-type]
        out = "".join(st.push(i) for i in range(len(pieces))) + st.flush()
        assert out == clean_spaces(text).decode(), (text, pieces)


def test_clean_up_spaces_is_llama_cpps():
    assert clean_spaces(b"Hello , world . Isn 't it ? It 's , he 'll say ' yes ' .") == (
        b"Hello, world. Isn 't it? It's, he 'll say'yes '."  # as llama_detokenize on the gpt-2 vocab
    )
    assert clean_spaces(b"") == b"" and clean_spaces(b" ") == b" " and clean_spaces(b" .") == b"."


@pytest.mark.parametrize("stem", ["ggml-vocab-gpt-2", "ggml-vocab-llama-spm"])
def test_stream_adds_up_to_decode_over_the_corpus(stem: str):
    if not (VOCABS / f"{stem}.gguf").exists():
        pytest.skip(f"models/vocab/{stem}.gguf not present")
    tok = Tokenizer.from_gguf(ModelFile(VOCABS / f"{stem}.gguf"))
    for s in CORPUS:
        ids = tok.encode(s, parse_special=True)
        for special in (False, True):
            st = tok.stream(special)
            parts = [st.push(i) for i in ids] + [st.flush()]
            full = tok.decode(ids, special)
            assert "".join(parts) == full
            assert "\ufffd" in full or not any("\ufffd" in p for p in parts)


def test_format_tokens_shows_ids_and_printable_pieces(smollm2: Tokenizer):
    rows = format_tokens(smollm2, smollm2.encode("Hi\n<|im_end|>😀", parse_special=True))
    assert rows[0] == (smollm2.encode("Hi", add_special=False)[0], "Hi")
    assert ("\\n" in [p for _, p in rows]) and (2, "<|im_end|>") in rows
    assert any(p.startswith("<0x") for _, p in rows)  # the emoji's bytes, one token at a time


def test_loading_is_lazy_and_load_parses_everything(smollm2_path: Path):
    mf = ModelFile(smollm2_path)
    tok = Tokenizer.from_gguf(mf)
    assert "texts" not in tok.vocab.__dict__  # nothing parsed until first use
    assert tok.bos_id == 1 and tok.vocab_size == 49152
    tok.load()
    mf.close()
    assert tok.decode(tok.encode("still works")) == "still works"


# --- errors ---------------------------------------------------------------------------------------------
def _meta(**over) -> dict:
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": _Strings(["a", "b"]),
        "tokenizer.ggml.merges": _Strings(["a b"]),
    }
    md.update(over)
    return md


class _Strings(list):
    def tobytes_list(self) -> list[bytes]:
        return [s.encode() for s in self]


def test_unknown_pre_tokenizer_is_a_clear_error():
    with pytest.raises(TokenizerError, match="pre-tokenizer.*'no-such-pre'"):
        Tokenizer.from_gguf(_meta(**{"tokenizer.ggml.pre": "no-such-pre"}))


def test_unknown_tokenizer_model_is_a_clear_error():
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model='t5'"):
        Tokenizer.from_gguf(_meta(**{"tokenizer.ggml.model": "t5"}))


def test_bpe_without_merges_is_a_clear_error():
    md = _meta()
    del md["tokenizer.ggml.merges"]
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_gguf(md)


# --- vocabulary-only GGUFs (models/vocab): other pre-tokenizers --------------------------------------------
VOCAB_FILES = sorted(p.stem for p in VOCABS.glob("*.gguf"))


@pytest.mark.parametrize("stem", VOCAB_FILES)
def test_vocab_only_gguf_matches_llama_cpp(stem: str):
    name = "vocab-" + stem
    if not (FIXTURES / f"{name}.json").exists():
        pytest.skip(f"no fixture for {stem}")
    fx = _fixture(name)
    tok = Tokenizer.from_gguf(ModelFile(VOCABS / f"{stem}.gguf"))
    bad = _mismatches(tok, fx)
    assert not bad, f"{len(bad)} mismatches with llama.cpp:\n" + "\n".join(bad[:20])
    _vocab_facts_match(tok, fx)


def test_long_word_merge_path_matches_llama_cpp(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch):
    # words longer than bpe._SHORT_WORD merge through a priority queue; force it for every word
    monkeypatch.setattr(bpe, "_SHORT_WORD", 1)
    tok = Tokenizer.from_gguf(ModelFile(smollm2_path))
    for s, case in zip(CORPUS, _fixture("smollm2")["cases"], strict=True):
        assert tok.encode(s, add_special=False) == case["ff"], s[:80]


# --- pre-tokenizers with no vocabulary at hand: the gpt-2 vocabulary renamed (fixtures pre-*.json) ---------
PRE_FIXTURES = sorted(p.stem for p in FIXTURES.glob("pre-*.json"))


@pytest.mark.parametrize("name", PRE_FIXTURES)
def test_pre_tokenizer_matches_llama_cpp(name: str):
    fx = _fixture(name)
    if not (VOCABS / fx["base"]).exists():
        pytest.skip(f"models/vocab/{fx['base']} not present")
    md = {**ModelFile(VOCABS / fx["base"]).metadata, "tokenizer.ggml.pre": fx["pre"]}
    tok = Tokenizer.from_gguf(md)
    bad = _mismatches(tok, fx)
    assert not bad, f"{len(bad)} mismatches with llama.cpp:\n" + "\n".join(bad[:20])
    _vocab_facts_match(tok, fx)
