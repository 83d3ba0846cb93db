"""Structured output: a row's constraint (a JSON schema, any JSON object, a Lark or llama.cpp GBNF grammar,
a regex, a choice among strings) compiled by llguidance and applied as a token mask before sampling.

llguidance (MIT; Microsoft's guidance-ai/llguidance) computes a mask in tens of microseconds on a 128k
vocabulary (MaskBench), where a GBNF-style parser takes milliseconds: it is the piece we would not write
by hand. It is an optional extra (`pip install 'edgellm[structured]'`); without it a constrained request is
refused by name.

- `Grammar` says what the output must match; `compile_grammar` turns it into llguidance's grammar and
  validates it (a bad schema or grammar is a GrammarError naming what is wrong, before any token).
- `GuidedTokenizer` wraps an edgellm Tokenizer for llguidance (token bytes, control tokens marked),
  built once per model.
- `Constraint` is one sequence's matcher: `allowed()` the mask for the next token, `consume(token)`,
  `done` once nothing can follow.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("json_schema", "json_object", "lark", "gbnf", "regex", "choice")
MAX_GRAMMAR_CHARS = 256 * 1024


class GrammarError(ValueError):
    """A constraint that cannot be compiled or is not supported; the message says why."""


class NotInstalled(GrammarError):
    """llguidance is not installed."""


def _llg() -> Any:
    try:
        import llguidance
    except ImportError:
        raise NotInstalled("structured output needs llguidance: pip install 'edgellm[structured]'") from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """What the output must match. `source`: the schema (a dict, or JSON text), the grammar text, the
    regex, or (choice) a list of strings. A JSON schema's keywords llguidance does not implement (`not`,
    `if`, an unknown `format`, ...) are skipped, as llama.cpp's schema converter skips them, unless
    `strict` (OpenAI's json_schema strict: true), where they are a GrammarError."""

    kind: str
    source: Any = None
    strict: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown constraint kind {self.kind!r}: expected one of {', '.join(KINDS)}")


_JSON_OBJECT = {"type": "object"}  # OpenAI's json_object: any JSON object


def _schema(source: Any) -> dict:
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except (ValueError, RecursionError) as e:
            raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
    if not isinstance(source, dict):
        raise GrammarError("a JSON schema must be an object")
    return source


def _lark_string(s: str) -> str:
    return json.dumps(s)  # a Lark string literal is a JSON string


def to_llguidance(g: Grammar) -> str:
    """The llguidance grammar (its JSON form) for a constraint; not yet validated."""
    llg = _llg()
    if g.kind in ("json_schema", "json_object"):
        schema = _JSON_OBJECT if g.kind == "json_object" else _schema(g.source)
        try:
            text = json.dumps(schema)
        except (TypeError, ValueError) as e:
            raise GrammarError(f"the JSON schema cannot be serialized: {e}") from None
        if len(text) > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"the JSON schema is over {MAX_GRAMMAR_CHARS} characters")
        # whitespace kept to JSON's own (no runs of newlines a small model can loop in)
        try:
            opts = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
            return llg.LLMatcher.grammar_from_json_schema(text, defaults={**opts, "lenient": not g.strict})
        except ValueError as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
    if not isinstance(g.source, (str, list)):
        raise GrammarError(
            f"a {g.kind} constraint needs {'a list of strings' if g.kind == 'choice' else 'text'}"
        )
    if g.kind == "choice":
        if not g.source or not all(isinstance(c, str) and c for c in g.source):
            raise GrammarError("a choice needs a non-empty list of non-empty strings")
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(_lark_string(c) for c in g.source))
    if len(g.source) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the {g.kind} grammar is over {MAX_GRAMMAR_CHARS} characters")
    if g.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(g.source)
    if g.kind == "gbnf":  # llama.cpp's GBNF (or Lark), converted to Lark (llguidance's gbnf_to_lark)
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            lark = any_to_lark(g.source)
        except Exception as e:  # noqa: BLE001 - the converter raises plain exceptions on bad input
            raise GrammarError(f"invalid GBNF grammar: {e}") from None
        return llg.LLMatcher.grammar_from_lark(lark)
    return llg.LLMatcher.grammar_from_lark(g.source)


def schema_error(schema: Any) -> str | None:
    """Why llguidance cannot enforce a JSON schema (an unimplemented keyword, an unknown format, a bad
    reference, ...), or None where it can."""
    llg = _llg()
    try:
        why = llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    except (TypeError, ValueError, RecursionError) as e:
        return str(e) or type(e).__name__
    return why or None


