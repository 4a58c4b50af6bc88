"""EVA's vocabulary alignment (Xu et al., NAACL 2024): each token of an assisting model linked to the main
model's tokens it means, learned once per model pair from the models' output embeddings.

The recipe is VecMap's supervised mapping, as EVA runs it: the output-embedding (lm_head) rows of both
models, each normalised (unit length, centred on the shared tokens, unit length again); a seed dictionary of
the tokens the two vocabularies spell with exactly the same bytes; both sides whitened on the dictionary,
rotated onto each other by the SVD of their cross-covariance (which works for different widths: both land in
min(d₁, d₂) dimensions), reweighted by the singular values to the power ½ and de-whitened. Every assisting
token is then linked to its 10 best main tokens by CSLS with a neighbourhood of 1 (2·cos(x, z) minus z's best
cosine to any assisting token), keeping links scoring at least 0.1 and dropping a row that keeps more than 5
links spread by no more than 0.01 (a token close to everything means nothing). End tokens link to the main end
token, and tokens that write no text link to nothing and are linked from nothing (EVA maps ids 0–2 to
themselves, which only holds for related tokenizers); this is applied as the stored alignment is read.

The similarity is computed in blocks of main tokens (the full matrix for 262k × 49k tokens would be 51 GB),
so the whole alignment is a single pass over the main vocabulary. It is built once per pair and kept beside
the converted models (``<cache>/alignments``), named by both models' spec and a fingerprint of their
embeddings.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..contract.errors import ConfigError
from ..tokenization.alignment import EOS_KEY
from .embedded import Progress, build_once, cache_root, stderr_progress
from .loading import LoadedModel

LINKS = 10  # main tokens kept per assisting token (EVA's top-10)
MIN_SCORE = 0.1  # links scoring less are dropped
FLAT_ROW_STD = 0.01  # a row whose kept scores spread no more than this ...
FLAT_ROW_LINKS = 5  # ... and that keeps more links than this is dropped
NEIGHBOURHOOD = 1  # CSLS: the main token's mean cosine to its k nearest assisting tokens
BLOCK_ELEMENTS = 1 << 25  # similarities computed at once (128 MB of float32)
VERSION = 2  # bump when the recipe changes: cached alignments of older versions are not read
_FILE = "alignment.npz"


@dataclass(frozen=True)
class VocabAlignment:
    """For each assisting token (row), the main tokens it links to (`index`) and each link's CSLS weight
    (`weight`, 0 where there is no link). Sparse: [assisting vocabulary, LINKS] each."""

    index: torch.Tensor  # int64
    weight: torch.Tensor  # float32


def normalised(emb: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """VecMap's ``unit center unit``, centred on the `shared` rows (the seed dictionary's) rather than on the
    whole vocabulary: a large multilingual vocabulary's centroid sits among tokens the other model lacks, and
    centring each model on its own centroid leaves the shared tokens offset, every token near a few rare ones."""
    emb = torch.nn.functional.normalize(emb, dim=1)
    emb = emb - emb[shared].mean(0)
    return torch.nn.functional.normalize(emb, dim=1)


def _whitening(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(MᵀM)^(-1/2) and its inverse for the dictionary rows M."""
    _, s, vt = torch.linalg.svd(rows, full_matrices=False)
    s = s.clamp_min(s.max() * 1e-6)
    return vt.T @ torch.diag(1 / s) @ vt, vt.T @ torch.diag(s) @ vt


