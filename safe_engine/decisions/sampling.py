"""Greedy decoding or seeded sampling, the same way for every strategy (the paper's App. H).

Temperature 0 is greedy decoding, the paper's main setting. With a temperature T every model's
distribution is softmax(logits / T); a token is drawn from the top-p nucleus of its distribution. One
generator per run, seeded, draws everything in the order the run asks for it, so the same seed and
settings give the same output from the library, the CLI and the app.
"""

from __future__ import annotations

import secrets

import torch


def fresh_seed() -> int:
    """A seed for a run that was given none; the run reports it so the output can be reproduced."""
    return secrets.randbelow(2**31)


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        self.temperature, self.top_p = temperature, top_p
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits every distribution of the run is taken from (divided by the temperature)."""
        return logits if self.greedy else logits / self.temperature

    def nucleus(self, probs: torch.Tensor) -> torch.Tensor:
        """The distribution a token is drawn from: the smallest top set holding top_p of the mass."""
        if self.top_p >= 1:
            return probs / probs.sum()
        ordered, order = torch.sort(probs, descending=True)
        before = torch.cumsum(ordered, 0) - ordered  # mass of the tokens ranked above each one
        keep = order[before < self.top_p * probs.sum()]
        out = torch.zeros_like(probs)
        out[keep] = probs[keep]
        return out / out.sum()

    def pick(self, probs: torch.Tensor) -> tuple[int, float]:
        """A token index and the probability it was drawn with (greedy: the argmax and its probability).

        `probs` need not sum to one (SAFE's heuristic sharpening does not renormalise).
        """
        if self.greedy:
            index = int(torch.argmax(probs))
            return index, probs[index].item()
        nucleus = self.nucleus(probs)
        index = int(torch.multinomial(nucleus, 1, generator=self.generator))
        return index, nucleus[index].item()

    def accept(self, probability: float) -> bool:
        """True with the given probability (one draw)."""
        return torch.rand((), generator=self.generator).item() < probability
