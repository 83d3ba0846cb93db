#!/usr/bin/env python3
"""Run llama.cpp's own server test suite (tools/server/tests in the llama-cpp-python sdist) against
`edgellm serve`: this stands in for the llama-server binary, translating its flags.

    pip install aiohttp prometheus-client requests wget
    cd vendor/llama.cpp/tools/server/tests
    LLAMA_SERVER_BIN_PATH=/path/to/edgellm/scripts/llama_server_shim.py python -m pytest unit/

The suite downloads small models from Hugging Face (--hf-repo); offline, the shim serves
EDGELLM_SHIM_MODEL (default smollm2-135m) instead, or EDGELLM_SHIM_INFILL_MODEL for the infill preset, so
tests that assert one model's exact text fail here by design. Flags edgellm has no counterpart for
(--no-slots, --jinja, -fa, ...) are dropped and listed on stderr.
"""

from __future__ import annotations

import os
import sys

# llama-server flag -> edgellm serve flag (None: takes a value, dropped; "" : a switch, dropped)
VALUED = {"--port": "--port", "--host": "--host", "--alias": "--alias", "--tags": "--tags",
          "--ctx-size": "-c", "-c": "-c",
          "--parallel": "--parallel", "-np": "--parallel", "--api-key": "--api-key", "--threads": "-t",
          "--batch-size": "-b", "--pooling": "--pooling", "--chat-template": "--chat-template",
          "--chat-template-file": "--chat-template", "--cors-origins": "--cors-origins",
          "--reasoning": "--reasoning", "-rea": "--reasoning", "--reasoning-format": "--reasoning-format",
          "--sse-ping-interval": "--sse-ping-interval", "--reasoning-budget": "--reasoning-budget",
          "--reasoning-budget-message": "--reasoning-budget-message", "--n-predict": "-n", "-n": "-n",
          "--temp": "--temp", "--seed": "--seed", "-s": "--seed", "--top-k": "--top-k", "--top-p": "--top-p",
          "--min-p": "--min-p", "--typical": "--typical", "--repeat-penalty": "--repeat-penalty",
          "--repeat-last-n": "--repeat-last-n", "--presence-penalty": "--presence-penalty",
          "--frequency-penalty": "--frequency-penalty", "--slot-save-path": "--slot-save-path"}  # fmt: skip
# (-c is split between the slots: per_slot)
SWITCHES = {"--embedding": "--embeddings", "--embeddings": "--embeddings", "--no-ui": "--no-webui",
            "--slots": "--slots", "--no-slots": "--no-slots", "--no-warmup": "--no-warmup"}  # fmt: skip


def translate(argv: list[str]) -> tuple[list[str], list[str], dict[str, str]]:
    out, dropped, given = [], [], {}
    i = 0
    while i < len(argv):
        a = argv[i]
        takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if a in VALUED:
            out += [VALUED[a], argv[i + 1]]
            i += 2
        elif a in SWITCHES:
            out.append(SWITCHES[a])
            i += 1
        elif a in ("--model", "-m", "--hf-repo", "--hf-file"):
            given[a] = argv[i + 1]
            i += 2
        else:
            dropped.append(a + (f" {argv[i + 1]}" if takes_value and a.startswith("-") else ""))
            i += 2 if takes_value else 1
    return per_slot(out, "--kv-unified" in argv), dropped, given


def per_slot(args: list[str], unified: bool) -> list[str]:
    """llama-server's -c is the whole KV cache, split between its -np slots (each may use all of it with
    --kv-unified); edgellm's -c is one sequence's context: -c N/np, or -c N with a KV budget of N."""
    if "-c" not in args:
        return args
    i = args.index("-c")
    n_ctx = int(args[i + 1])
    n_slots = int(args[args.index("--parallel") + 1]) if "--parallel" in args else 1
    if unified:
        return [*args, "--kv-budget", str(n_ctx)]
    return [*args[: i + 1], str(max(1, n_ctx // n_slots)), *args[i + 2 :]]


def main() -> None:
    args, dropped, given = translate(sys.argv[1:])
    model = given.get("--model") or given.get("-m")
    if not model:
        infill = "infill" in given.get("--hf-repo", "")
        model = (
            os.environ.get("EDGELLM_SHIM_INFILL_MODEL" if infill else "EDGELLM_SHIM_MODEL") or "smollm2-135m"
        )
    if dropped:
        print(f"llama_server_shim: dropped {' '.join(dropped)}", file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "edgellm", "serve", model, *args]
    os.execv(sys.executable, cmd)


if __name__ == "__main__":
    main()
