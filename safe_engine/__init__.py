"""SAFE engine: token-level ensembling of LLMs with different tokenizers (no UI imports here)."""
