"""What a loaded model takes from its own metadata: the end of a chat turn from its template, and an
output layer wider than its tokenizer, on random-weight models built here."""

import pytest
import torch
from tiny_models import char_tokenizer, tiny_model_folder, unigram_tokenizer
from transformers import AutoModelForCausalLM

from safe_engine.contract.events import TextCommitted
from safe_engine.models.loading import load_model
from safe_engine.strategies.decoding import DecodeConfig, decode

TURN_END = "<|turn_done|>"
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}" + TURN_END + "\n{% endfor %}"


def test_the_turn_end_comes_from_the_chat_template(tmp_path):
    tokenizer = unigram_tokenizer([" cat", " sat"])
    tokenizer.add_special_tokens({"additional_special_tokens": [TURN_END]})
    tokenizer.chat_template = TEMPLATE
    lm = load_model(str(tiny_model_folder(tmp_path, tokenizer)))
    assert lm.eos_ids == {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(TURN_END)}


def test_a_template_that_refuses_the_probe_leaves_the_eos_alone(tmp_path):
    tokenizer = unigram_tokenizer([" cat"])
    tokenizer.chat_template = "{{ raise_exception('a system turn is required') }}"
    lm = load_model(str(tiny_model_folder(tmp_path, tokenizer)))
    assert lm.eos_ids == {tokenizer.eos_token_id}


@pytest.fixture(scope="module")
def padded_head(tmp_path_factory):
    """A model whose output layer has 8 rows past its tokenizer, and those rows win every argmax."""
    tokenizer = char_tokenizer()
    folder = tiny_model_folder(tmp_path_factory.mktemp("padded"), tokenizer, extra_rows=8)
    model = AutoModelForCausalLM.from_pretrained(folder)
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        head[: len(tokenizer)] *= 1e-3
        head[len(tokenizer) :: 2] = 10 * torch.randn(4, head.shape[1])
        head[len(tokenizer) + 1 :: 2] = -head[len(tokenizer) :: 2]  # ±w: one of each pair is positive
    model.save_pretrained(folder)
    return folder, len(tokenizer)


def test_rows_past_the_tokenizer_are_never_picked(padded_head):
    folder, size = padded_head
    prompt = torch.tensor([[3, 4, 5]])
    raw = AutoModelForCausalLM.from_pretrained(folder)(prompt).logits[0]
    assert (raw.argmax(-1) >= size).all()  # without the mask, every next token would be unspellable
    lm = load_model(str(folder))
    with torch.inference_mode():
        logits = lm.model(prompt).logits[0]
    assert torch.isinf(logits[:, size:]).all() and torch.isfinite(logits[:, :size]).all()
    events = list(decode([lm], "the cat", DecodeConfig(strategy="single", max_new_tokens=12)))
    ids = [i for e in events if isinstance(e, TextCommitted) for t in e.tokens for i in t.ids]
    assert ids and max(ids) < size
