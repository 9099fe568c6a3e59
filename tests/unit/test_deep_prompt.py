"""The deep-prompt adapter (P-tuning v2 key/value prefixes) in the frozen backbones: shapes, the prefix as a
cache, and positions as the official code numbers them (RoBERTa-style models)."""

from __future__ import annotations

import pytest
import torch

from fedpeft.adapters.deep_prompt import DeepPrompt, DeepPromptSettings, fairseq_padding_idx, kv_geometry


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
def test_deep_prompt_changes_outputs_and_masked_prefix_is_a_no_op(tiny_cfg, model):
    from fedpeft.backbones.loading import load_backbone

    bb = load_backbone(model)
    layers, kv_heads, head_dim = kv_geometry(bb)
    ad = DeepPrompt(DeepPromptSettings(num_tokens=3, init_std=1.0, shift_positions=False))
    params = ad.init(bb, torch.Generator().manual_seed(0))
    assert sorted(params) == [f"prefix.{l}" for l in range(layers)]
    assert all(v.shape == (3, 2, kv_heads * head_dim) for v in params.values())
    ids = torch.randint(1000, 2000, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 6, dtype=torch.long)
    prep = ad.prepare(bb, params, ids, mask, 1)
    assert prep.attention_mask.shape == (2, 6) and prep.extra["attention_mask"].shape == (2, 9)
    with torch.no_grad():
        plain = bb.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        with_p = bb.model(**({"inputs_embeds": prep.embeds} | prep.extra), output_hidden_states=True).hidden_states[-1]
        prep0 = ad.prepare(bb, params, ids, mask, 1)
        prep0.extra["attention_mask"][:, :3] = 0  # prefix masked out -> the frozen model's own output
        masked = bb.model(**({"inputs_embeds": prep0.embeds} | prep0.extra),
                          output_hidden_states=True).hidden_states[-1]
    assert not torch.allclose(plain, with_p, atol=1e-4)
    assert torch.allclose(plain, masked, atol=1e-5)


def test_roberta_prefix_shifts_positions_as_the_official_code_and_unshifted_keeps_its_own():
    """RoBERTa numbers ``inputs_embeds`` from padding_idx + 1 and ignores both the cache and the padding; the
    official code runs RobertaModel on input_ids with past_key_values_length = h, i.e. HF's
    ``create_position_ids_from_input_ids(input_ids, padding_idx, h)``: the adapter must give the same."""
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    from fedpeft.backbones.loading import load_backbone

    bb = load_backbone("tiny-roberta-mlm")
    pad = bb.model.config.pad_token_id
    assert fairseq_padding_idx(bb) == pad and fairseq_padding_idx(load_backbone("tiny-bert")) is None
    h = 3
    ids = torch.randint(1000, 2000, (2, 6), generator=torch.Generator().manual_seed(1))
    ids[1, 4:] = pad
    mask = ids.ne(pad).long()

    def last(**kw) -> torch.Tensor:
        with torch.no_grad():
            return bb.model(**kw, output_hidden_states=True).hidden_states[-1]

    shifted = DeepPrompt(DeepPromptSettings(num_tokens=h, init_std=1.0))
    params = shifted.init(bb, torch.Generator().manual_seed(0))
    prep = shifted.prepare(bb, params, ids, mask, 1)
    want = pad + torch.tensor([[4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 0, 0]])
    assert torch.equal(prep.extra["position_ids"], want)
    assert torch.equal(want, RobertaEmbeddings.create_position_ids_from_input_ids(ids, pad, h))
    fresh = shifted.prepare(bb, params, ids, mask, 1).extra  # a new cache: a forward appends to the one it gets
    official = last(input_ids=ids, attention_mask=fresh["attention_mask"], past_key_values=fresh["past_key_values"],
                    use_cache=False)
    assert torch.allclose(last(inputs_embeds=prep.embeds, **prep.extra), official, atol=1e-5)
    plain = shifted.prepare(bb, params, ids, mask, 1)
    del plain.extra["position_ids"]  # what HF does with inputs_embeds alone: no shift, pads numbered too
    assert not torch.allclose(last(inputs_embeds=plain.embeds, **plain.extra), official, atol=1e-4)

    own = DeepPrompt(DeepPromptSettings(num_tokens=h, init_std=1.0, shift_positions=False))
    prep = own.prepare(bb, params, ids, mask, 1)
    assert torch.equal(prep.extra["position_ids"], RobertaEmbeddings.create_position_ids_from_input_ids(ids, pad))
    prep.extra["attention_mask"][:, :h] = 0  # prefix masked out -> exactly the model run on input_ids
    assert torch.allclose(last(inputs_embeds=prep.embeds, **prep.extra), last(input_ids=ids, attention_mask=mask),
                          atol=1e-5)
    with pytest.raises(ValueError, match="exceed the model's 514 positions"):
        shifted.prepare(bb, params, torch.ones(1, 511, dtype=torch.long) + 1000, torch.ones(1, 511), 1)
