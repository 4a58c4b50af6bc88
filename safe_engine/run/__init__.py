"""One decoding run: its state and steps, its participants, forced texts, stop sequences, counters
and the damage measured along it."""
