"""UI pieces of SAFE Ensemble Studio. They only consume engine events (as dicts, the JSONL form)."""
