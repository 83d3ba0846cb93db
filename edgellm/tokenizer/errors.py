"""The one exception the tokenizer raises for files it cannot tokenize (unknown model, pre-tokenizer, …)."""


class TokenizerError(ValueError):
    """A GGUF vocabulary this tokenizer does not support, or one that is inconsistent."""
