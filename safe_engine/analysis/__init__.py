"""The tokenizer debugger: why tokenizers disagree, on one text or a corpus."""
