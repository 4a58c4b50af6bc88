"""Forward passes for many runs at once: per-run KV slots, the batching scheduler, one model's session."""
