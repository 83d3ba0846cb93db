"""`edgellm serve`: the OpenAI-compatible server (needs the `serve` extra: FastAPI and uvicorn)."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace
from typing import Any

import typer

from edgellm import reasoning, store
from edgellm.cli_eval import CACHE_OPTIONS, model_option
from edgellm.sampler import SamplingParams


class ServeError(ValueError):
    pass


# the speculative-decoding flags `run` and `serve` share (llama.cpp's names)
SPEC_OPTIONS = {
    "spec_type": lambda: typer.Option(
        "none",
        "--spec-type",
        help="Speculative decoding: none, ngram-simple (prompt lookup; with -md, the draft model guesses "
        "where the lookup finds nothing) or draft.",
    ),
    "model_draft": lambda: typer.Option(
        None,
        "-md",
        "--model-draft",
        "--spec-draft-model",
        help="Draft model (alias or .gguf) with the same vocabulary.",
    ),
    "draft_max": lambda: typer.Option(
        8, "--draft-max", "--spec-draft-n-max", help="Speculative tokens guessed per step at most."
    ),
    "draft_min": lambda: typer.Option(
        1, "--draft-min", "--spec-draft-n-min", help="Fewer guesses found than this: none are tried."
    ),
}

# the model-memory flags `run` and `serve` share (llama.cpp's names and meaning)
MEMORY_OPTIONS = {
    "no_mmap": lambda: typer.Option(
        False, "--no-mmap", help="Read the file into memory instead of mapping it."
    ),
    "mlock": lambda: typer.Option(
        False, "--mlock", help="Lock the model in RAM: never swapped or dropped (RLIMIT_MEMLOCK permitting)."
    ),
}

_D = SamplingParams()  # llama.cpp's defaults, for --help (a model file's general.sampling.* may override)

# the sampling flags `run` and `serve` share (llama.cpp's names): unset, the model's defaults hold
SAMPLING_OPTIONS = {
    "temperature": lambda: typer.Option(
        None, "--temp", help=f"Temperature; 0 = greedy (default {_D.temperature})."
    ),
    "top_k": lambda: typer.Option(
        None, "--top-k", help=f"Sample from the k likeliest tokens; 0 = off (default {_D.top_k})."
    ),
    "top_p": lambda: typer.Option(
        None, "--top-p", help=f"Nucleus: the likeliest tokens up to mass p; 1 = off (default {_D.top_p})."
    ),
    "min_p": lambda: typer.Option(
        None, "--min-p", help=f"Drop tokens under p x the top one's probability (default {_D.min_p})."
    ),
    "typical_p": lambda: typer.Option(
        None, "--typical", help=f"Locally typical sampling; 1 = off (default {_D.typical_p})."
    ),
    "repeat_penalty": lambda: typer.Option(
        None, "--repeat-penalty", help=f"Penalty on repeated tokens; 1 = off (default {_D.repeat_penalty})."
    ),
    "repeat_last_n": lambda: typer.Option(
        None,
        "--repeat-last-n",
        help=f"Tokens the penalties look back over; -1 = all (default {_D.repeat_last_n}).",
    ),
    "presence_penalty": lambda: typer.Option(
        None,
        "--presence-penalty",
        help=f"Penalty on tokens already there; 0 = off (default {_D.presence_penalty}).",
    ),
    "frequency_penalty": lambda: typer.Option(
        None,
        "--frequency-penalty",
        help=f"Penalty by how often a token is there; 0 = off (default {_D.frequency_penalty}).",
    ),
    "seed": lambda: typer.Option(None, "--seed", help="RNG seed: same seed, same text (default: random)."),
    "top_n_sigma": lambda: typer.Option(
        None,
        "--top-nsigma",
        "--top-n-sigma",
        help="Keep logits within n std devs of the top one; <= 0 = off.",
    ),
    "xtc_probability": lambda: typer.Option(
        None, "--xtc-probability", help="XTC: chance of removing the likeliest tokens; 0 = off (default 0)."
    ),
    "xtc_threshold": lambda: typer.Option(
        None,
        "--xtc-threshold",
        help=f"XTC: tokens at or above this probability go; > 0.5 = off ({_D.xtc_threshold}).",
    ),
    "dynatemp_range": lambda: typer.Option(
        None,
        "--dynatemp-range",
        help="Dynamic temperature: temp +- range by the entropy; 0 = off (default 0).",
    ),
    "dynatemp_exponent": lambda: typer.Option(
        None, "--dynatemp-exp", help=f"Dynamic temperature exponent (default {_D.dynatemp_exponent})."
    ),
    "dry_multiplier": lambda: typer.Option(
        None, "--dry-multiplier", help="DRY repetition penalty multiplier; 0 = off (default 0)."
    ),
    "dry_base": lambda: typer.Option(None, "--dry-base", help=f"DRY penalty base (default {_D.dry_base})."),
    "dry_allowed_length": lambda: typer.Option(
        None,
        "--dry-allowed-length",
        help=f"DRY: repeats this long are free (default {_D.dry_allowed_length}).",
    ),
    "dry_penalty_last_n": lambda: typer.Option(
        None,
        "--dry-penalty-last-n",
        help=f"DRY: tokens scanned for repeats; 0 = off, -1 = all (default {_D.dry_penalty_last_n}).",
    ),
    "dry_sequence_breakers": lambda: typer.Option(
        None,
        "--dry-sequence-breaker",
        help='DRY: a repeat never runs across this text (repeatable; replaces \\n : " *; "none": none).',
    ),
    "mirostat": lambda: typer.Option(
        None, "--mirostat", help="Mirostat sampling: 1, 2 (2.0); 0 = off (default 0)."
    ),
    "mirostat_eta": lambda: typer.Option(
        None, "--mirostat-lr", help=f"Mirostat learning rate, eta (default {_D.mirostat_eta})."
    ),
    "mirostat_tau": lambda: typer.Option(
        None, "--mirostat-ent", help=f"Mirostat target entropy, tau (default {_D.mirostat_tau})."
    ),
}


def sampling_flags(**given: Any) -> dict[str, Any]:
    """The sampling flags set on the command line (SAMPLING_OPTIONS' names), checked: one error line names
    a bad value. A seed of -1 is llama.cpp's random."""
    out = {k: v for k, v in given.items() if v is not None and not (k == "seed" and v == -1)}
    if "dry_sequence_breakers" in out:  # llama.cpp's: the flag replaces the defaults; "none" clears them
        out["dry_sequence_breakers"] = tuple(b for b in out["dry_sequence_breakers"] if b != "none")
    for name, v in out.items():
        try:
            replace(_D, **{name: v}).validate()
        except ValueError as e:  # "SamplingParams.<name> must be ...": said with the flag's name
            flag = SAMPLING_OPTIONS[name]().param_decls[0]
            raise ServeError(f"{flag} {str(e).removeprefix(f'SamplingParams.{name} ')}") from None
    return out


# llama.cpp's --spec-type names (a comma-separated list there too) as edgellm's kinds
SPEC_TYPES = {"none": "none", "ngram-simple": "ngram-simple", "draft": "draft", "draft-simple": "draft"}


def spec_config(kind: str, draft_max: int, draft_min: int, model_draft: str | None = None) -> Any:
    """--spec-type/--draft-max/--draft-min/-md as a speculative.SpecConfig (None for none). As llama.cpp's:
    -md alone means a draft model, and --spec-type is a list: ngram-simple with a draft model (-md, and
    draft-simple or not) looks up first and asks the model where the lookup finds nothing. A llama.cpp
    kind edgellm lacks is refused by name; bad values are one error line."""
    from edgellm.speculative import SpecConfig

    names = [k.strip() for k in kind.split(",") if k.strip()] or ["none"]
    unknown = [k for k in names if k not in SPEC_TYPES]
    if unknown:
        raise ServeError(f"--spec-type {','.join(unknown)}: not supported (edgellm has ngram-simple, "
                         "draft-simple/draft and none)")  # fmt: skip
    kinds = {SPEC_TYPES[k] for k in names} - {"none"}
    if "draft" in kinds and not model_draft:
        raise ServeError("--spec-type draft needs a draft model: -md/--model-draft FILE")
    if model_draft:
        kinds.add("draft")
    if not kinds:
        return None
    kind = "ngram-simple" if "ngram-simple" in kinds else "draft"
    try:
        return SpecConfig(kind=kind, model=model_draft, draft_max=draft_max, draft_min=draft_min)
    except ValueError as e:
        raise ServeError(f"--spec-type/--draft-max/--draft-min: {e}") from None


def serve(
    model: str | None = typer.Argument(None, help="Model alias or .gguf path (default: smollm2-135m)."),
    model_opt: str | None = model_option(),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind, or several comma-separated (default: loopback)."
    ),
    port: int = typer.Option(8080, "--port", help="TCP port."),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="EDGELLM_API_KEY", help="Require 'Authorization: Bearer KEY' (env too)."
    ),
    parallel: int = typer.Option(4, "-np", "--parallel", help="Sequences decoded together at most."),
    ctx_size: int | None = typer.Option(
        None, "-c", "--ctx-size", help="Context per sequence (default: min(4096, model's))."
    ),
    kv_budget: str | None = typer.Option(
        None, "--kv-budget", help="KV cache memory: a size (512MiB) or a token count (default: fits)."
    ),
    threads: int | None = typer.Option(None, "-t", "--threads", help="CPU threads."),
    backend: str = typer.Option("auto", "--backend", help="auto, numba, reference, ..."),
    batch_size: int = typer.Option(256, "-b", "--batch-size", help="Tokens per step (prompt chunks)."),
    queue_size: int = typer.Option(64, "--queue-size", help="Requests that may wait before 429."),
    no_prefix_cache: bool = typer.Option(False, "--no-prefix-cache", help="Do not reuse prompt prefixes."),
    chat_template: str | None = typer.Option(None, "--chat-template", help="Built-in name or .jinja file."),
    shutdown_grace: float = typer.Option(
        10.0, "--shutdown-grace", help="Seconds running streams may finish after SIGTERM."
    ),
    alias: str | None = typer.Option(
        None, "--alias", help="Model id reported by /v1/models; several comma-separated: names it answers to."
    ),
    tags: str | None = typer.Option(None, "--tags", help="Comma-separated labels /v1/models lists."),
    log_format: str = typer.Option("text", "--log-format", help="Access log lines: text or json."),
    cors_origins: str | None = typer.Option(
        None,
        "--cors-origins",
        help="Comma-separated origins browsers may call from ('*': any; 'localhost': pages on this machine).",
    ),
    special_in_messages: bool = typer.Option(
        False,
        "--special-in-messages",
        help="Parse control tokens (<|im_end|>...) written in messages, as llama-server does; by default a "
        "message's text can never close its turn or forge another.",
    ),
    header_timeout: float = typer.Option(
        10.0, "--header-timeout", help="Seconds a connection has to send its request headers."
    ),
    reasoning_format: str = typer.Option(
        "auto",
        "--reasoning-format",
        help="A thinking model's <think> reasoning: auto or deepseek (apart, as reasoning_content), none "
        "(left in the content).",
    ),
    reasoning_mode: str = typer.Option(
        "auto",
        "-rea",
        "--reasoning",
        help="Let a thinking model think: on, off (its template's enable_thinking false, and a <think> its "
        "prompt opens closed) or auto (the template's default); a request's chat_template_kwargs win.",
    ),
    reasoning_budget: int = typer.Option(
        -1,
        "--reasoning-budget",
        help="Tokens a thinking model may reason before its </think> is written for it (-1: no limit).",
    ),
    reasoning_budget_message: str = typer.Option(
        "", "--reasoning-budget-message", help="Text written before that </think> (e.g. 'Time to answer.')."
    ),
    sse_ping_interval: int = typer.Option(
        30,
        "--sse-ping-interval",
        help="Seconds a stream may stay silent (a long prompt, a queue) before a keep-alive ping; -1: never.",
    ),
    n_predict: int = typer.Option(
        -1,
        "-n",
        "--n-predict",
        help="Tokens a request generates at most, and what one that names no limit gets (-1: no limit).",
    ),
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
    spec_type: str = SPEC_OPTIONS["spec_type"](),
    model_draft: str | None = SPEC_OPTIONS["model_draft"](),
    draft_max: int = SPEC_OPTIONS["draft_max"](),
    draft_min: int = SPEC_OPTIONS["draft_min"](),
    no_mmap: bool = MEMORY_OPTIONS["no_mmap"](),
    mlock: bool = MEMORY_OPTIONS["mlock"](),
    cache_type_k: str = CACHE_OPTIONS["cache_type_k"](),
    cache_type_v: str = CACHE_OPTIONS["cache_type_v"](),
    warmup: bool = typer.Option(
        True, "--warmup/--no-warmup", help="Run a short generation at load, so the first request is fast."
    ),
    no_webui: bool = typer.Option(False, "--no-webui", help="Do not serve the chat page at /."),
    slots: bool = typer.Option(True, "--slots/--no-slots", help="Serve the read-only GET /slots."),
    slot_save_path: str | None = typer.Option(
        None,
        "--slot-save-path",
        help="A directory for POST /slots/{id}?action=save|restore: a conversation's KV cache saved to "
        "a file and read back (made if missing).",
    ),
    embeddings: bool = typer.Option(
        False, "--embeddings", help="Serve /v1/embeddings, /embedding and /api/embed."
    ),
    pooling: str | None = typer.Option(
        None, "--pooling", help="Embeddings' pooling: mean, cls, last, none (default: the file's, else last)."
    ),
    ray: bool = typer.Option(
        False,
        "--ray",
        help="Serve replicas of the engine on Ray Serve, routed by prompt prefix (edgellm[ray]).",
    ),
    replicas: int | None = typer.Option(
        None, "--replicas", help="With --ray: engine replicas, each -t threads (default: 2)."
    ),
    min_replicas: int | None = typer.Option(
        None, "--min-replicas", help="With --ray: autoscale from this many."
    ),
    max_replicas: int | None = typer.Option(
        None, "--max-replicas", help="With --ray: autoscale up to this many."
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="With --ray: an existing Ray cluster (default: start a local one)."
    ),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API with continuous batching and prefix caching."""
    from edgellm.cli import pick_model

    model = pick_model(model, model_opt)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ServeError(
            f"edgellm serve needs the server extras ({e.name} is missing): pip install 'edgellm[serve]'"
        ) from None
    ray_checks(ray, replicas, min_replicas, max_replicas, ray_address, threads)
    replicas = replicas or 2
    from edgellm.server import ServerConfig, hosts_of, url_of
    from edgellm.server import serve as run_server

    for name, v in (("--parallel", parallel), ("--batch-size", batch_size), ("--port", port + 1)):
        if v <= 0:
            raise ServeError(f"{name} must be positive")
    if queue_size < 0 or shutdown_grace < 0:
        raise ServeError("--queue-size and --shutdown-grace must be >= 0")
    if log_format not in ("text", "json"):
        raise ServeError(f"--log-format must be text or json, not {log_format!r}")
    if pooling is not None and pooling not in ("mean", "cls", "last", "none"):
        raise ServeError(f"--pooling must be mean, cls, last or none, not {pooling!r}")
    if reasoning_format not in reasoning.FORMATS:
        raise ServeError(f"--reasoning-format must be auto, deepseek or none, not {reasoning_format!r}")
    thinking = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False, "auto": None}
    if reasoning_mode not in thinking:
        raise ServeError(f"--reasoning must be on, off or auto, not {reasoning_mode!r}")
    if reasoning_budget < -1:
        raise ServeError("--reasoning-budget must be -1 (no limit) or a number of tokens")
    if not 0 < header_timeout <= 3600:
        raise ServeError("--header-timeout must be in (0, 3600] seconds")
    if n_predict == 0 or n_predict < -1:
        raise ServeError("-n/--n-predict must be a number of tokens, or -1 (no limit)")
    # the sampling flags: this command's parameters named as SAMPLING_OPTIONS' keys
    sampling = sampling_flags(**{k: v for k, v in locals().items() if k in SAMPLING_OPTIONS})
    aliases = tuple(sorted(set(_listed(alias))))
    hosts = hosts_of(host)
    if not hosts:
        raise ServeError("--host: give an address (or several, comma-separated)")
    if ray and len(hosts) > 1:
        raise ServeError("--ray binds one --host address")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    path = store.resolve(model, log=lambda m: print(m, file=sys.stderr, flush=True))
    for h in hosts:
        if h not in ("127.0.0.1", "localhost", "::1") and not api_key:
            print(f"warning: serving on {h} without --api-key", file=sys.stderr)
    if slot_save_path is not None:
        if no_prefix_cache:
            raise ServeError("--slot-save-path restores into the prefix cache: drop --no-prefix-cache")
        try:
            os.makedirs(slot_save_path, exist_ok=True)
        except OSError as e:
            raise ServeError(f"--slot-save-path {slot_save_path}: {e.strerror or e}") from None
    where = ", ".join(url_of(h, port) for h in hosts)
    config = ServerConfig(
        model=str(path),
        backend=backend,
        threads=threads,
        n_ctx=ctx_size,
        parallel=parallel,
        kv_budget=kv_budget,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        batch_tokens=batch_size,
        queue_size=queue_size,
        prefix_cache=not no_prefix_cache,
        chat_template=chat_template,
        api_key=api_key or None,
        shutdown_grace=shutdown_grace,
        model_name=min(aliases) if aliases else None,  # llama-server's: the first of the sorted set
        aliases=aliases,
        tags=_listed(tags),
        reasoning_format=reasoning_format,
        sse_ping_interval=sse_ping_interval,
        enable_thinking=thinking[reasoning_mode],
        reasoning_budget=reasoning_budget,
        reasoning_budget_message=reasoning_budget_message,
        sampling=sampling,
        n_predict=n_predict,
        warmup=warmup,
        log_format=log_format,
        header_timeout=header_timeout,
        special_in_messages=special_in_messages,
        cors_origins=_listed(cors_origins),
        embeddings=embeddings,
        pooling=pooling,
        webui=not no_webui,
        slots=slots,
        slot_save_path=slot_save_path,
        spec=spec_config(spec_type, draft_max, draft_min, model_draft),
        use_mmap=not no_mmap,
        mlock=mlock,
    )

    def ready(state) -> None:
        page = f" (chat page: {url_of(hosts[0], port)}/)" if config.webui else ""
        print(f"edgellm serving {state.model_id} on {where}{page}", file=sys.stderr, flush=True)

    def listening() -> None:  # after the port is bound: a busy port never prints this
        print(
            f"loading {path.name} (listening on {where}; /health is 503 until ready)",
            file=sys.stderr,
            flush=True,
        )

    if ray:
        from edgellm import ray_serve

        def ray_ready(per: int) -> None:
            n = (
                f"{replicas} replicas"
                if min_replicas is None and max_replicas is None
                else "autoscaled replicas"
            )
            name = config.model_name or path.stem
            msg = f"edgellm serving {name} on {where} through Ray Serve ({n} x {per} threads)"
            print(msg, file=sys.stderr, flush=True)

        print(f"starting Ray Serve and loading {path.name} in every replica...", file=sys.stderr, flush=True)
        code = ray_serve.run(
            config, hosts[0], port, replicas, min_replicas, max_replicas, ray_address, ray_ready
        )
    else:
        code = run_server(config, host, port, on_ready=ready, on_listening=listening)
    if code:
        raise typer.Exit(code)


def _listed(text: str | None) -> tuple[str, ...]:
    """A comma-separated flag's items (--alias, --tags)."""
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def ray_checks(
    ray: bool, replicas: int | None, lo: int | None, hi: int | None, address: str | None, threads: int | None
) -> None:
    """--ray and its options: one error line for a bad combination or a missing extra."""
    if not ray:
        given = (
            ("--replicas", replicas),
            ("--min-replicas", lo),
            ("--max-replicas", hi),
            ("--ray-address", address),
        )
        used = [n for n, v in given if v is not None]
        if used:
            raise ServeError(f"{', '.join(used)} needs --ray")
        return
    for name, v in (
        ("--replicas", replicas),
        ("--min-replicas", lo),
        ("--max-replicas", hi),
        ("-t", threads),
    ):
        if v is not None and v <= 0:
            raise ServeError(f"{name} must be positive")
    if lo is not None and hi is not None and lo > hi:
        raise ServeError(f"--min-replicas {lo} is above --max-replicas {hi}")
    try:
        import ray as _ray  # noqa: F401
        from ray import serve as _serve  # noqa: F401
    except ImportError as e:
        raise ServeError(f"--ray needs Ray Serve ({e.name} is missing): pip install 'edgellm[ray]'") from None


__all__ = ["serve"]
