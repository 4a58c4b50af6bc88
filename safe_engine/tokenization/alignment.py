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
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

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
_BYTE_TO_UNICODE = {b: c for c, b in _UNICODE_TO_BYTE.items()}


def gpt2_chars(raw: bytes) -> str:
    """Bytes in byte-level BPE's printable stand-in characters (what its BPE model reads)."""
    return "".join(_BYTE_TO_UNICODE[b] for b in raw)


def _backend_spec(tokenizer) -> dict | None:
    """The fast tokenizer's pipeline as JSON (None for slow tokenizers)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return None if backend is None else json.loads(backend.to_str())


def _decoder_kind(spec: dict | None) -> str:
    if spec is None:
        return "decode"
    decoder = spec.get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
    if "ByteLevel" in kinds:
        return "byte-level"
    if kinds & {"ByteFallback", "Metaspace", "Replace"}:
        return "sentencepiece"
    return "decode"


def _without_dummy_prefix(part: dict | None) -> tuple[dict | None, bool]:
    """A normalizer or pre-tokenizer without SentencePiece's dummy "▁" prefix, and whether it had one."""
    if not part:
        return part, False
    kind = part.get("type")
    if kind == "Prepend" and part.get("prepend") == "▁":
        return None, True
    if kind == "Metaspace":
        scheme = part.get("prepend_scheme", "always" if part.get("add_prefix_space", True) else "never")
        if scheme != "never":
            return {k: v for k, v in part.items() if k != "add_prefix_space"} | {"prepend_scheme": "never"}, True
    if kind == "Sequence":
        key = "normalizers" if "normalizers" in part else "pretokenizers"
        parts = [_without_dummy_prefix(p) for p in part[key]]
        return part | {key: [p for p, _ in parts if p is not None]}, any(had for _, had in parts)
    return part, False


def _reading_spec(spec: dict) -> tuple[dict, bool]:
    """The pipeline that reads a response, and whether it differs from `spec`: tokenizers that put a
    dummy "▁" before every text (Llama 2, Mistral) must not, as a response continues its prompt."""
    normalizer, in_normalizer = _without_dummy_prefix(spec.get("normalizer"))
    pre_tokenizer, in_pre_tokenizer = _without_dummy_prefix(spec.get("pre_tokenizer"))
    return spec | {"normalizer": normalizer, "pre_tokenizer": pre_tokenizer}, in_normalizer or in_pre_tokenizer


def special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens: the named ones and every added token marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {i for i, token in added.items() if getattr(token, "special", False)}


class TokenBytes:
    """The exact bytes each token id stands for, and the reverse lookup for single-token strings."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        spec = _backend_spec(tokenizer)
        self.kind = _decoder_kind(spec)
        self._fast = spec is not None
        self._dummy_prefix = self._fast and _reading_spec(spec)[1]
        self.special_ids = special_ids(tokenizer)
        self.byte_piece_ids: set[int] = set()  # SentencePiece "<0xNN>" byte-fallback pieces
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
                self.byte_piece_ids.add(token_id)
                return bytes([int(match.group(1), 16)])
            return piece.replace("▁", " ").encode("utf-8")
        return self.tokenizer.decode([token_id]).encode("utf-8")

    def __len__(self) -> int:
        return len(self._bytes)

    def read(self, text: str, offsets: bool = False) -> tuple[list[int], list[tuple[int, int]] | None]:
        """Ids (and character offsets) of `text` read as part of a response: no special tokens added,
        special-token strings kept as plain text, no dummy prefix. Raises if the tokenizer refuses it."""
        if not self._fast:
            encoding = self.tokenizer(
                text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=offsets
            )
            return list(encoding["input_ids"]), encoding.get("offset_mapping")
        if not self._dummy_prefix:
            encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=offsets)
            ids = list(encoding["input_ids"])
            if not self.special_ids.intersection(ids):
                return ids, encoding.get("offset_mapping")
        encoding = self._reader.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    @property
    def fast(self) -> bool:
        """A fast (Rust) tokenizer, whose pipeline is known."""
        return self._fast

    def read_many(self, texts: Sequence[str]) -> list[list[int]]:
        """`read`'s ids of many texts, in one batch where the tokenizer is fast. Raises as `read` does."""
        if not self._fast:
            return [self.read(text)[0] for text in texts]
        return [encoding.ids for encoding in self._reader.encode_batch(list(texts), add_special_tokens=False)]

    @cached_property
    def _reader(self):
        """A private copy of the fast tokenizer that reads responses (`read`). Private, because the
        wrapper's switch for special-token strings is shared state that a prompt being encoded in another
        thread would flip; built on first need, because a copy of a large vocabulary costs hundreds of MB."""
        from tokenizers import Tokenizer

        spec, _ = _reading_spec(json.loads(self.tokenizer.backend_tokenizer.to_str()))
        reader = Tokenizer.from_str(json.dumps(spec))
        reader.encode_special_tokens = True  # a response's "<s>" is text the model wrote, not a control token
        reader.no_truncation()
        reader.no_padding()
        return reader

    def __getitem__(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    @cached_property
    def id_of_bytes(self) -> dict[bytes, int]:
        """Single-token lookup. When several ids spell the same bytes, a regular piece wins over a
        byte-fallback piece (Gemma's "<0x32>" comes before its "2"), then the lowest id: the tokenizer
        itself would emit the regular piece, and the model is trained on that.
        """
        table: dict[bytes, int] = {}
        for token_id, raw in enumerate(self._bytes):
            if raw and token_id not in self.special_ids and token_id not in self.byte_piece_ids:
                table.setdefault(raw, token_id)
        for token_id in sorted(self.byte_piece_ids):
            table.setdefault(self._bytes[token_id], token_id)
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
        """Token ids that spell exactly `raw`: one id when the vocabulary has it, else its canonical split.

        Raises ValueError when this vocabulary cannot spell `raw` (unknown characters, missing bytes).
        """
        single = self.id_of_bytes.get(raw)
        if single is not None:
            return [single]
        try:
            ids = tokenize(self, raw).ids
        except Exception as exc:  # the Rust tokenizer raises a bare Exception on unknown characters
            raise ValueError(f"{raw!r} cannot be spelled with this vocabulary: {exc}") from None
        if self.join(ids) != raw:
            raise ValueError(f"{raw!r} cannot be spelled with this vocabulary")
        return ids


_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "→", "\r": "␍"})


