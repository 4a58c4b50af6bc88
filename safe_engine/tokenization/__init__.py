"""Where tokens sit in a text: byte tables, spans and boundaries of any Hugging Face tokenizer."""
