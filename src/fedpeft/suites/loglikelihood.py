"""Log-likelihood of a continuation given a context, as lm-evaluation-harness's ``HFLM.loglikelihood`` computes it
(``lm_eval/models/huggingface.py``, ``_encode_pair`` and ``_loglikelihood_tokens``), through fedpeft's adapters.

- tokens: a context's trailing spaces move to the start of the continuation; ``whole = encode(context +
  continuation)``, ``context = encode(context)`` (the tokenizer's own special tokens, as lm-eval 0.4's
  ``tok_encode`` adds them), the continuation is ``whole[len(context):]``; a pair longer than the model's window
  (lm-eval's ``resolve_max_length``) keeps its last tokens, as lm-eval does;
- score: the summed log-probability of the continuation's tokens, and whether each of them is the greedy token
  (lm-eval's ``is_greedy``).

The forward is ``LanguageModel.token_stats`` (``next_token_logprobs`` for single-token continuations) with the
continuation as the response, so soft prompts, prefixes and LoRA score exactly as they train. Rows are batched
longest first (less padding; the numbers do not depend on the batch beyond floating-point summation order).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpeft.backbones.encoding import Encoded, special_tokens


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair``: (context ids, continuation ids)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]
    whole = tokenizer(context + continuation)["input_ids"]
    ctx = tokenizer(context)["input_ids"]
    return ctx, whole[len(ctx):]


def window(model: Any, tokenizer: Any) -> int:
    """The model's context window as lm-eval resolves it (``n_positions``, ``max_position_embeddings``, ``n_ctx``,
    the tokenizer's ``model_max_length``, else 2048)."""
    cfg = getattr(model.config, "text_config", None) or model.config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(cfg, attr, None) is not None:
            return int(getattr(cfg, attr))
    size = getattr(tokenizer, "model_max_length", None)
    return int(size) if size is not None and size < int(1e30) else 2048


def loglikelihoods(objective: Any, params: dict[str, Any], pairs: list[tuple[str, str]],
                   batch_size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """(summed log-probability of each continuation, whether every continuation token is the greedy one).

    Single-token continuations of the same context (MMLU's letters, BoolQ's yes/no) are read from one forward of
    that context, as lm-eval's ``logits_cache`` does; longer ones get a forward each."""
    tok = objective.backbone.tokenizer
    limit = window(objective.backbone.model, tok) + 1
    lead = len(special_tokens(tok, "causal")[0])  # where a prompt adapter inserts its rows, as in training
    n = len(pairs)
    ll, greedy = np.zeros(n), np.zeros(n, dtype=bool)
    shared: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # context ids -> (pair, its one token)
    rows, starts, whose = [], [], []
    for k, (context, continuation) in enumerate(pairs):
        ctx, cont = encode_pair(tok, context, continuation)
        if not cont:
            raise ValueError(f"an empty continuation after {context[-40:]!r}: nothing to score")
        if len(cont) == 1 and len(ctx) + 1 <= limit:
            shared.setdefault(tuple(ctx), []).append((k, cont[0]))
            continue
        ids = (ctx + cont)[-limit:]
        rows.append(ids)
        starts.append(len(ids) - len(cont))
        whose.append(k)
    if rows:
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        stats = objective.token_stats(params, _encoded([rows[i] for i in order], [starts[i] for i in order], lead),
                                      batch_size)
        at = [whose[i] for i in order]
        ll[at] = -stats["nll"]
        greedy[at] = stats["correct"] == stats["tokens"]
    if shared:
        contexts = sorted(shared, key=lambda c: -len(c))
        enc = _encoded([list(c) + [shared[c][0][1]] for c in contexts], [len(c) for c in contexts], lead)
        scored = objective.next_token_logprobs(params, enc, [[t for _, t in shared[c]] for c in contexts],
                                               batch_size)
        for c, (logp, best) in zip(contexts, scored):
            for (k, token), lp in zip(shared[c], logp):
                ll[k], greedy[k] = lp, token == best
    return ll, greedy


def _encoded(rows: list[list[int]], starts: list[int], lead: int) -> Encoded:
    n = len(rows)
    return Encoded(rows, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), lead,
                   np.array(starts, dtype=np.int64))