def visible(piece: str) -> str:
    """Whitespace made visible: a token that is only spaces, or starts with one, must show it."""
    return piece.translate(_VISIBLE)


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
    """Length of `raw` without a character cut off at its very end (the next token may complete it)."""
    segments = utf8_segments(raw)
    if not segments or segments[-1][2]:
        return len(raw)
    start = segments[-1][0]
    try:
        raw[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            return start
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


def utf8_segments(raw: bytes) -> list[tuple[int, int, bool]]:
    """(start, end, valid) runs of `raw`: valid UTF-8 text, and each ill-formed piece on its own.

    Ill-formed pieces are exactly the ones `bytes.decode(errors="replace")` turns into one U+FFFD.
    """
    out, i = [], 0
    while i < len(raw):
        try:
            raw[i:].decode("utf-8")
            out.append((i, len(raw), True))
            break
        except UnicodeDecodeError as exc:
            if exc.start:
                out.append((i, i + exc.start, True))
            out.append((i + exc.start, i + exc.end, False))
            i += exc.end
    return out


def tokenize(vocab: TokenBytes, text: str | bytes) -> Tokenization:
    """Canonical tokenization (no special tokens) with exact byte spans.

    Models can emit bytes that are not valid UTF-8 (byte-fallback pieces); no tokenizer takes those as
    text, so valid runs are tokenized as text and ill-formed bytes are spelled one byte token each.
    """
    raw = text.encode("utf-8") if isinstance(text, str) else text
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    for start, end, valid in utf8_segments(raw):
        if valid:
            part = _tokenize_text(vocab, raw[start:end].decode("utf-8"))
            ids += part.ids
            spans += [(s + start, e + start) for s, e in part.spans]
            continue
        for offset in range(start, end):
            token_id = vocab.id_of_bytes.get(raw[offset : offset + 1])
            if token_id is not None:  # a vocabulary that cannot spell a byte skips it
                ids.append(token_id)
                spans.append((offset, offset + 1))
    return Tokenization(ids, spans, len(raw))


def _tokenize_text(vocab: TokenBytes, text: str) -> Tokenization:
    raw = text.encode("utf-8")
    try:
        ids, offsets = vocab.read(text, offsets=True)
    except Exception:  # no byte fallback and no unknown token: the Rust tokenizer refuses the text
        return _tokenize_per_character(vocab, text)
    if vocab.join(ids) == raw:
        return Tokenization(ids, vocab.spans(ids), len(raw))
    # A normalizer changed the text (SentencePiece reads a written "▁" as a space): tokens whose bytes
    # are in the text at their place keep exact byte spans (byte-fallback pieces inside a character);
    # the others end where the tokenizer's own character offsets say.
    index, spans, pos = CharIndex(text), [], 0
    for token_id, (_, end_char) in zip(ids, offsets):
        piece = vocab[token_id]
        end = pos + len(piece) if raw.startswith(piece, pos) else max(pos, index.byte_of_char(end_char))
        spans.append((pos, end))
        pos = end
    return Tokenization(ids, spans, len(raw))


def _tokenize_per_character(vocab: TokenBytes, text: str) -> Tokenization:
    """Characters one at a time, skipping those the vocabulary cannot spell (like missing bytes)."""
    ids, spans, pos = [], [], 0
    for ch in text:
        raw = ch.encode("utf-8")
        try:
            part = vocab.read(ch)[0]
        except Exception:
            part = []
        if vocab.join(part) == raw:
            ids += part
            spans += vocab.spans(part, pos)
        pos += len(raw)
    return Tokenization(ids, spans, pos)


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

    @classmethod
    def of_bytes(cls, raw: bytes) -> CharIndex:
        """Index of bytes that may hold ill-formed UTF-8: each ill-formed piece is one U+FFFD character."""
        index = cls(raw.decode("utf-8", errors="replace"))
        starts = []
        for start, end, valid in utf8_segments(raw):
            if valid:
                starts += [start + s for s in cls(raw[start:end].decode("utf-8"))._char_starts[:-1]]
            else:
                starts.append(start)
        index._char_starts = starts + [len(raw)]
        return index

    def char_of_byte(self, offset: int) -> int:
        return bisect.bisect_right(self._char_starts, offset) - 1

    def byte_of_char(self, offset: int) -> int:
        return self._char_starts[min(offset, len(self._char_starts) - 1)]

    def char_span(self, start: int, end: int) -> tuple[int, int]:
        """Characters a byte span touches: a token holding part of a character covers all of it."""
        first = self.char_of_byte(start)
        return first, self.char_of_byte(end - 1) + 1 if end > start else first

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
