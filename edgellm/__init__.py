"""edgellm: CPU- and edge-first quantized LLM inference for GGUF models."""
