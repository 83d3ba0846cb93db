"""`edgellm run`: one answer streamed to stdout, or an interactive chat on a TTY (like `ollama run`).

Flags and habits follow llama.cpp: -m/--model, `-n -1` (until the end of generation or the context is full),
piped stdin appended to the prompt, a note on stderr when the context fills, readline in the chat.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import typer

from edgellm import store
from edgellm.backends import names as backend_names
from edgellm.cli_eval import CACHE_OPTIONS
from edgellm.cli_serve import MEMORY_OPTIONS, SAMPLING_OPTIONS, SPEC_OPTIONS, sampling_flags, spec_config
from edgellm.kvcache import OutOfBlocks

DEFAULT_N_PREDICT = 512
HISTORY_LINES = 1000  # lines of chat input readline keeps (and saves in store.home() / "chat_history")


class RunError(ValueError):
    pass


def _usage_error(msg: str) -> Exception:
    from edgellm.cli import UsageError  # edgellm.cli imports this module: import it when it runs

    return UsageError(msg)


def _split_model_and_prompt(
    model: str | None, model_opt: str | None, prompt_pos: str | None, prompt_opt: str | None
):
    """`run [MODEL] [PROMPT]`, `-m MODEL [PROMPT]` plus `-p`: the first positional is a model unless -m
    names one, and never a prompt in disguise."""
    if model_opt is not None:
        if prompt_pos is not None:
            raise _usage_error("with -m/--model, give at most one positional argument: the prompt")
        model, prompt_pos = model_opt, model
    elif model is not None and store.spec_for(model) is None and not Path(model).expanduser().is_file():
        cached = store.models_dir() / model
        if not cached.is_file():
            raise RunError(
                f"{model!r} is neither a known model ({', '.join(store.REGISTRY)}) nor a file; "
                f"to use the default model with a prompt, write: edgellm run -p {model!r}"
            )
    if prompt_pos is not None and prompt_opt is not None:
        raise RunError("give the prompt once: either as the second argument or with -p/--prompt")
    return model, prompt_pos if prompt_pos is not None else prompt_opt


def _piped(stdin: Any) -> str | None:
    """All of stdin when it is a pipe or a file; None on a terminal (or a stdin that cannot be read)."""
    try:
        if stdin is None or stdin.isatty() or not stdin.readable():
            return None
        return stdin.read()
    except (OSError, ValueError):  # closed, or a pseudo-file that refuses (pytest's)
        return None


def _gather_prompt(text: str | None, file: Path | None, stdin: Any) -> str | None:
    """The prompt: -p/PROMPT or -f, then piped stdin after a blank line, as llama.cpp's llama-run does
    (tools/run/run.cpp, main: `opt.user += "\\n\\n"; opt.user += read_pipe_data();`). None when there is
    no prompt at all (stdin is a terminal: chat). A prompt with no text is a usage error."""
    sources = []
    if file is not None:
        if text is not None:
            raise RunError("give the prompt once: -f FILE or a prompt, not both")
        text = file.read_text(encoding="utf-8")
        sources.append(f"-f {file}")
    elif text is not None:
        sources.append("-p/PROMPT")
    piped = _piped(stdin)
    if piped is not None:
        sources.append("stdin")
    if text is None and piped is None:
        return None
    prompt = "\n\n".join(t for t in (text, piped) if t and t.strip())
    if not prompt:
        raise _usage_error(
            f"empty prompt ({' and '.join(sources)} gave no text); to chat, run it on a terminal"
        )
    return prompt


def _max_tokens(n_predict: int) -> int | None:
    """-n as LLM.stream takes it: -1 means until the end of generation or the context is full."""
    if n_predict == -1:
        return None
    if n_predict < 1:
        raise _usage_error(
            f"-n/--n-predict {n_predict}: give a number of tokens, or -1 (until the end of generation "
            "or the context is full)"
        )
    return n_predict


def _warn_long_context(llm: Any, log) -> None:
    """-c past the trained context: said once, with what it costs."""
    from edgellm.modelinfo import human_bytes

    n_train = llm.model.config.n_ctx_train
    if llm.n_ctx > n_train:
        kv = llm.model.kv_bytes_per_token() * llm.n_ctx
        log(
            f"warning: -c {llm.n_ctx} is above the {n_train} tokens this model was trained on: past "
            f"{n_train} its output degrades, and the KV cache of one context takes {human_bytes(kv)}"
        )


def _template_label(llm: Any, raw: bool) -> str:
    """The chat template in use, as --verbose and /show say it."""
    if raw:
        return "none (--raw: plain completion)"
    t = llm.template
    name = {"gguf": "from the file", "file": "from a .jinja file", "inline": "inline"}.get(t.name, t.name)
    return f"{name} ({t.reason})" if t.reason else name


BACKEND_HELP = f"Compute backend: {', '.join(backend_names())} (auto: the fastest that runs here)."


def run(
    model: str | None = typer.Argument(None, help="Model alias or .gguf path (default: smollm2-135m)."),
    prompt_arg: str | None = typer.Argument(None, metavar="[PROMPT]", help="Prompt (or use -p)."),
    model_opt: str | None = typer.Option(
        None, "-m", "--model", help="Model, as llama.cpp spells it (then PROMPT may be the one positional)."
    ),
    prompt: str | None = typer.Option(
        None, "-p", "--prompt", help="Prompt text. Piped stdin is appended to it after a blank line."
    ),
    file: Path | None = typer.Option(None, "-f", "--file", help="Read the prompt from a file."),
    raw: bool = typer.Option(False, "--raw", help="Plain completion: no chat template."),
    system: str | None = typer.Option(None, "-s", "--system", help="System message (default: none)."),
    n_predict: int = typer.Option(
        DEFAULT_N_PREDICT,
        "-n",
        "--n-predict",
        help="Tokens to generate at most; -1: until the end of generation or the context is full.",
    ),
    ctx_size: int | None = typer.Option(
        None, "-c", "--ctx-size", help="Context size in tokens (default: min(4096, the model's trained))."
    ),
    threads: int | None = typer.Option(None, "-t", "--threads", help="CPU threads (default: the cores)."),
    temperature: float | None = SAMPLING_OPTIONS["temperature"](),
    top_k: int | None = SAMPLING_OPTIONS["top_k"](),
    top_p: float | None = SAMPLING_OPTIONS["top_p"](),
    min_p: float | None = SAMPLING_OPTIONS["min_p"](),
    typical_p: float | None = SAMPLING_OPTIONS["typical_p"](),
    repeat_penalty: float | None = SAMPLING_OPTIONS["repeat_penalty"](),
    repeat_last_n: int | None = SAMPLING_OPTIONS["repeat_last_n"](),
    presence_penalty: float | None = SAMPLING_OPTIONS["presence_penalty"](),
    frequency_penalty: float | None = SAMPLING_OPTIONS["frequency_penalty"](),
    seed: int | None = SAMPLING_OPTIONS["seed"](),
    top_n_sigma: float | None = SAMPLING_OPTIONS["top_n_sigma"](),
    xtc_probability: float | None = SAMPLING_OPTIONS["xtc_probability"](),
    xtc_threshold: float | None = SAMPLING_OPTIONS["xtc_threshold"](),
    dynatemp_range: float | None = SAMPLING_OPTIONS["dynatemp_range"](),
    dynatemp_exponent: float | None = SAMPLING_OPTIONS["dynatemp_exponent"](),
    dry_multiplier: float | None = SAMPLING_OPTIONS["dry_multiplier"](),
    dry_base: float | None = SAMPLING_OPTIONS["dry_base"](),
    dry_allowed_length: int | None = SAMPLING_OPTIONS["dry_allowed_length"](),
    dry_penalty_last_n: int | None = SAMPLING_OPTIONS["dry_penalty_last_n"](),
    dry_sequence_breakers: list[str] | None = SAMPLING_OPTIONS["dry_sequence_breakers"](),
    mirostat: int | None = SAMPLING_OPTIONS["mirostat"](),
    mirostat_eta: float | None = SAMPLING_OPTIONS["mirostat_eta"](),
    mirostat_tau: float | None = SAMPLING_OPTIONS["mirostat_tau"](),
    stop: list[str] | None = typer.Option(None, "--stop", help="Stop string (repeatable; default: none)."),
    backend: str = typer.Option("auto", "--backend", help=BACKEND_HELP),
    chat_template: str | None = typer.Option(
        None, "--chat-template", help="Built-in name or .jinja file (default: the file's own)."
    ),
    no_mmap: bool = MEMORY_OPTIONS["no_mmap"](),
    mlock: bool = MEMORY_OPTIONS["mlock"](),
    cache_type_k: str = CACHE_OPTIONS["cache_type_k"](),
    cache_type_v: str = CACHE_OPTIONS["cache_type_v"](),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Print load time, the chat template and tokens/s."
    ),
    grammar: str | None = typer.Option(
        None, "--grammar", help="Constrain the answer: a GBNF or Lark grammar."
    ),
    grammar_file: Path | None = typer.Option(None, "--grammar-file", help="Read the grammar from a file."),
    json_schema: str | None = typer.Option(
        None, "-j", "--json-schema", help="Constrain the answer to JSON matching this schema."
    ),
    json_schema_file: Path | None = typer.Option(
        None, "--json-schema-file", help="Read the schema from a file."
    ),
    as_json: bool = typer.Option(False, "--json", help="Constrain the answer to a JSON object."),
    reasoning_mode: str = typer.Option(
        "auto",
        "-rea",
        "--reasoning",
        help="Let a thinking model think: on, off (its template's enable_thinking false, and a <think> its "
        "prompt opens closed) or auto (the template's default), as llama.cpp's.",
    ),
    spec_type: str = SPEC_OPTIONS["spec_type"](),
    model_draft: str | None = SPEC_OPTIONS["model_draft"](),
    draft_max: int = SPEC_OPTIONS["draft_max"](),
    draft_min: int = SPEC_OPTIONS["draft_min"](),
    prompt_cache: Path | None = typer.Option(
        None,
        "--prompt-cache",
        help="A file for the prompt's KV cache (llama-cli's): read back when it exists, so a prompt that "
        "begins with the same tokens (a long system prompt) skips computing them; written after each answer.",
    ),
) -> None:
    """Answer a prompt (streamed), or chat interactively when no prompt is given on a terminal.

    Sampling defaults are llama.cpp's unless the model sets general.sampling.* (/show lists them)."""
    from edgellm.llm import LLM

    model, text = _split_model_and_prompt(model, model_opt, prompt_arg, prompt)
    text = _gather_prompt(text, file, sys.stdin)
    max_tokens = _max_tokens(n_predict)
    constraint = _constraint(grammar, grammar_file, json_schema, json_schema_file, as_json)
    thinking = {"on": True, "off": False, "auto": None}
    if reasoning_mode not in thinking:
        raise ValueError(f"--reasoning must be on, off or auto, not {reasoning_mode!r}")
    kw = {} if thinking[reasoning_mode] is None else {"enable_thinking": thinking[reasoning_mode]}

    def log(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    # the sampling flags: this command's parameters named as SAMPLING_OPTIONS' keys
    sampling = sampling_flags(**{k: v for k, v in locals().items() if k in SAMPLING_OPTIONS})
    llm = LLM(
        model,
        backend=backend,
        threads=threads,
        n_ctx=ctx_size,
        chat_template=chat_template,
        use_mmap=not no_mmap,
        use_mlock=mlock,
        log=log,
        spec=spec_config(spec_type, draft_max, draft_min, model_draft),
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
    )
    _warn_long_context(llm, log)
    if verbose:
        kernels = getattr(llm.backend, "level", None)  # the native backend's SIMD level, chosen at run time
        backend = f"{llm.backend.name} ({kernels})" if kernels else llm.backend.name
        kv = f"KV {llm.model.cache_type_k}/{llm.model.cache_type_v}"
        log(f"loaded {llm.path.name} in {llm.load_s:.2f} s (backend {backend}, ctx {llm.n_ctx}, {kv})")
        log(f"chat template: {_template_label(llm, raw and text is not None)}")
    if constraint is not None:
        llm.engine.compile_grammar(constraint)  # a bad grammar or schema: one line, before any token
    opts = dict(max_tokens=max_tokens, stop=stop or None, grammar=constraint, **sampling)
    cache = PromptCache(llm, prompt_cache, log, verbose)
    if text is None:
        _interactive(
            llm,
            system,
            opts,
            verbose,
            history_file=store.home() / "chat_history",
            template_kwargs=kw,
            cache=cache,
        )
        return
    if raw:
        ids = llm.tokenize(text)
    else:
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}
        ]
        ids = llm.chat_prompt(msgs, template_kwargs=kw)
    seen = Seen(len(ids))
    try:
        _print_stream(llm.stream(ids, **opts), seen)
    except KeyboardInterrupt:
        print()
        if verbose:
            _print_timings(llm, seen)
        raise
    print()
    cache.write(ids)
    if _context_full(llm, seen):
        log(f"context full ({llm.n_ctx} tokens): stopped; raise -c/--ctx-size")
    if verbose:
        _print_timings(llm, seen)


