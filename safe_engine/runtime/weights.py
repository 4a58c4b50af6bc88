"""What the runtime needs of a model whose weights are loaded in this process: a narrow value, not the model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class Weights:
    """The module that computes, the name its errors use, the device its tensors live on, how many ids its
    tokenizer spells (the load probe's ids stay below it) and whether its activations are quantized per pass
    (int8: its logits depend on what shares a pass, so the probe does not compare them)."""

    module: object  # a transformers causal LM (or a test's module with the same forward)
    name: str
    device: str
    tokens: int
    int8: bool = False

    @property
    def vocab_size(self) -> int | None:
        """The rows of the model's head, when its config says (ids past it are refused before a pass)."""
        return getattr(getattr(self.module, "config", None), "vocab_size", None)
