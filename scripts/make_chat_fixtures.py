"""Render chat conversations with llama.cpp and write them to tests/fixtures/chat/ for tests/test_chat.py.

Oracle: llama.cpp's `llama_chat_apply_template` (src/llama-chat.cpp) through llama-cpp-python's low-level
binding. That function does not run Jinja: it detects a known format from the template text (or takes a
name such as "gemma") and writes the prompt with C++ code. So it is the oracle for the built-in templates
by name, and for a file's template only as far as the detected format matches the file's Jinja (SmolLM2's
template is detected as "chatml", which drops the default system prompt the Jinja inserts; the tests pin
that difference). For the Jinja side the script also records llama-cpp-python's own Jinja2ChatFormatter
(Python jinja2, as Hugging Face renders), which llama-cpp-python uses for GGUF files with a template.

    python scripts/make_chat_fixtures.py [--smollm2 PATH] [--qwen PATH]

Needs llama-cpp-python (see DEVELOPERS.md) and the real models (defaults: /tmp/models/...).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
from pathlib import Path

import llama_cpp

from edgellm.chat import BUILTIN_TEMPLATES
from edgellm.gguf import ModelFile

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "chat"

CONVERSATIONS: dict[str, list[dict[str, str]]] = {
    "single": [{"role": "user", "content": "Hello! Who are you?"}],
    "system_single": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a prime number."},
    ],
    "system_multi": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Good morning"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "Thank you"},
    ],
    # leading/trailing whitespace: llama.cpp trims it (C isspace) in some formats, never inside the text
    "whitespace": [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": "\n  Hi there!\t \n"},
        {"role": "assistant", "content": " Hello. \n"},
        {"role": "user", "content": "Tell me\n\na joke.  "},
    ],
    "unicode": [
        {"role": "user", "content": "Grüße! 你好 🙂\u00a0"},
        {"role": "assistant", "content": "Hallo 👋"},
        {"role": "user", "content": "Ça va ? नमस्ते"},
    ],
    "two_systems": [
        {"role": "system", "content": "Rule one."},
        {"role": "system", "content": "Rule two."},
        {"role": "user", "content": "Go"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Count to three"},
        {"role": "assistant", "content": "1, 2, 3"},
    ],
}


def llama_cpp_apply(tmpl: str, messages: list[dict[str, str]], add_ass: bool) -> str | None:
    """llama_chat_apply_template(tmpl, chat, n, add_ass, buf, len); None when llama.cpp does not know tmpl."""
    chat = (llama_cpp.llama_chat_message * len(messages))()
    keep = []  # the C strings must outlive the call
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        chat[i].role, chat[i].content = role, content
    t = tmpl.encode()
    n = llama_cpp.llama_chat_apply_template(t, chat, len(messages), add_ass, None, 0)
    if n < 0:
        return None
    buf = ctypes.create_string_buffer(n + 1)
    n = llama_cpp.llama_chat_apply_template(t, chat, len(messages), add_ass, buf, n + 1)
    return buf.raw[:n].decode("utf-8")


def jinja_apply(tmpl: str, bos: str, eos: str, messages: list[dict[str, str]], add_ass: bool) -> str:
    """llama-cpp-python's Jinja2ChatFormatter, the path it takes for a GGUF file's template."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    fmt = Jinja2ChatFormatter(template=tmpl, bos_token=bos, eos_token=eos, add_generation_prompt=add_ass)
    return fmt(messages=messages).prompt


def render_all(tmpl: str, jinja: tuple[str, str] | None = None) -> dict:
    out = {}
    for name, msgs in CONVERSATIONS.items():
        entry = {}
        for add_ass in (True, False):
            key = "add_generation_prompt" if add_ass else "no_generation_prompt"
            entry[key] = llama_cpp_apply(tmpl, msgs, add_ass)
            if jinja is not None:
                entry["jinja_" + key] = jinja_apply(tmpl, *jinja, msgs, add_ass)
        out[name] = entry
    return out


def builtin_names() -> list[str]:
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(arr, n)
    return [s.decode() for s in arr]


def model_template(path: str, metadata_only: bool = False) -> tuple[str, str, str]:
    mf = ModelFile(path, metadata_only=metadata_only)
    tokens = mf.get("tokenizer.ggml.tokens")
    bos, eos = (tokens[mf.get(f"tokenizer.ggml.{k}_token_id")] for k in ("bos", "eos"))
    return mf.get("tokenizer.chat_template"), bos, eos


def write(name: str, obj: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", default="/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--qwen", default="/tmp/models/model_part_0000")
    args = ap.parse_args()
    oracle = f"llama-cpp-python {llama_cpp.__version__}: llama_chat_apply_template"
    known = builtin_names()
    missing = [n for n in BUILTIN_TEMPLATES if n not in known]
    if missing:
        raise SystemExit(f"llama.cpp lacks built-in templates {missing}")

    write(
        "builtin.json",
        {
            "oracle": oracle + " (template by name)",
            "llama_cpp_builtin_names": known,
            "conversations": CONVERSATIONS,
            "renders": {name: render_all(name) for name in BUILTIN_TEMPLATES},
        },
    )

    tmpl, bos, eos = model_template(args.smollm2)
    write(
        "smollm2.json",
        {
            "oracle": oracle + " (the GGUF's template text; llama.cpp detects 'chatml' from it) and "
            "llama_cpp.llama_chat_format.Jinja2ChatFormatter (jinja_*)",
            "template_sha256": hashlib.sha256(tmpl.encode()).hexdigest(),
            "bos_token": bos,
            "eos_token": eos,
            "conversations": CONVERSATIONS,
            "renders": render_all(tmpl, jinja=(bos, eos)),
        },
    )

    # The qwen2 / DeepSeek-R1-Distill template, committed as text so tests need not the 95 MB header.
    tmpl, bos, eos = model_template(args.qwen, metadata_only=True)
    (OUT / "deepseek_r1_qwen.jinja").write_text(tmpl, encoding="utf-8")
    write(
        "deepseek_r1_qwen.json",
        {
            "oracle": oracle + " (the GGUF's template text; llama.cpp detects 'deepseek3' from it) and "
            "Jinja2ChatFormatter (jinja_*)",
            "template_file": "deepseek_r1_qwen.jinja",
            "template_sha256": hashlib.sha256(tmpl.encode()).hexdigest(),
            "bos_token": bos,
            "eos_token": eos,
            "conversations": CONVERSATIONS,
            "renders": render_all(tmpl, jinja=(bos, eos)),
        },
    )


if __name__ == "__main__":
    main()