class PromptCache:
    """`--prompt-cache FILE` (llama-cli's): the file's K/V restored into the engine's prefix cache at
    start, when it exists; what the cache holds of each answered prompt written back (slots.py's file:
    a file from another model or KV cache type is named in one warning line and rewritten)."""

    def __init__(self, llm: Any, path: Path | None, log: Any, verbose: bool):
        self.llm, self.path, self.log = llm, path, log
        if path is None or not path.exists():
            return
        try:
            n = llm.load_prompt_cache(path)
        except (OSError, ValueError, OutOfBlocks) as e:
            log(f"warning: --prompt-cache {path}: {e}; the prompt is computed and the file rewritten")
            return
        if verbose:
            log(f"prompt cache: {n} tokens read from {path}")

    def write(self, ids: list[int]) -> None:
        if self.path is None:
            return
        try:
            self.llm.save_prompt_cache(self.path, ids)
        except OSError as e:
            self.log(f"warning: --prompt-cache {self.path}: not written: {e.strerror or e}")


def _constraint(grammar, grammar_file, json_schema, json_schema_file, as_json) -> Any:
    """The answer's constraint from the flags (at most one), as a structured.Grammar."""
    from edgellm.structured import Grammar

    given = [n for n, v in (("--grammar", grammar), ("--grammar-file", grammar_file), ("--json-schema",
             json_schema), ("--json-schema-file", json_schema_file), ("--json", as_json)) if v]  # fmt: skip
    if len(given) > 1:
        raise ValueError(f"{given[0]} and {given[1]} both constrain the answer: give one")
    if grammar_file is not None:
        grammar = _read_text(grammar_file, "--grammar-file")
    if json_schema_file is not None:
        json_schema = _read_text(json_schema_file, "--json-schema-file")
    if grammar:
        return Grammar("gbnf", grammar)
    if json_schema:
        return Grammar("json_schema", json_schema)
    return Grammar("json_object") if as_json else None


