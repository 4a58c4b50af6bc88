"""Scripted causal LMs: hand-written next-token distributions per context, over tiny real tokenizers.

A scripted model is a real `LoadedModel` that the engine drives like any other (its KV slot holds the
token ids it has seen, so batching, rollback and memoised logits run for real); only its distributions
are written by hand. That pins each SAFE rule in a decode-level test with exact probabilities.

    table = {"": {"Inc": 1.0}, "Inc": {"orr": 1.0}, ...}   # response text so far -> next-token probabilities

Keys are the response text (str, or bytes where it ends inside a character); values map a token of
that model's vocabulary (str, bytes for a byte piece, EOS or another special token such as "<unk>") to
its probability. Listed probabilities
that sum to 1 leave every other token at exactly 0; the rest of the mass is otherwise spread evenly.
A context missing from the table ends the response (EOS with probability 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import SimpleNamespace

import torch
from tiny_models import EOS, unigram_tokenizer

from safe_engine.models.loading import LoadedModel, local_model
from safe_engine.models.specs import ResolvedSpec
from safe_engine.tokenization.alignment import TokenBytes

Table = Mapping[str | bytes, Mapping[str | bytes, float]]


class ScriptedLM(torch.nn.Module):
    def __init__(self, tokenizer, prompt: str, table: Table):
        super().__init__()
        self.vocab = TokenBytes(tokenizer)
        self.eos_id = tokenizer.eos_token_id
        self.specials = {t: tokenizer.convert_tokens_to_ids(t) for t in tokenizer.all_special_tokens}
        self.prompt = prompt.encode("utf-8")
        self.table = table
        self.config = SimpleNamespace(max_position_embeddings=4096)
        self.contexts: list[list[int]] = []  # every context a distribution was asked for (tests read it)

    def forward(self, input_ids, slot_batch, logits_to_keep, **_):
        contexts = []  # per packed position: the ids its row has seen up to it
        for row in slot_batch.rows:
            new = input_ids[0, row.begin : row.end].to(torch.float32).view(1, -1, 1)
            seen = row.slot.write(0, new, new, row.offset)[0].flatten().long().tolist()  # the slot holds the ids
            contexts += [seen[: row.offset + p + 1] for p in range(row.count)]
        rows = [self.next_logits(contexts[p]) for p in logits_to_keep.tolist()]
        return SimpleNamespace(logits=torch.stack(rows)[None])

    def next_logits(self, ids: list[int]) -> torch.Tensor:
        self.contexts.append(ids)
        raw = self.vocab.join(ids)
        assert raw.startswith(self.prompt), "a scripted model only answers its own prompt"
        response = raw[len(self.prompt) :]
        try:
            key: str | bytes = response.decode("utf-8")
        except UnicodeDecodeError:
            key = response
        probs = self.table.get(key, {EOS: 1.0})
        logits = torch.full((len(self.vocab),), -math.inf)
        for token, p in probs.items():
            logits[self.token_id(token)] = math.log(p) if p > 0 else -math.inf
        rest = 1.0 - sum(probs.values())
        if rest > 1e-9:
            others = logits == -math.inf
            logits[others] = math.log(rest / int(others.sum()))
        return logits

    def token_id(self, token: str | bytes) -> int:
        if token == EOS:
            return self.eos_id
        if token in self.specials:
            return self.specials[token]
        raw = token if isinstance(token, bytes) else token.encode("utf-8")
        if raw not in self.vocab.id_of_bytes:
            raise KeyError(f"{token!r} is not one token of this scripted model's vocabulary")
        return self.vocab.id_of_bytes[raw]


def scripted(name: str, pieces: list[str], table: Table, prompt: str) -> LoadedModel:
    """A scripted model whose vocabulary holds `pieces` (longer pieces win, like a trained tokenizer)."""
    return scripted_over(name, unigram_tokenizer(pieces), table, prompt)


def scripted_over(name: str, tokenizer, table: Table, prompt: str) -> LoadedModel:
    """A scripted model over any tokenizer (a byte-level BPE, say)."""
    model = ScriptedLM(tokenizer, prompt, table)
    spec = ResolvedSpec(f"scripted:{name}", "folder", name)
    return local_model(
        spec,
        model,
        tokenizer,
        "cpu",
        torch.float32,
        use_chat_template=False,
        eos_ids=frozenset({tokenizer.eos_token_id}),
    )
