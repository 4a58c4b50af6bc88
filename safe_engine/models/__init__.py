"""Model specs, loading (embedded GGUF, folders, hub ids), CPU linear layers, placement and the model cache."""
