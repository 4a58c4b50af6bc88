"""The engine's contract: typed values and stable codes every layer above speaks (config, events,
reasons, errors). Imports nothing else of the engine."""
