"""A desktop assistant on edgellm's Python API: the conversation is kept across turns, answers stream as
they are generated, and an answer can be cancelled from another thread (a GUI's Stop button) or, in the
terminal front end below, with Ctrl-C. Offline once the model is cached.

    pip install edgellm
    python examples/desktop_assistant.py [MODEL]        # default smollm2-135m; /reset, Ctrl-D to quit

Embedding it: make one `Assistant`, call `ask(text, on_text)` from a worker thread and `cancel()` from the
UI thread. Each turn costs only its new tokens: the engine's prefix cache keeps the earlier turns.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import edgellm

SYSTEM = "You are a helpful assistant running offline on this computer. Answer briefly."


class Assistant:
    def __init__(self, model: str = "smollm2-135m", system: str = SYSTEM, max_tokens: int = 512, **options):
        """`options` go to edgellm.LLM (backend, threads, n_ctx, ...)."""
        self.llm = edgellm.LLM(model, **options)
        self.system = system
        self.max_tokens = max_tokens
        self.messages: list[dict[str, str]] = []
        self.reset()
        self._cancel = threading.Event()

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def cancel(self) -> None:
        """Stop the answer being generated (safe from any thread); ask() returns what it had so far."""
        self._cancel.set()

    def ask(self, text: str, on_text: Callable[[str], None] = lambda piece: None, **sampling) -> str:
        """One turn: stream the answer to `on_text` piece by piece and return it whole. A cancelled answer
        is kept in the conversation as far as it got, as a chat window shows it."""
        self._cancel.clear()
        self.messages.append({"role": "user", "content": text})
        pieces: list[str] = []
        self.finish_reason = "cancelled"
        stream = self.llm.chat_stream(self.messages, max_tokens=self.max_tokens, **sampling)
        try:
            for chunk in stream:
                if self._cancel.is_set():
                    break
                if chunk.text:
                    pieces.append(chunk.text)
                    on_text(chunk.text)
                if chunk.finish_reason:
                    self.finish_reason = chunk.finish_reason
        finally:
            stream.close()  # leaving the stream early cancels the sequence in the engine
        reply = "".join(pieces)
        self.messages.append({"role": "assistant", "content": reply})
        return reply


def main(argv: list[str]) -> int:
    assistant = Assistant(argv[0] if argv else "smollm2-135m")
    print("Ask anything. Ctrl-C stops an answer, /reset forgets the conversation, Ctrl-D quits.")
    while True:
        try:
            text = input("> ").strip()
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        if not text:
            continue
        if text == "/reset":
            assistant.reset()
            print("(conversation cleared)")
            continue
        worker = threading.Thread(target=assistant.ask, args=(text, lambda p: print(p, end="", flush=True)))
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.1)
        except KeyboardInterrupt:  # Ctrl-C reaches the main thread: stop the answer, keep the session
            assistant.cancel()
            worker.join()
            print(" [stopped]", end="")
        print()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
