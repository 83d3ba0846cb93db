"""`edgellm run`: one answer streamed to stdout, or an interactive chat on a TTY (like `ollama run`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from edgellm import store


class RunError(ValueError):
    pass


def _split_model_and_prompt(model: str | None, prompt_pos: str | None, prompt_opt: str | None):
    """`run [MODEL] [PROMPT]` plus `-p`: the first positional must be a model, never a prompt in disguise."""
    if model is not None and store.spec_for(model) is None and not Path(model).expanduser().is_file():
        cached = store.models_dir() / model
        if not cached.is_file():
            raise RunError(
                f"{model!r} is neither a known model ({', '.join(store.REGISTRY)}) nor a file; "
                f"to use the default model with a prompt, write: edgellm run -p {model!r}"
            )
    if prompt_pos is not None and prompt_opt is not None:
        raise RunError("give the prompt once: either as the second argument or with -p/--prompt")
    return model, prompt_pos if prompt_pos is not None else prompt_opt


def run(
    model: str | None = typer.Argument(None, help="Model alias or .gguf path (default: smollm2-135m)."),
    prompt_arg: str | None = typer.Argument(None, metavar="[PROMPT]", help="Prompt (or use -p)."),
    prompt: str | None = typer.Option(None, "-p", "--prompt", help="Prompt text."),
    file: Path | None = typer.Option(None, "-f", "--file", help="Read the prompt from a file."),
    raw: bool = typer.Option(False, "--raw", help="Plain completion: no chat template."),
    system: str | None = typer.Option(None, "-s", "--system", help="System message."),
    n_predict: int = typer.Option(512, "-n", "--n-predict", help="Maximum tokens to generate."),
    ctx_size: int | None = typer.Option(
        None, "-c", "--ctx-size", help="Context size (default: min(4096, model's))."
    ),
    threads: int | None = typer.Option(None, "-t", "--threads", help="CPU threads."),
    temp: float | None = typer.Option(None, "--temp", help="Temperature (0 = greedy; default 0.8)."),
    top_k: int | None = typer.Option(None, "--top-k"),
    top_p: float | None = typer.Option(None, "--top-p"),
    min_p: float | None = typer.Option(None, "--min-p"),
    repeat_penalty: float | None = typer.Option(None, "--repeat-penalty"),
    repeat_last_n: int | None = typer.Option(None, "--repeat-last-n"),
    seed: int | None = typer.Option(None, "--seed", help="RNG seed (same seed, same text)."),
    stop: list[str] | None = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    backend: str = typer.Option("auto", "--backend", help="auto, reference, ..."),
    chat_template: str | None = typer.Option(None, "--chat-template", help="Built-in name or .jinja file."),
    no_mmap: bool = typer.Option(False, "--no-mmap", help="Read the file into memory instead of mapping it."),
    mlock: bool = typer.Option(False, "--mlock", help="Lock the model in RAM (needs the privilege)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print load time and tokens/s."),
) -> None:
    """Answer a prompt (streamed), or chat interactively when no prompt is given on a terminal."""
    from edgellm.llm import LLM

    model, text = _split_model_and_prompt(model, prompt_arg, prompt)
    if file is not None:
        if text is not None:
            raise RunError("give the prompt once: -f FILE or a prompt, not both")
        text = file.read_text(encoding="utf-8")
    elif text is None and not sys.stdin.isatty():
        text = sys.stdin.read()

    def log(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    llm = LLM(
        model,
        backend=backend,
        threads=threads,
        n_ctx=ctx_size,
        chat_template=chat_template,
        use_mmap=not no_mmap,
        log=log,
    )
    if mlock:
        _mlock(llm)
    if verbose:
        log(f"loaded {llm.path.name} in {llm.load_s:.2f} s (backend {llm.backend.name}, ctx {llm.n_ctx})")
        log(f"chat template: {llm.template.name} ({llm.template.reason})")
    sampling = dict(
        temperature=temp,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repeat_penalty=repeat_penalty,
        repeat_last_n=repeat_last_n,
        seed=seed,
    )
    llm.params(**sampling)  # validate flags before any work
    opts = dict(max_tokens=n_predict, stop=stop or None, **sampling)
    if text is None:
        _interactive(llm, system, opts, verbose)
        return
    if raw:
        chunks = llm.stream(text, **opts)
    else:
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}
        ]
        chunks = llm.chat_stream(msgs, **opts)
    _print_stream(chunks)
    print()
    if verbose:
        _print_timings(llm)


def _print_stream(chunks) -> str:
    out = []
    for c in chunks:
        if c.text:
            sys.stdout.write(c.text)
            sys.stdout.flush()
            out.append(c.text)
    return "".join(out)


def _print_timings(llm: Any) -> None:
    t = llm.generator.timings
    print(
        f"prompt eval: {t.prompt_tokens} tokens, {t.prompt_s:.2f} s, {t.prompt_tps:.1f} tokens/s\n"
        f"generation:  {t.generated_tokens} tokens, {t.generation_s:.2f} s, {t.generation_tps:.1f} tokens/s",
        file=sys.stderr,
    )


HELP = """commands: /bye (or Ctrl-D) exit, /clear forget the conversation, /set temp 0.2 (also top_k, top_p,
min_p, repeat_penalty, seed, n_predict), /show current settings, \"\"\" starts and ends multi-line input,
Ctrl-C stops the current answer."""


def _interactive(llm: Any, system: str | None, opts: dict, verbose: bool) -> None:
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
            shown = {k: v for k, v in opts.items() if v is not None}
            print(f"model {llm.path.name}, ctx {llm.n_ctx}, template {llm.template.name}, {shown}")
            continue
        if cmd.startswith("/set"):
            _set(opts, cmd.split()[1:], llm)
            continue
        if cmd.startswith("/"):
            print(f"unknown command {cmd.split()[0]}; /? for help")
            continue
        history.append({"role": "user", "content": line})
        msgs = ([{"role": "system", "content": system}] if system else []) + history
        answer = ""
        try:
            answer = _print_stream(llm.chat_stream(msgs, **opts))
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        except ValueError as e:  # e.g. the conversation outgrew the context
            history.pop()
            print(f"error: {e}", file=sys.stderr)
            continue
        print()
        history.append({"role": "assistant", "content": answer})
        if verbose:
            _print_timings(llm)


_SETTABLE = {
    "temp": ("temperature", float),
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "repeat_penalty": ("repeat_penalty", float),
    "seed": ("seed", int),
    "n_predict": ("max_tokens", int),
}


def _set(opts: dict, args: list[str], llm: Any) -> None:
    if len(args) != 2 or args[0] not in _SETTABLE:
        print(f"usage: /set NAME VALUE with NAME one of {', '.join(_SETTABLE)}")
        return
    key, conv = _SETTABLE[args[0]]
    try:
        value = conv(args[1])
        trial = dict(opts, **{key: value})
        llm.params(**{k: v for k, v in trial.items() if k not in ("max_tokens", "stop")})
    except ValueError as e:
        print(f"invalid value: {e}")
        return
    opts[key] = value
    print(f"set {key} = {value}")


def _mlock(llm: Any) -> None:
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    MCL_CURRENT = 1
    if libc.mlockall(MCL_CURRENT) != 0:
        print(f"warning: --mlock failed (errno {ctypes.get_errno()}); continuing unlocked", file=sys.stderr)