def _read_text(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{flag} {path}: {e}") from None


@dataclass
class Seen:
    """What the CLI saw of one answer. The context-full note and the rates come from it, so that they hold
    after Ctrl-C too, when the engine's own figures are cut short."""

    prompt_tokens: int
    started: float = field(default_factory=time.perf_counter)
    first: float | None = None  # when the first generated token arrived
    last: float | None = None  # when the last one did
    tokens: int = 0
    finish: str | None = None
    text: str = ""


def _print_stream(chunks, seen: Seen) -> str:
    out = []
    try:
        for c in chunks:
            if c.token is not None:
                seen.last = time.perf_counter()
                seen.first = seen.first if seen.first is not None else seen.last
                seen.tokens += 1
            if c.finish_reason:
                seen.finish = c.finish_reason
            if c.text:
                sys.stdout.write(c.text)
                sys.stdout.flush()
                out.append(c.text)
    finally:
        chunks.close()  # after Ctrl-C: cancel the request now, not when the generator is collected
        seen.text = "".join(out)
    return seen.text


def _context_full(llm: Any, seen: Seen) -> bool:
    return seen.finish == "length" and seen.prompt_tokens + seen.tokens >= llm.n_ctx


def _rate(n: int, s: float) -> str:
    # under a millisecond the clock says nothing about speed: no 1e6 tokens/s from one token
    return f"{n / s:.1f} tokens/s" if n > 0 and s >= 1e-3 else "- tokens/s"


def _print_timings(llm: Any, seen: Seen) -> None:
    """Prompt and generation speed from the tokens that arrived and the time they took: the prompt up to
    the first token, the generation from the first token to the last (so one token has no rate)."""
    t = getattr(llm, "last_timings", None) or llm.generator.timings
    cached = int(getattr(t, "cached_tokens", 0)) if seen.finish else 0
    computed = seen.prompt_tokens - cached
    note = f" ({cached} from the prefix cache)" if cached else ""
    stopped = "" if seen.finish else " (interrupted)"
    if seen.first is None:
        s = time.perf_counter() - seen.started
        print(f"prompt eval: {seen.prompt_tokens} tokens{note}, {s:.2f} s{stopped}", file=sys.stderr)
        print("generation:  0 tokens", file=sys.stderr)
        return
    prompt_s = seen.first - seen.started
    gen_s = (seen.last or seen.first) - seen.first
    print(
        f"prompt eval: {seen.prompt_tokens} tokens{note}, {prompt_s:.2f} s, {_rate(computed, prompt_s)}\n"
        f"generation:  {seen.tokens} tokens, {gen_s:.2f} s after the first, "
        f"{_rate(seen.tokens - 1, gen_s)}{stopped}",
        file=sys.stderr,
    )
    if getattr(t, "draft_tokens", 0):
        rate = t.draft_accepted / t.draft_tokens
        print(
            f"speculative: {t.draft_tokens} tokens guessed, {t.draft_accepted} kept ({rate:.0%})",
            file=sys.stderr,
        )


HELP = """commands: /bye (or Ctrl-D) exit, /clear forget the conversation, /set temp 0.2 (also top_k, top_p,
min_p, typical_p, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed, n_predict),
/show current settings, \"\"\" starts and ends multi-line input, Ctrl-C stops the current answer; arrow
keys edit the line and recall earlier ones."""


def _line_editing(history_file: Path | None):
    """Line editing and history for input() through readline, where it imports (not on every platform:
    then input() stays plain). History lives for the session and, with `history_file`, across sessions.
    Returns the function that saves it; a file that cannot be read or written is skipped silently."""
    try:
        import readline
    except ImportError:
        return lambda: None
    readline.set_history_length(HISTORY_LINES)
    if history_file is not None:
        try:
            readline.read_history_file(history_file)
        except OSError:
            pass

    def save() -> None:
        if history_file is None:
            return
        try:
            history_file.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history_file)
        except OSError:
            pass

    return save


