"""The one-time GGUF conversion: the cached folder reproduces the GGUF-loaded model's logits."""

import pytest
import torch

from safe_engine.models.embedded import PROBE_FILE, converted_dir, is_converted

pytestmark = pytest.mark.real_models


@pytest.mark.parametrize("index, name", [(0, "gemma-3-270m"), (1, "smollm2-135m-instruct")])
def test_reload_gives_the_gguf_logits(fp32_pair, index, name):
    lm = fp32_pair[index]  # loaded from the cache folder (converting first if needed), all fp32
    assert is_converted(name)
    probe = torch.load(converted_dir(name) / PROBE_FILE)  # logits taken from the GGUF-loaded model
    with torch.inference_mode():
        logits = lm.model(probe["ids"][None]).logits[0].float()
    torch.testing.assert_close(logits, probe["logits"], atol=1e-4, rtol=1e-4)
