"""FedPrompt's Table II arithmetic from shapes alone (meta-device models, no weights): the soft prompt's share of
full fine-tuning's communication (m = 20, d = 768), and the full models' parameter counts."""

from __future__ import annotations

import pytest
import torch
from transformers import (BertConfig, BertForMaskedLM, RobertaConfig, RobertaForMaskedLM, T5Config,
                          T5ForConditionalGeneration)


def _count(model_cls, config) -> int:
    with torch.device("meta"):
        model = model_cls(config)
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


@pytest.mark.parametrize("model_cls, config, full, ratio", [
    (BertForMaskedLM, BertConfig(), 109_514_298, 0.014),
    (RobertaForMaskedLM, RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1),
     124_697_433, 0.013),
    (T5ForConditionalGeneration, T5Config(d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12,
                                          num_heads=12, vocab_size=32128), 222_903_552, 0.007),
])
def test_table_ii_ratio_of_a_20_token_prompt_to_full_fine_tuning(model_cls, config, full, ratio):
    prompt = 20 * 768
    assert _count(model_cls, config) == full
    assert round(100 * prompt / (full + prompt), 3) == pytest.approx(ratio, abs=0.0015)
