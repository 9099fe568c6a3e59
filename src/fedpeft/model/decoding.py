"""Batched greedy decoding of a causal LM with an adapter applied, with a key/value cache.

The adapter prepares the right-padded prompts as in training (soft-prompt rows inserted, a deep prompt's prefix
cache, LoRA weights as call overrides); each row is then moved to the right (left padding) so that all rows end
at the last column, positions count attended tokens only (HF ``generate``'s ``cumsum(mask) - 1``, after a prefix
cache's length), and each step feeds the argmax token with the cache. The LM head runs on the last
position only. LoRA decodes with its update merged into the base weights (W + s·B A) and its branch bypassed, as
PEFT's ``merge_and_unload`` model does. The same tokens as HF ``generate(do_sample=False)`` on the merged model (LoRA)
or PEFT's model (prompt tuning), and as a loop that recomputes the whole sequence each step (tests).
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from fedpeft.adapters.base import Params
from fedpeft.backbones.encoding import Encoded
from fedpeft.lazy import lazy, no_grad
from fedpeft.backbones.weights import call_with, swapped

torch = lazy("torch")


class LanguageModel(Protocol):
    """What decoding reads of ``model.language_model.LanguageModel`` (declared here: that module calls this one)."""

    backbone: Any
    adapter: Any
    device: Any
    end_id: int

    def batch(self, data: Encoded, rows: list[int]) -> dict[str, Any]: ...

    def _autocast(self) -> contextlib.AbstractContextManager: ...


def to_left_padding(embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows moved right so that every row's last attended position is the last column."""
    n, w = mask.shape
    shift = w - mask.sum(1)  # pads per row
    j = torch.arange(w, device=mask.device).unsqueeze(0)
    src = (j - shift.unsqueeze(1)) % w
    return embeds.gather(1, src.unsqueeze(-1).expand(-1, -1, embeds.shape[-1])), mask.gather(1, src)


@contextlib.contextmanager
def weights_in_place(lm: LanguageModel, params: Params):
    """The backbone's HF model with the adapter as plain weights while inside (LoRA merged, W + s·B A, its branch
    bypassed; other weight adapters' overrides), for code that calls the HF model itself (lm-eval's ``HFLM``).
    ValueError for an adapter that is not weights: rows or a key/value cache put before the tokens (prompts)."""
    backbone = lm.backbone
    params, over, bypass = _decoding_weights(lm, params)
    probe = torch.ones(1, 2, dtype=torch.long, device=lm.device)
    prep = lm.adapter.prepare(backbone, params, probe, probe, 0)
    if prep.inserted or prep.extra or prep.text is not None:
        raise ValueError(f"adapter '{lm.adapter.name}' puts rows or a key/value cache before the tokens: it is not "
                         "a set of weights that another library's model call can use; score it with a native suite")
    with bypass, swapped(backbone.model, over):
        yield backbone.model


def _decoding_weights(lm: LanguageModel, params: Params) -> tuple[Params, Params, contextlib.AbstractContextManager]:
    """(params as float32 on the device, the weights to put in the model's place, the context to run them in):
    LoRA's update merged into its base weights (W + s·B A) with the LoRA branch bypassed, else the adapter's
    overrides."""
    params = {k: (v.float() if v.is_floating_point() else v).to(lm.device) for k, v in params.items()}
    merge = getattr(lm.adapter, "merged", None)
    merged = merge(lm.backbone, params) if merge else None
    if merged is not None:
        return params, merged, lm.adapter.bypassed(lm.backbone)
    return params, lm.adapter.overrides(params) or {}, contextlib.nullcontext()


@no_grad
def greedy(lm: LanguageModel, params: Params, prompts: Encoded, max_new_tokens: int, batch_size: int = 16,
           static: Params | None = None) -> list[list[int]]:
    """Greedy completions of every prompt row, stopping at the end token (excluded) or ``max_new_tokens``."""
    model = lm.backbone.model
    params, over, bypass = _decoding_weights(lm, params)  # LoRA: W + s·BA, the LoRA branch bypassed
    over = over | {k: v.to(lm.device) for k, v in (static or {}).items()}

    def call(**kwargs):
        kwargs |= {"use_cache": True, "logits_to_keep": 1}
        with lm._autocast():
            return call_with(model, over, **kwargs)

    with bypass:
        return _decode(lm, params, prompts, max_new_tokens, batch_size, call)


def _decode(lm: LanguageModel, params: Params, prompts: Encoded, max_new_tokens: int, batch_size: int,
            call) -> list[list[int]]:
    """The decoding loop of ``greedy`` (``call`` runs the model with the adapter's weights in place)."""
    from transformers import DynamicCache

    backbone, model = lm.backbone, lm.backbone.model
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        b = lm.batch(prompts, list(range(start, min(start + batch_size, len(prompts)))))
        prep = lm.adapter.prepare(backbone, params, b["input_ids"], b["attention_mask"], int(b["lead"]))
        if prep.text is not None:
            raise ValueError("method.adapter: a frozen-text key/value cache (suffix placement) is for classification")
        embeds, mask = to_left_padding(prep.embeds, prep.attention_mask)
        cache = prep.extra.get("past_key_values")
        prefix = 0 if cache is None else cache.get_seq_length()
        offset = prefix if "position_ids" not in prep.extra else 0  # a prefix without its position shift: 0
        cache = cache if cache is not None else DynamicCache(config=model.config)
        n = mask.shape[0]
        ones = torch.ones(n, prefix, dtype=mask.dtype, device=mask.device)
        positions = (mask.cumsum(1) - 1).clamp_min(0) + offset
        res = call(inputs_embeds=embeds, attention_mask=torch.cat([ones, mask], 1), position_ids=positions,
                   past_key_values=cache)
        tokens = torch.empty(n, 0, dtype=torch.long, device=mask.device)
        done = torch.zeros(n, dtype=torch.bool, device=mask.device)
        last = positions[:, -1:]
        for step in range(max_new_tokens):
            nxt = res.logits[:, -1].argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, lm.end_id), nxt)
            tokens = torch.cat([tokens, nxt.unsqueeze(1)], 1)
            done |= nxt == lm.end_id
            if step == max_new_tokens - 1 or bool(done.all()):  # no forward for a token that will not be read
                break
            mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype, device=mask.device)], 1)
            last = last + 1
            res = call(input_ids=nxt.unsqueeze(1), attention_mask=torch.cat([ones, mask], 1),
                       position_ids=last, past_key_values=res.past_key_values)
        for row in tokens.tolist():
            out.append(row[:row.index(lm.end_id)] if lm.end_id in row else row)
    return out