def _interactive(
    llm: Any,
    system: str | None,
    opts: dict,
    verbose: bool,
    history_file: Path | None = None,
    template_kwargs: dict | None = None,
    cache: PromptCache | None = None,
) -> None:
    save_history = _line_editing(history_file)
    try:
        _chat(llm, system, opts, verbose, template_kwargs, cache)
    finally:
        save_history()


def _chat(
    llm: Any,
    system: str | None,
    opts: dict,
    verbose: bool,
    template_kwargs: dict | None = None,
    cache: PromptCache | None = None,
) -> None:
    history: list[dict[str, str]] = []
    print(f">>> chatting with {llm.path.name}; /? for help", file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print()
            continue
        if line.strip() == '"""':
            lines = []
            try:
                while (nxt := input("... ")).strip() != '"""':
                    lines.append(nxt)
            except (EOFError, KeyboardInterrupt):
                print()
                continue
            line = "\n".join(lines)
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/bye", "/exit", "/quit"):
            return
        if cmd in ("/?", "/help"):
            print(HELP)
            continue
        if cmd == "/clear":
            history.clear()
            print("(conversation cleared)")
            continue
        if cmd == "/show":
            _show(llm, system, opts)
            continue
        if cmd.startswith("/set"):
            _set(opts, cmd.split()[1:], llm)
            continue
        if cmd.startswith("/"):
            print(f"unknown command {cmd.split()[0]}; /? for help")
            continue
        history.append({"role": "user", "content": line})
        msgs = ([{"role": "system", "content": system}] if system else []) + history
        seen = None
        try:
            ids = llm.chat_prompt(msgs, template_kwargs=template_kwargs)
            seen = Seen(len(ids))
            _print_stream(llm.stream(ids, **opts), seen)
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        except ValueError as e:  # e.g. the conversation outgrew the context
            history.pop()
            print(f"error: {e} (/clear starts over)", file=sys.stderr)
            continue
        print()
        if seen is None:  # interrupted before the answer began
            history.pop()
            continue
        history.append({"role": "assistant", "content": seen.text})
        if cache is not None:
            cache.write(ids)
        if _context_full(llm, seen):
            print(
                f"context full ({llm.n_ctx} tokens): stopped; /clear starts over, or raise -c/--ctx-size",
                file=sys.stderr,
            )
        if verbose:
            _print_timings(llm, seen)


def _show(llm: Any, system: str | None, opts: dict) -> None:
    """/show: every setting in effect, sampling defaults (llama.cpp's, then the file's) included."""
    p = llm.params(**{k: v for k, v in opts.items() if k not in ("max_tokens", "stop", "grammar")})
    n = opts.get("max_tokens")
    rows: list[tuple[str, Any]] = [
        ("model", llm.path.name),
        ("backend", llm.backend.name),
        ("threads", int(getattr(llm.backend, "threads", None) or 1)),
        ("context", f"{llm.n_ctx} tokens"),
        ("n_predict", "-1 (until the end or the context is full)" if n is None else n),
        ("stop", ", ".join(map(repr, opts.get("stop") or ())) or "none"),
        ("constraint", opts["grammar"].kind if opts.get("grammar") else "none"),
    ]
    for f in fields(p):
        v = getattr(p, f.name)
        if v is None:
            v = "random" if f.name == "seed" else "none"
        rows.append((f.name, dict(v) if f.name == "logit_bias" and v != "none" else v))
    rows += [("system", repr(system) if system else "none"), ("template", _template_label(llm, raw=False))]
    for k, v in rows:
        print(f"  {k:<18} {v}")


def _n_predict(value: str) -> int | None:
    n = int(value)
    if n != -1 and n < 1:
        raise ValueError(
            f"n_predict {n}: give a number of tokens, or -1 (until the end or the context is full)"
        )
    return None if n == -1 else n


_SETTABLE = {
    "temp": ("temperature", float),
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "typical_p": ("typical_p", float),
    "repeat_penalty": ("repeat_penalty", float),
    "repeat_last_n": ("repeat_last_n", int),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "seed": ("seed", int),
    "n_predict": ("max_tokens", _n_predict),
    "min_keep": ("min_keep", int),
    "top_n_sigma": ("top_n_sigma", float),
    "xtc_probability": ("xtc_probability", float),
    "xtc_threshold": ("xtc_threshold", float),
    "dynatemp_range": ("dynatemp_range", float),
    "dynatemp_exponent": ("dynatemp_exponent", float),
    "dry_multiplier": ("dry_multiplier", float),
    "dry_base": ("dry_base", float),
    "dry_allowed_length": ("dry_allowed_length", int),
    "dry_penalty_last_n": ("dry_penalty_last_n", int),
    "mirostat": ("mirostat", int),
    "mirostat_tau": ("mirostat_tau", float),
    "mirostat_eta": ("mirostat_eta", float),
}


def _set(opts: dict, args: list[str], llm: Any) -> None:
    if len(args) != 2 or args[0] not in _SETTABLE:
        print(f"usage: /set NAME VALUE with NAME one of {', '.join(_SETTABLE)}")
        return
    key, conv = _SETTABLE[args[0]]
    try:
        value = conv(args[1])
        trial = dict(opts, **{key: value})
        llm.params(**{k: v for k, v in trial.items() if k not in ("max_tokens", "stop", "grammar")})
    except ValueError as e:
        print(f"invalid value: {e}")
        return
    opts[key] = value
    print(f"set {key} = {value}")
