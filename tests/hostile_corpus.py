"""Texts that break tokenizer conversions and alignment code: each line is one trap, kept short so a
failure names it. `hostile_texts(tokenizers)` adds every tokenizer's own special-token strings, which
must come back as plain text."""

from __future__ import annotations

HOSTILE = [
    # English, with the contractions byte-level split regexes treat specially
    "The quick brown fox jumps over the lazy dog. It's what they'd've said; I'M SURE you'LL agree.",
    "Unbelievable, antidisestablishmentarianism! Ouagadougou & Antananarivo... (really?) — yes.",
    # code
    'def area(r):\n\treturn 3.14159 * r ** 2  # <b>code</b> & "quotes"\n',
    "for (let i = 0; i < n; i++) { console.log(`${i}`); }\r\n",
    '{"key": [1, 2.5e-10, null], "nested": {"a": "b\\n"}}',
    "SELECT * FROM t WHERE x <> 'O''Brien' -- comment",
    "    if x:\n        pass\n\n\n    else:\n\t\tcontinue",
    # numbers
    "1234567890 12,345,678.90 3.14159265358979 -0.0001 1e-9 0x1F 007 ½ ² ³ ٣٤٥ 一二三",
    "On 2024-02-29 at 23:59:59.999, $1,000,000 (10%) was +/-5.",
    # CJK and other scripts
    "東京は日本の首都です。中文分词测试。한국어 텍스트입니다。",
    "Москва — столица России. Ελληνικά γράμματα. नमस्ते दुनिया. สวัสดีชาวโลก",
    # words that are one Llama 3 piece although its merges alone would split them (ignore_merges)
    "Tiếng Việt: việc này hợp lý, nhiều điều ngoài tự nhiên. Türkçe: değiş, geliyor mektedir. فارسی: ایران",
    # emoji, ZWJ sequences, skin tones, flags, keycaps, variation selectors
    "😀👍🏽 👩‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇫🇷 1️⃣ #️⃣ ❤️ ☺︎ 🧑🏿‍🚀",
    "𓀀 ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🀄 \U0010fffd \ue000",
    # combining marks: decomposed accents, stacked marks, Indic vowel signs
    "cafe\u0301 nai\u0308ve Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307"
    "l\u036e\u0312\u036bo\u0328\u0317\u033b\u030a",
    "\u0301 starts with a combining mark; e\u0301\u0301\u0301\u0301\u0301 many",
    # right-to-left text, bidi marks
    "مرحبا بالعالم. שלום עולם! abc אבג 123 \u200fRTL mark\u200e \u202eoverride\u202c",
    # control and invisible characters
    "\x00null \x07bell \x1b[31mred\x1b[0m \x7fdel \x0bvtab \x0cff \x85nel",
    "zero\u200bwidth\u200cnon\u200djoiner \ufeffBOM \u2028line\u2029para \u00a0nbsp \u3000ideographic",
    # long whitespace runs
    " " * 40 + "x" + "\t" * 9 + "y" + "\n" * 12 + "z",
    "  \t \n  \r\n \u00a0 \n\n\n   ",
    " leading and trailing spaces ",
    # strings that look like pieces of a vocabulary, as plain text
    "<0x41> <0xE2><0x80> ▁▁under ĠG ĊĠ <unk> <s></s> <|endoftext|> <|im_start|> <pad> [INST] <<SYS>>",
]


def special_strings(tokenizers) -> list[str]:
    """The special and added token strings of the given tokenizers, from their own metadata (the first
    300 added tokens of each: Gemma 3 has 6,384, nearly all <unusedN>)."""
    strings: dict[str, None] = {}
    for tokenizer in tokenizers:
        strings.update(dict.fromkeys(tokenizer.all_special_tokens))
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        strings.update(dict.fromkeys(str(token) for token in list(added.values())[:300]))
    return [s for s in strings if s]


def hostile_texts(tokenizers=()) -> list[str]:
    """The corpus, plus lines made of the tokenizers' own special-token strings in running text."""
    specials = special_strings(tokenizers)
    lines = [" ".join(specials[i : i + 20]) + " and text" for i in range(0, len(specials), 20)]
    return HOSTILE + lines
