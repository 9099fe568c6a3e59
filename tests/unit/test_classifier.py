"""Templates, prompt insertion and readouts on tiny random models of each family."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedpeft.adapters.base import text_mask
from fedpeft.adapters.soft_prompt import SoftPrompt, SoftPromptSettings
from fedpeft.model.classifier import Classifier
from fedpeft.model.readouts import label_token_ids
from fedpeft.backbones.encoding import encode_examples
from fedpeft.experiment import build_experiment
from fedpeft.backbones.loading import load_backbone
from fedpeft.data.types import Example, TaskData
from fedpeft.runtime.embedded import run_embedded

TASK = TaskData(
    name="toy", class_names=["neg", "pos"], train=[], test=[],
    label_words=["bad", "great"], label_descriptions=["it is bad", "it is great"],
    template="{text_a} It was {mask}.", causal_template="Review: {text_a}\nIt was",
)
EXAMPLES = [Example("the film was a total waste of time and money", 0), Example("lovely", 1)]


def _clf(model: str, readout: str = "auto", m: int = 3, **kw) -> Classifier:
    adapter = SoftPrompt(SoftPromptSettings(num_tokens=m))
    return Classifier(load_backbone(model), adapter, TASK, readout, max_length=12, **kw)


def test_text_is_truncated_never_the_template_or_mask():
    bb = load_backbone("tiny-bert-mlm")
    enc = encode_examples(bb, TASK, EXAMPLES, max_length=10, readout="verbalizer")
    tok = bb.tokenizer
    first = enc.input_ids[0]
    assert len(first) == 10
    assert first[0] == tok.cls_token_id and first[-1] == tok.sep_token_id
    assert first[enc.mask_index[0]] == tok.mask_token_id
    assert tok.decode(first[enc.mask_index[0] - 2 : enc.mask_index[0]]) == "it was"
    assert len(enc.input_ids[1]) < 10 and enc.lead == 1


def test_keep_end_cuts_the_text_at_its_start_as_a_left_truncation():
    """``task.truncation: keep_end`` (DeComFL's left truncation of a review) keeps a long text's end and the
    template; the default keeps its start; a classification spec saved before the setting keeps the default."""
    import dataclasses

    from fedpeft.backbones.encoding import text_budget

    bb = load_backbone("tiny-bert-mlm")
    text = bb.tokenizer(EXAMPLES[0].text_a, add_special_tokens=False)["input_ids"]
    budget = text_budget(bb, TASK, 10, "verbalizer")
    assert 0 < budget < len(text)
    for truncation, kept in (("keep_start", text[:budget]), ("keep_end", text[-budget:])):
        task = dataclasses.replace(TASK, truncation=truncation)
        enc = encode_examples(bb, task, EXAMPLES, max_length=10, readout="verbalizer")
        first = enc.input_ids[0]
        assert first[1:1 + budget] == kept and first[enc.mask_index[0]] == bb.tokenizer.mask_token_id
    spec = TASK.spec()
    spec.pop("truncation")
    assert TaskData.from_spec(spec).truncation == "keep_start"


def test_label_words_as_written_skip_the_leading_space():
    """``task.label_word_spacing: as_written`` reads "Yes" as the token after a newline (DeComFL's RTE verbalizer);
    the default reads " Yes", the token after a space, on a space-sensitive (byte-level BPE) tokenizer."""
    from types import SimpleNamespace

    vocab: dict[str, int] = {}
    bpe = lambda text, add_special_tokens=False: {  # noqa: E731  a space-sensitive tokenizer: " Yes" != "Yes"
        "input_ids": [vocab.setdefault(w, len(vocab)) for w in text.replace(" ", "\0 ").split("\0") if w]}
    bb = SimpleNamespace(tokenizer=bpe, name="bpe")
    first = lambda w: bpe(w)["input_ids"][0]  # noqa: E731
    assert first(" Yes") != first("Yes")
    assert label_token_ids(bb, ["Yes", "No"]) == [first(" Yes"), first(" No")]
    assert label_token_ids(bb, ["Yes", "No"], "as_written") == [first("Yes"), first("No")]
    wordpiece = load_backbone("tiny-bert")  # not space-sensitive: both settings read the same tokens
    assert label_token_ids(wordpiece, ["bad", "great"]) == label_token_ids(wordpiece, ["bad", "great"], "as_written")


def test_soft_prompt_is_inserted_after_cls_and_mask_position_shifts():
    clf = _clf("tiny-bert-mlm", m=3)
    params = clf.init_params(torch.Generator().manual_seed(0))
    enc = clf.encode(EXAMPLES)
    batch = clf.batch(enc, [0, 1])
    prep = clf.adapter.prepare(clf.backbone, params, batch["input_ids"], batch["attention_mask"], enc.lead)
    assert prep.insert_at == 1 and prep.inserted == 3
    assert torch.equal(prep.embeds[0, 1:4], params["prompt"])
    emb = clf.backbone.input_embeddings()(batch["input_ids"])
    assert torch.equal(prep.embeds[:, 0], emb[:, 0]) and torch.equal(prep.embeds[:, 4:], emb[:, 1:])
    assert prep.attention_mask[1].sum() == batch["attention_mask"][1].sum() + 3
    # verbalizer logits read at the shifted mask position equal a manual computation
    out = clf.backbone.model(inputs_embeds=prep.embeds, attention_mask=prep.attention_mask).logits
    manual = out[0, enc.mask_index[0] + 3, clf.label_ids]
    assert torch.allclose(clf.logits(params, batch)[0], manual, atol=1e-6)


def test_causal_readout_uses_last_real_token_with_right_padding():
    clf = _clf("tiny-llama", m=2)
    params = clf.init_params(torch.Generator().manual_seed(0))
    enc = clf.encode(EXAMPLES)
    both = clf.logits(params, clf.batch(enc, [0, 1]))
    alone = clf.logits(params, clf.batch(enc, [1]))  # no padding when alone
    assert torch.allclose(both[1], alone[0], atol=1e-5)


@pytest.mark.parametrize("model", ["tiny-bert-mlm", "tiny-llama"])
def test_verbalizer_applies_the_lm_head_to_read_rows_only_with_the_same_logits(model):
    """Body + head on the read row equals the whole model's full-vocabulary logits at that row."""
    clf = _clf(model, m=2)
    params = clf.init_params(torch.Generator().manual_seed(0))
    params["prompt"] = params["prompt"] + torch.randn_like(params["prompt"])
    batch = clf.batch(clf.encode(EXAMPLES), [0, 1])
    prep = clf.adapter.prepare(clf.backbone, params, batch["input_ids"], batch["attention_mask"], 1)
    full = clf.backbone.model(inputs_embeds=prep.embeds, attention_mask=prep.attention_mask).logits
    if clf.backbone.family == "mlm":
        pos = batch["mask_index"] + torch.where(batch["mask_index"] >= prep.insert_at, prep.inserted, 0)
    else:
        pos = prep.attention_mask.sum(1) - 1
    want = full[torch.arange(2), pos][:, clf.label_ids]
    assert clf.backbone.body_and_head is not None
    assert torch.allclose(clf.logits(params, batch), want, atol=1e-5)


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
def test_text_pooling_averages_the_text_rows_only(model):
    """pooling=text: the mean over the text rows of the last hidden states, the m prompt rows left out; the
    prompt still moves the output, only through attention (pooling=all averages the prompt rows in too)."""
    text, every = _clf(model, "similarity", m=3, pooling="text"), _clf(model, "similarity", m=3)
    params = text.init_params(torch.Generator().manual_seed(0))
    batch = text.batch(text.encode(EXAMPLES), [0, 1])  # rows of different lengths: right padding
    prep = text.adapter.prepare(text.backbone, params, batch["input_ids"], batch["attention_mask"], 1)
    hidden = text.hidden_states(params, batch)[-1]
    keep = prep.attention_mask.clone().float()
    keep[:, 1:4] = 0  # the prompt rows, right after [CLS]/BOS
    assert keep.sum(1).tolist() == batch["attention_mask"].sum(1).tolist()  # exactly the text rows
    by_hand = (hidden * keep.unsqueeze(-1)).sum(1) / keep.sum(1, keepdim=True)
    want = text.scale * F.normalize(by_hand, dim=-1) @ text.anchors.T
    torch.testing.assert_close(text.logits(params, batch), want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(every.logits(params, batch), want, atol=1e-3)  # all: prompt rows averaged in
    moved = {"prompt": params["prompt"] + torch.randn_like(params["prompt"])}
    assert not torch.allclose(text.logits(moved, batch), want, atol=1e-4)  # through attention


def test_text_mask_leaves_out_inserted_rows_at_one_or_per_row_positions():
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    assert text_mask(mask, 1, 2).tolist() == [[1, 0, 0, 1, 1, 1], [1, 0, 0, 1, 0, 0]]
    assert text_mask(mask, torch.tensor([3, 1]), 2).tolist() == [[1, 1, 1, 0, 0, 1], [1, 0, 0, 1, 0, 0]]
    assert torch.equal(text_mask(mask, 1, 0), mask)


def test_text_pooling_is_for_pooled_readouts():
    with pytest.raises(ValueError, match="model.pooling"):
        _clf("tiny-llama", "verbalizer", pooling="text")
    with pytest.raises(ValueError, match="model.pooling"):
        _clf("tiny-bert", "similarity", pooling="cls")


def test_model_pooling_reaches_the_classifier(tiny_cfg):
    assert build_experiment(tiny_cfg(model__pooling="text")).objective.pooling == "text"
    assert build_experiment(tiny_cfg()).objective.pooling == "all"


def test_label_words_must_have_distinct_first_tokens():
    bb = load_backbone("tiny-bert")
    assert len(set(label_token_ids(bb, ["bad", "great"]))) == 2
    with pytest.raises(ValueError, match="share a first token"):
        label_token_ids(bb, ["great", "great"])


def test_encoder_has_no_verbalizer_readout():
    with pytest.raises(ValueError, match="model.readout"):
        _clf("tiny-bert", readout="verbalizer")


@pytest.mark.parametrize("model, readout", [("tiny-bert-mlm", "verbalizer"), ("tiny-roberta-mlm", "verbalizer"),
                                            ("tiny-llama", "verbalizer"), ("tiny-bert", "similarity")])
def test_every_family_runs_federated_rounds(tiny_cfg, tmp_path, model, readout):
    summary = run_embedded(tiny_cfg(model__name=model, model__readout=readout), tmp_path / "run")
    assert summary["rounds"] == 2 and summary["backbone_unchanged"]


def test_linear_head_is_trained_and_exchanged(tiny_cfg, tmp_path):
    cfg = tiny_cfg(model__readout="linear", method__trainer__lr=0.1)
    summary = run_embedded(cfg, tmp_path / "run")
    m, d, classes = 4, 32, 2
    assert summary["trainable_params"] == m * d + classes * d + classes
    assert summary["upload_tensor_bytes"] == 4 * (m * d + classes * d + classes)


def test_backbone_is_loaded_once_per_process(tiny_cfg, tmp_path):
    from fedpeft.backbones.loading import PROCESS_CACHE

    run_embedded(tiny_cfg(), tmp_path / "a")
    run_embedded(tiny_cfg(seed=3), tmp_path / "b")
    assert PROCESS_CACHE.loads["tiny-bert"] == 1


def test_any_local_model_directory_loads_like_a_hub_id(tmp_path, tiny_cfg):
    bb = load_backbone("tiny-bert-mlm")
    path = tmp_path / "my-mlm"
    bb.model.save_pretrained(path)
    bb.tokenizer.save_pretrained(path)
    loaded = load_backbone(str(path))
    assert loaded.family == "mlm" and loaded.num_parameters == bb.num_parameters
    summary = run_embedded(tiny_cfg(model__name=str(path)), tmp_path / "run")
    assert summary["model"] == str(path)


def test_prompt_initialised_from_given_words():
    adapter = SoftPrompt(SoftPromptSettings(num_tokens=4, init="words", init_words=["great", "movie"]))
    bb = load_backbone("tiny-bert")
    rows = adapter.init(bb, torch.Generator().manual_seed(0))["prompt"]
    ids = bb.tokenizer(["great", "movie"], add_special_tokens=False)["input_ids"]
    table = bb.input_embeddings().weight
    assert torch.equal(rows[0], table[ids[0][0]]) and torch.equal(rows[1], table[ids[1][0]])
    assert torch.equal(rows[2], rows[0])
