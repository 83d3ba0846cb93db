"""Built-in chat templates: llama.cpp's named formats, written as Jinja that renders the same strings.

Each entry mirrors one branch of `llm_chat_apply_template` in llama.cpp's src/llama-chat.cpp (the
`LLM_CHAT_TEMPLATES` names, checked against llama.cpp 0c1e570 by scripts/make_chat_fixtures.py), quirks
included: `trim` there is C `isspace` trimming (ASCII whitespace only, hence `trim(ws)`), the llama2 and
mistral formats ignore `add_generation_prompt`, and none writes BOS: the tokenizer adds it.
"""

from __future__ import annotations

# C isspace(): what llama.cpp's trim() strips. Jinja's bare `trim` would also strip Unicode spaces.
_WS = r"{%- set ws = ' \t\n\v\f\r' -%}"

_CHATML = r"""
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# google/gemma-7b-it: no system role, so system text is merged into the next user turn; assistant is "model".
_GEMMA = (
    _WS
    + r"""
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- set ns.system = ns.system + message['content']|trim(ws) -%}
{%- else -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<start_of_turn>' + role + '\n' -}}
{%- if ns.system and role != 'model' -%}{{- ns.system + '\n\n' -}}{%- set ns.system = '' -%}{%- endif -%}
{{- message['content']|trim(ws) + '<end_of_turn>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}
"""
)


def _headers(start: str, end: str, eot: str) -> str:
    # llama3 / llama4: <start>role<end>\n\n trimmed content <eot>
    return (
        _WS
        + r"""
{%- for message in messages -%}
{{- 'START' + message['role'] + 'END\n\n' + message['content']|trim(ws) + 'EOT' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- 'STARTassistantEND\n\n' -}}{%- endif -%}
""".replace("START", start)
        .replace("END", end)
        .replace("EOT", eot)
    )


def _llama2(system: bool, bos_inside: bool, strip: bool) -> str:
    flags = f"{{%- set support_system, bos_inside, strip = {system}, {bos_inside}, {strip} -%}}".lower()
    return (
        _WS
        + flags
        + r"""
{%- set ns = namespace(inside=true) -%}
{{- '[INST] ' -}}
{%- for message in messages -%}
{%- set content = message['content']|trim(ws) if strip else message['content'] -%}
{%- if not ns.inside -%}
{%- set ns.inside = true -%}{{- '<s>[INST] ' if bos_inside else '[INST] ' -}}
{%- endif -%}
{%- if message['role'] == 'system' -%}
{{- '<<SYS>>\n' + content + '\n<</SYS>>\n\n' if support_system else content + '\n' -}}
{%- elif message['role'] == 'user' -%}
{{- content + ' [/INST]' -}}
{%- else -%}
{{- content + '</s>' -}}{%- set ns.inside = false -%}
{%- endif -%}
{%- endfor -%}
"""
    )


def _mistral(leading: str, trailing: str, trim_assistant: bool) -> str:
    trim = str(trim_assistant).lower()
    flags = f"{{%- set leading, trailing, trim_assistant = '{leading}', '{trailing}', {trim} -%}}"
    return (
        _WS
        + flags
        + r"""
{%- set ns = namespace(inside=false) -%}
{%- for message in messages -%}
{%- if not ns.inside -%}{{- leading + '[INST]' + trailing -}}{%- set ns.inside = true -%}{%- endif -%}
{%- if message['role'] == 'system' -%}
{{- message['content'] + '\n\n' -}}
{%- elif message['role'] == 'user' -%}
{{- message['content'] + leading + '[/INST]' -}}
{%- else -%}
{{- trailing + (message['content']|trim(ws) if trim_assistant else message['content']) + '</s>' -}}
{%- set ns.inside = false -%}
{%- endif -%}
{%- endfor -%}
"""
    )


def _mistral_v7(space: str) -> str:
    return (
        f"{{%- set sp = '{space}' -%}}"
        + r"""
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{{- '[SYSTEM_PROMPT]' + sp + message['content'] + '[/SYSTEM_PROMPT]' -}}
{%- elif message['role'] == 'user' -%}
{{- '[INST]' + sp + message['content'] + '[/INST]' -}}
{%- else -%}
{{- sp + message['content'] + '</s>' -}}
{%- endif -%}
{%- endfor -%}
"""
    )


def _per_role(line: str, generation: str) -> str:
    # formats that write every message the same way: `line` may use role and content
    return (
        r"{%- for message in messages -%}{%- set role, content = message['role'], message['content'] -%}"
        + "{{- "
        + line
        + " -}}{%- endfor -%}"
        + "{%- if add_generation_prompt -%}{{- "
        + repr(generation)
        + " -}}{%- endif -%}"
    )


def _by_role(cases: dict[str, str], generation: str, prefix: str = "") -> str:
    # formats that write system/user/assistant differently and skip other roles
    body = "{%- for message in messages -%}{%- set content = message['content'] -%}"
    for i, (role, expr) in enumerate(cases.items()):
        body += ("{%- if" if i == 0 else "{%- elif") + f" message['role'] == '{role}' -%}}{{{{- {expr} -}}}}"
    body += "{%- endif -%}{%- endfor -%}"
    return prefix + body + "{%- if add_generation_prompt -%}{{- " + repr(generation) + " -}}{%- endif -%}"


_COMMAND_R = _by_role(
    {
        role: f"'<|START_OF_TURN_TOKEN|><|{tok}|>' + content|trim(ws) + '<|END_OF_TURN_TOKEN|>'"
        for role, tok in (("system", "SYSTEM_TOKEN"), ("user", "USER_TOKEN"), ("assistant", "CHATBOT_TOKEN"))
    },
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    prefix=_WS,
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": _CHATML.strip(),
    "gemma": _GEMMA.strip(),
    "llama3": _headers("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>").strip(),
    "llama4": _headers("<|header_start|>", "<|header_end|>", "<|eot|>").strip(),
    "llama2": _llama2(system=False, bos_inside=False, strip=False).strip(),
    "llama2-sys": _llama2(system=True, bos_inside=False, strip=False).strip(),
    "llama2-sys-bos": _llama2(system=True, bos_inside=True, strip=False).strip(),
    "llama2-sys-strip": _llama2(system=True, bos_inside=False, strip=True).strip(),
    "mistral-v1": _mistral(" ", " ", trim_assistant=False).strip(),
    "mistral-v3": _mistral("", " ", trim_assistant=True).strip(),
    "mistral-v3-tekken": _mistral("", "", trim_assistant=False).strip(),
    "mistral-v7": _mistral_v7(" ").strip(),
    "mistral-v7-tekken": _mistral_v7("").strip(),
    "phi3": _per_role(r"'<|' + role + '|>\n' + content + '<|end|>\n'", "<|assistant|>\n"),
    "phi4": _per_role(
        r"'<|im_start|>' + role + '<|im_sep|>' + content + '<|im_end|>'", "<|im_start|>assistant<|im_sep|>"
    ),
    "falcon3": _per_role(r"'<|' + role + '|>\n' + content + '\n'", "<|assistant|>\n"),
    "zephyr": _per_role(r"'<|' + role + '|>\n' + content + '<|endoftext|>\n'", "<|assistant|>\n"),
    "vicuna": _by_role(
        {
            "system": r"content + '\n\n'",
            "user": r"'USER: ' + content + '\n'",
            "assistant": r"'ASSISTANT: ' + content + '</s>\n'",
        },
        "ASSISTANT:",
    ),
    "vicuna-orca": _by_role(
        {
            "system": r"'SYSTEM: ' + content + '\n'",
            "user": r"'USER: ' + content + '\n'",
            "assistant": r"'ASSISTANT: ' + content + '</s>\n'",
        },
        "ASSISTANT:",
    ),
    "deepseek": _by_role(
        {
            "system": "content",
            "user": r"'### Instruction:\n' + content + '\n'",
            "assistant": r"'### Response:\n' + content + '\n<|EOT|>\n'",
        },
        "### Response:\n",
    ),
    "deepseek2": _by_role(
        {
            "system": r"content + '\n\n'",
            "user": r"'User: ' + content + '\n\n'",
            "assistant": r"'Assistant: ' + content + '<｜end▁of▁sentence｜>'",
        },
        "Assistant:",
    ),
    "deepseek3": _by_role(
        {
            "system": r"content + '\n\n'",
            "user": "'<｜User｜>' + content",
            "assistant": "'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'",
        },
        "<｜Assistant｜>",
    ),
    "command-r": _COMMAND_R,
}

# Architectures whose files often lack a template and whose chat format is known (llama.cpp would use ChatML).
ARCH_TEMPLATES: dict[str, str] = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
}
