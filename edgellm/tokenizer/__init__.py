"""Tokenizers for GGUF vocabularies, giving exactly llama.cpp's token ids (gpt2 BPE, llama SentencePiece)."""

from .errors import TokenizerError
from .stream import StreamDecoder
from .tokenizer import Tokenizer, format_tokens

__all__ = ["StreamDecoder", "Tokenizer", "TokenizerError", "format_tokens"]
