"""Where tokens sit in a text: byte spans for any HF tokenizer, boundary sets, SAFE's OOV-like test.

Everything is aligned on the UTF-8 *bytes* of the response text. Bytes are what both BPE families
really emit (GPT-2 byte-level `Ġ` pieces, SentencePiece `▁` pieces and `<0xNN>` byte fallback), so a
token that ends inside a multi-byte character still has an exact position, and comparing two
tokenizations needs no decode-and-compare of prefixes. Character offsets are derived at the edge,
for events and display (`CharIndex`).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

EOS_KEY = "<eos>"
"""Union key shared by every model's end-of-sequence tokens, so models can agree to stop."""

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-in chars of byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[chr(b)] = b
        else:
            mapping[chr(256 + extra)] = b
            extra += 1
    return mapping


_UNICODE_TO_BYTE = _gpt2_unicode_to_byte()


def _decoder_kind(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "decode"
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
    if "ByteLevel" in kinds:
        return "byte-level"
    if kinds & {"ByteFallback", "Metaspace", "Replace"}:
        return "sentencepiece"
    return "decode"


class TokenBytes:
    """The exact bytes each token id stands for, and the reverse lookup for single-token strings."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.kind = _decoder_kind(tokenizer)
        self.special_ids = set(tokenizer.all_special_ids)
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.special_ids |= {i for i, tok in added.items() if getattr(tok, "special", False)}
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self._bytes = [self._piece_bytes(i, p) for i, p in enumerate(pieces)]

    def _piece_bytes(self, token_id: int, piece: str | None) -> bytes:
        if token_id in self.special_ids or piece is None:
            return b""
        if self.kind == "byte-level":
            try:
                return bytes(_UNICODE_TO_BYTE[c] for c in piece)
            except KeyError:  # an added token stored as plain text
                return piece.encode("utf-8")
        if self.kind == "sentencepiece":
            match = _BYTE_PIECE.match(piece)
            if match:
                return bytes([int(match.group(1), 16)])
            return piece.replace("▁", " ").encode("utf-8")
        return self.tokenizer.decode([token_id]).encode("utf-8")

    def __len__(self) -> int:
        return len(self._bytes)

    def __getitem__(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    @cached_property
    def id_of_bytes(self) -> dict[bytes, int]:
        """Single-token lookup; the lowest id wins when several ids spell the same bytes."""
        table: dict[bytes, int] = {}
        for token_id, raw in enumerate(self._bytes):
            if raw and token_id not in self.special_ids:
                table.setdefault(raw, token_id)
        return table

    def spans(self, ids: Sequence[int], start: int = 0) -> list[tuple[int, int]]:
        """Byte spans of consecutive tokens laid end to end from byte `start`."""
        out, pos = [], start
        for token_id in ids:
            end = pos + len(self._bytes[token_id])
            out.append((pos, end))
            pos = end
        return out

    def join(self, ids: Sequence[int]) -> bytes:
        return b"".join(self._bytes[i] for i in ids)

    def encode_bytes(self, raw: bytes) -> list[int]:
        """Token ids that spell exactly `raw` (one id when possible, else the tokenizer's own split)."""
        single = self.id_of_bytes.get(raw)
        if single is not None:
            return [single]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            per_byte = [self.id_of_bytes.get(bytes([b])) for b in raw]
            if None in per_byte:
                raise ValueError(f"{raw!r} cannot be spelled with this vocabulary") from None
            return per_byte
        return tokenize(self, text).ids


def display_piece(raw: bytes) -> str:
    """Readable text of a token's bytes: invalid UTF-8 (partial characters) shown as <0xNN>."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out, i = [], 0
    while i < len(raw):
        for width in (4, 3, 2, 1):
            chunk = raw[i : i + width]
            try:
                out.append(chunk.decode("utf-8"))
                i += len(chunk)
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<0x{raw[i]:02X}>")
            i += 1
    return "".join(out)


def complete_utf8_prefix(raw: bytes) -> int:
    """Length of the longest prefix of `raw` that does not end inside a multi-byte character."""
    for cut in range(len(raw), max(len(raw) - 4, -1), -1):
        try:
            raw[:cut].decode("utf-8")
            return cut
        except UnicodeDecodeError as exc:
            if exc.start < cut - 3:  # invalid bytes earlier on: not a truncation problem
                return len(raw)
    return len(raw)


@dataclass
class Tokenization:
    """One tokenizer's canonical tokenization of a text, placed on the text's bytes."""

    ids: list[int]
    spans: list[tuple[int, int]]
    length: int  # bytes of text covered

    @cached_property
    def boundaries(self) -> frozenset[int]:
        return frozenset([0] + [end for _, end in self.spans])

    @cached_property
    def _start_index(self) -> dict[int, int]:
        return {start: i for i, (start, end) in enumerate(self.spans) if end > start}

    def token_starting_at(self, offset: int) -> int | None:
        """Index of the token that begins at byte `offset`, if a token boundary is there."""
        return self._start_index.get(offset)


def tokenize(vocab: TokenBytes, text: str) -> Tokenization:
    """Canonical tokenization of `text` (no special tokens), with exact byte spans."""
    raw = text.encode("utf-8")
    encoding = vocab.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoding["input_ids"])
    joined = vocab.join(ids)
    if joined == raw:
        return Tokenization(ids, vocab.spans(ids), len(raw))
    if joined == b" " + raw:  # SentencePiece dummy prefix: the first piece carries an extra space
        spans = [(max(s - 1, 0), e - 1) for s, e in vocab.spans(ids)]
        return Tokenization(ids, spans, len(raw))
    # Normalizers that change the text: fall back to the tokenizer's own character offsets.
    index = CharIndex(text)
    spans = [(index.byte_of_char(s), index.byte_of_char(e)) for s, e in encoding["offset_mapping"]]
    return Tokenization(ids, spans, len(raw))


@dataclass
class CharIndex:
    """Converts byte offsets of a UTF-8 text to character offsets (mid-character → that character)."""

    text: str
    _char_starts: list[int] = field(init=False)

    def __post_init__(self):
        starts, pos = [], 0
        for ch in self.text:
            starts.append(pos)
            pos += len(ch.encode("utf-8"))
        starts.append(pos)
        self._char_starts = starts

    def char_of_byte(self, offset: int) -> int:
        return bisect.bisect_right(self._char_starts, offset) - 1

    def byte_of_char(self, offset: int) -> int:
        return self._char_starts[min(offset, len(self._char_starts) - 1)]

    def is_char_boundary(self, offset: int) -> bool:
        i = bisect.bisect_left(self._char_starts, offset)
        return i < len(self._char_starts) and self._char_starts[i] == offset


def oov_like(spans: Sequence[tuple[int, int]], other: Tokenization) -> list[bool]:
    """SAFE's test: token j is OOV-like for `other` iff the byte where it ends is not a boundary there."""
    return [end not in other.boundaries for _, end in spans]


def shared_boundaries(tokenizations: Sequence[Tokenization]) -> frozenset[int]:
    common = tokenizations[0].boundaries
    for tok in tokenizations[1:]:
        common = common & tok.boundaries
    return common