def supervised_mapping(aux: torch.Tensor, main: torch.Tensor, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both embedding tables mapped into one space (VecMap ``--supervised``: whiten, orthogonal mapping,
    reweight ½, de-whiten); `pairs`: [n, 2] seed dictionary rows (assisting id, main id)."""
    x, z = normalised(aux.double(), pairs[:, 0]), normalised(main.double(), pairs[:, 1])
    xd, zd = x[pairs[:, 0]], z[pairs[:, 1]]
    wx1, wx1_inv = _whitening(xd)
    wz1, wz1_inv = _whitening(zd)
    u, s, vt = torch.linalg.svd((xd @ wx1).T @ (zd @ wz1), full_matrices=False)
    wx2, wz2 = u, vt.T
    scale = s.sqrt()
    xw = (x @ wx1 @ wx2) * scale
    zw = (z @ wz1 @ wz2) * scale
    xw = xw @ (wx2.T @ wx1_inv @ wx2)
    zw = zw @ (wz2.T @ wz1_inv @ wz2)
    return xw.float(), zw.float()


def csls_links(
    aux: torch.Tensor, main: torch.Tensor, progress: Progress | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each assisting row's LINKS best main rows by CSLS (scores, indices; [aux, LINKS] each, best first),
    in one pass over blocks of main rows: a block's similarities give its CSLS penalty and its candidates."""
    x = torch.nn.functional.normalize(aux, dim=1)
    z = torch.nn.functional.normalize(main, dim=1)
    links = min(LINKS, len(z))
    best = torch.full((links, len(x)), float("-inf"))
    best_index = torch.zeros((links, len(x)), dtype=torch.long)
    block = max(1, BLOCK_ELEMENTS // len(x))
    starts = range(0, len(z), block)
    for n, start in enumerate(starts):
        cos = z[start : start + block] @ x.T  # [block main, aux]
        penalty = cos.topk(min(NEIGHBOURHOOD, len(x)), dim=1).values.mean(1)
        scores = 2 * cos - penalty[:, None]
        top = scores.topk(min(links, len(scores)), dim=0)
        merged = torch.cat([best, top.values]).topk(links, dim=0)
        best_index = torch.cat([best_index, top.indices + start]).gather(0, merged.indices)
        best = merged.values
        if progress and (n + 1) % max(1, len(starts) // 10) == 0:
            progress(f"CSLS over the main vocabulary: {min(start + block, len(z))}/{len(z)} tokens")
    return best.T.contiguous(), best_index.T.contiguous()


def filtered(scores: torch.Tensor) -> torch.Tensor:
    """EVA's filters on the CSLS links: the weights kept (0 = dropped)."""
    keep = scores >= MIN_SCORE
    count = keep.sum(1)
    kept = torch.where(keep, scores, torch.zeros(()))
    mean = kept.sum(1) / count.clamp_min(1)
    deviation = torch.where(keep, scores - mean[:, None], torch.zeros(()))
    spread = ((deviation**2).sum(1) / count.clamp_min(1)).sqrt()
    flat = (count > FLAT_ROW_LINKS) & (spread <= FLAT_ROW_STD)
    return torch.where(keep & ~flat[:, None], scores, torch.zeros(()))


def align_embeddings(
    aux: torch.Tensor, main: torch.Tensor, pairs: torch.Tensor, progress: Progress | None = None
) -> VocabAlignment:
    """The alignment of two embedding tables given their seed dictionary (see the module's docstring)."""
    if len(pairs) < 2:
        raise ConfigError("EVA needs tokens the two vocabularies share to align them; these share almost none")
    xw, zw = supervised_mapping(aux, main, pairs)
    scores, index = csls_links(xw, zw, progress)
    return VocabAlignment(index, filtered(scores))


def output_embeddings(lm: LoadedModel) -> torch.Tensor:
    """The model's lm_head rows for its tokenizer's tokens, as float32 on the CPU."""
    head = lm.model.get_output_embeddings() if lm.model is not None else None
    if head is None:
        raise ConfigError(f"EVA aligns the models' output embeddings, and {lm.name} has none in this process")
    if isinstance(getattr(head, "weight", None), torch.Tensor):
        weight = head.weight.detach().float()
    elif hasattr(head, "weight_int8"):  # cpu_linear.Int8WeightLinear
        weight = head.weight_int8.float() * head.scales.float()[:, None]
    else:
        raise ConfigError(f"EVA cannot read the output embeddings of {lm.name} ({type(head).__name__})")
    return weight[: len(lm.vocab)].cpu()


def seed_dictionary(aux: LoadedModel, main: LoadedModel) -> torch.Tensor:
    """(assisting id, main id) of every token both vocabularies spell with the same bytes (first id of each)."""
    main_ids: dict[bytes, int] = {}
    for i in range(len(main.vocab)):
        key = main.key_of(i)
        if isinstance(key, bytes) and key:
            main_ids.setdefault(key, i)
    pairs, seen = [], set()
    for i in range(len(aux.vocab)):
        key = aux.key_of(i)
        if isinstance(key, bytes) and key in main_ids and key not in seen:
            seen.add(key)
            pairs.append((i, main_ids[key]))
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def without_special_tokens(alignment: VocabAlignment, aux: LoadedModel, main: LoadedModel) -> VocabAlignment:
    """No links to or from tokens that write no text, except the end tokens, which link to each other."""
    writes = torch.tensor([_writes_text(main, i) for i in range(len(main.vocab))])
    index = alignment.index.clone()
    weight = torch.where(writes[index], alignment.weight, torch.zeros(()))
    main_eos = min(main.eos_ids) if main.eos_ids else None
    for i in range(len(aux.vocab)):
        if _writes_text(aux, i):
            continue
        weight[i] = 0
        if aux.key_of(i) == EOS_KEY and main_eos is not None:
            index[i, 0], weight[i, 0] = main_eos, 1.0
    return VocabAlignment(index, weight)


def _writes_text(lm: LoadedModel, token: int) -> bool:
    key = lm.key_of(token)
    return isinstance(key, bytes) and bool(key)


def fingerprint(lm: LoadedModel, emb: torch.Tensor) -> str:
    """What identifies a model's alignment inputs: its spec, its vocabulary and a sample of its embeddings."""
    digest = hashlib.sha256(f"{VERSION}|{lm.spec.spec}|{tuple(emb.shape)}".encode())
    digest.update(emb[:: max(1, len(emb) // 512)].numpy().tobytes())
    return digest.hexdigest()[:16]


def vocab_alignment(main: LoadedModel, aux: LoadedModel, progress: Progress | None = None) -> VocabAlignment:
    """The alignment of `aux`'s vocabulary to `main`'s: read from the cache, else built (minutes for a large
    vocabulary, with progress lines) and stored there."""
    progress = progress or stderr_progress
    main_emb, aux_emb = output_embeddings(main), output_embeddings(aux)
    name = f"{aux.name}--to--{main.name}-{fingerprint(aux, aux_emb)}-{fingerprint(main, main_emb)}"
    target = cache_root() / "alignments" / name

    def build(staging: Path) -> str:
        started = time.perf_counter()
        pairs = seed_dictionary(aux, main)
        sizes = f"{aux.name} ({len(aux_emb)} tokens) to {main.name} ({len(main_emb)}), {len(pairs)} shared"
        progress(f"EVA: aligning {sizes}")
        alignment = align_embeddings(aux_emb, main_emb, pairs, lambda line: progress(f"EVA: {line}"))
        np.savez(staging / _FILE, index=alignment.index.int().numpy(), weight=alignment.weight.numpy())
        seconds = time.perf_counter() - started
        linked = int((alignment.weight > 0).any(1).sum())
        summary = {"aux": aux.name, "main": main.name, "seed_pairs": len(pairs), "linked": linked, "seconds": seconds}
        (staging / "summary.json").write_text(json.dumps(summary))
        progress(f"EVA: aligned in {seconds:.0f} s ({linked} of {len(aux_emb)} tokens linked)")
        return json.dumps(summary)

    build_once(f"alignment-{name}", target, build)
    with np.load(target / _FILE) as stored:
        alignment = VocabAlignment(torch.from_numpy(stored["index"]).long(), torch.from_numpy(stored["weight"]))
    return without_special_tokens(alignment, aux, main)
