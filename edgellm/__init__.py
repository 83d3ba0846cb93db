"""edgellm: CPU- and edge-first quantized LLM inference for GGUF models.

import edgellm
llm = edgellm.LLM("smollm2-135m")
print(llm.chat([{"role": "user", "content": "Hi!"}]).text)
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["LLM", "Completion", "SamplingParams", "__version__"]


def __getattr__(name: str):  # heavy imports only when the API is used, so `edgellm --help` starts fast
    if name in ("LLM", "Completion"):
        from edgellm import llm

        return getattr(llm, name)
    if name == "SamplingParams":
        from edgellm.sampler import SamplingParams

        return SamplingParams
    raise AttributeError(name)