class GuidedTokenizer:
    """An edgellm Tokenizer as llguidance sees it: every token's bytes (control tokens prefixed with
    0xFF, as llguidance's llama.cpp bridge does, so grammar text never matches them), the EOS tokens and
    the model's vocabulary size (rows of the logits). Built once per model (about a second on 150k)."""

    def __init__(self, tokenizer: Any, n_vocab: int):
        llg = _llg()
        self.n_vocab = n_vocab
        v = tokenizer.vocab
        n_tok = tokenizer.vocab_size
        tokens = []
        for i in range(n_tok):
            b = tokenizer.token_to_piece(i, special=True)
            tokens.append(b"\xff" + b if tokenizer.is_special(i) else b)
        tokens += [b""] * max(0, n_vocab - n_tok)
        eos = sorted(tokenizer.eog_ids) or ([v.eos_id] if v.eos_id is not None else [0])

        class _Bridge:
            eos_token_id = eos[0]
            bos_token_id = v.bos_id

            def __init__(self) -> None:
                self.tokens = tokens
                self.special_token_ids = [i for i in range(n_tok) if tokenizer.is_special(i)]

            def __call__(self, text: str) -> list[int]:
                if isinstance(text, bytes):
                    raise TypeError("text only")  # llguidance then passes str
                return tokenizer.encode(text, add_special=False, parse_special=False)

        self.ll = llg.LLTokenizer(llg.TokenizerWrapper(_Bridge()), n_vocab=n_vocab, eos_token=eos)
        self.eos = frozenset(eos)


_cache_lock = threading.Lock()


def guided_tokenizer(tokenizer: Any, n_vocab: int) -> GuidedTokenizer:
    """The tokenizer's GuidedTokenizer for `n_vocab` logits, made on first use and kept on it (every
    engine the model opens shares it)."""
    with _cache_lock:
        cache = tokenizer.__dict__.setdefault("_guided", {})
        if n_vocab not in cache:
            cache[n_vocab] = GuidedTokenizer(tokenizer, n_vocab)
        return cache[n_vocab]


def compile_grammar(g: Grammar, gt: GuidedTokenizer) -> str:
    """to_llguidance, validated against the tokenizer: a GrammarError names the first problem."""
    llg = _llg()
    text = to_llguidance(g)
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(text, gt.ll)
    if is_error:
        raise GrammarError(
            f"invalid {g.kind.replace('_', ' ')}: {messages[0] if messages else 'unknown error'}"
        )
    return text


class Constraint:
    """One sequence's matcher over a compiled grammar."""

    def __init__(self, grammar: str, gt: GuidedTokenizer):
        llg = _llg()
        self.gt = gt
        self.m = llg.LLMatcher(gt.ll, grammar, log_level=0)
        if self.m.is_error():
            raise GrammarError(self.m.get_error())
        self._words = (gt.n_vocab + 31) // 32

    def allowed(self) -> np.ndarray:
        """Which tokens may come next: a bool mask of the vocabulary (EOS only where the grammar is
        complete)."""
        bits = np.frombuffer(self.m.compute_bitmask(), np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.gt.n_vocab].astype(bool)

    def allowed_along(self, draft: list[int]) -> list[np.ndarray]:
        """The masks for a speculative step: now, and after each of `draft`'s tokens in turn (all of them
        allowed: see `valid_prefix`); the matcher is left where it was."""
        masks, n = [self.allowed()], 0
        try:
            for t in draft:
                self.consume(t)
                n += 1
                masks.append(self.allowed())
        finally:
            self.m.rollback(n)
        return masks

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` the grammar takes from here, in order, up to an end-of-generation token
        (a guess never ends the answer: the target does); the matcher does not move."""
        eos = next((i for i, t in enumerate(tokens) if int(t) in self.gt.eos), len(tokens))
        return int(self.m.validate_tokens([int(t) for t in tokens[:eos]]))

    def consume(self, token: int) -> None:
        if not self.m.consume_token(int(token)):
            raise GrammarError(f"the constraint refused token {token}: {self.m.get_error()}")

    @property
    def done(self) -> bool:
        """Nothing can follow what was generated (the grammar is complete and closed)."""
        return self.m.is_stopped()

    def min_tokens(self) -> int:
        """A lower bound on the tokens any answer still takes: those the grammar forces from here, plus
        one if they do not complete it (on a copy: this matcher does not move). A request whose
        max_tokens is below it can never finish."""
        m = self.m.deep_copy()
        forced = m.compute_ff_tokens()
        if forced and not m.consume_tokens(forced):
            return len(forced)
        return len(forced) + (0 if m.is_accepting() else 1)
