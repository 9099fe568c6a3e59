"""Figure 5: black-box batching (stacked candidates, length-sorted passes, the verbalizer's read row)."""

from __future__ import annotations

import torch

from fedpeft.model.blackbox import BlackBox
from fedpeft.build import build
from fedpeft.methods.state import ServerState
from fedpeft.resolve import load_config

from benchmarks.perf.common import Figure, alternate, figure


def figure_5(args) -> list[Figure]:
    """(a) lambda candidates stacked in one call against one forward per candidate, on a client's examples of the
    FedBPT benchmark's data (SST-2); (c) that stacked call's rows sorted by length into one pass per candidate (the
    CPU default, ``Classifier._population_passes``) against one pass padded to the longest row."""
    cfg = load_config(None, ["method.name=fedbpt", "task.name=sst2", "model.name=minilm", "runtime.threads=1",
                             "runtime.progress=false", f"federation.num_clients={args.clients}",
                             f"task.max_train={args.clients * args.bb_examples}", "federation.partition.scheme=iid"])
    b = build(cfg)
    s = b.method.trainer.settings
    data = b.exp.client(0).train
    data = data.subset(list(range(min(args.bb_examples, len(data)))))
    z = torch.randn(s.popsize, cfg.method.adapter.intrinsic_dim, generator=torch.Generator().manual_seed(0))
    clf = b.exp.objective
    one = BlackBox(clf, batched=True, max_rows=s.max_rows)
    each = BlackBox(clf, batched=False, max_rows=s.max_rows)
    ta, tb = alternate(lambda: each.losses(z, data), lambda: one.losses(z, data), args.reps)
    diff = float((each.losses(z, data) - one.losses(z, data)).abs().max())
    stacked = max(1, s.max_rows // s.popsize)
    rows = [figure("5a", f"FedBPT on MiniLM, SST-2: lambda = {s.popsize} candidates on {len(data)} examples, one "
                   f"forward per candidate ({min(s.max_rows, len(data))} rows) / candidates stacked (max_rows "
                   f"{s.max_rows}: {s.popsize * min(stacked, len(data))} rows)", ("per candidate", "stacked"), ta, tb,
                   "> 1×", lambda r: r > 1, f"losses max abs diff {diff:.1e}", level_at=1.0)]

    def one_pass():
        clf._population_passes = lambda prep, batch: 1  # this instance only: one padded pass
        try:
            return one.losses(z, data)
        finally:
            del clf._population_passes

    ta, tb = alternate(one_pass, lambda: one.losses(z, data), args.reps)
    diff = float((one_pass() - one.losses(z, data)).abs().max())
    rows.append(figure("5c", f"the stacked call of 5a: one pass padded to the longest row / rows sorted by length "
                       f"into {s.popsize} passes, each padded to its own longest row (the CPU default)",
                       ("one pass", "sorted passes"), ta, tb, "> 1×", lambda r: r > 1,
                       f"losses max abs diff {diff:.1e}", level_at=1.0))
    rows.append(verbalizer_figure(args))
    return rows


def full_vocabulary_logits(clf, params: dict[str, torch.Tensor], batch) -> torch.Tensor:
    """The old causal-LM readout: the whole *ForCausalLM (vocabulary logits at every position), then the label
    words' logits gathered at the last attended position."""
    prep = clf.adapter.prepare(clf.backbone, params, batch["input_ids"], batch["attention_mask"], int(batch["lead"]))
    out = clf.backbone.model(inputs_embeds=prep.embeds, attention_mask=prep.attention_mask, **prep.extra)
    pos = prep.attention_mask.sum(1) - 1
    return out.logits[torch.arange(out.logits.shape[0]), pos][:, clf.label_ids]


def verbalizer_figure(args) -> Figure:
    cfg = load_config(None, ["method.name=fedprompt", "task.name=bbc", "model.name=smollm2", "runtime.threads=1",
                             "runtime.progress=false", f"federation.num_clients={args.clients}"])
    b = build(cfg)
    clf = b.exp.objective
    params = ServerState.from_message(b.method.server_init()).glob
    batch = clf.batch(b.exp.test_encoded, list(range(args.lm_batch)))
    with torch.inference_mode():
        ta, tb = alternate(lambda: full_vocabulary_logits(clf, params, batch), lambda: clf.logits(params, batch),
                           args.reps)
        diff = float((full_vocabulary_logits(clf, params, batch) - clf.logits(params, batch)).abs().max())
    width = int(batch["attention_mask"].shape[1]) + cfg.method.adapter.num_tokens
    return figure("5b", f"SmolLM2 verbalizer, {args.lm_batch} x {width} tokens: full-vocabulary logits at every "
                  "position / read row × LM head", ("every position", "read row"), ta, tb, "> 1×", lambda r: r > 1,
                  f"label logits max abs diff {diff:.1e}", level_at=1.0)
