"""Vectorised clients (``runtime.client_batch``): several calls in one backbone forward give each call's own logits,
one shared backward gives each client its own gradient, a group's requests meet in an order that does not depend on
thread timing, and whole runs equal running the clients one after another (tolerance: float rounding of the larger
padded batch, 1e-5 on logits and gradients, 1e-4 on losses and trained tensors after a run; 1e-3 for P-tuning's
trained tensors, because Adam divides each step by sqrt(v) and so magnifies the rounding of near-zero gradients:
2 of its 4,096 LSTM entries were off by 2.7e-4)."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from conftest import tiny_overrides

from fedpeft.model.classifier import Classifier
from fedpeft.model.gather import ForwardGather
from fedpeft.build import build
from fedpeft.config import ConfigError
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS

pytestmark = pytest.mark.usefixtures("one_thread")

BLACK_BOX = {"method.trainer.max_steps": None, "method.trainer.batch_size": None, "method.adapter.num_tokens": None}
NO_TOKENS = {"method.adapter.num_tokens": None}
PRESET = {"fedbpt": BLACK_BOX, "discrete-prompt": BLACK_BOX, "fedavg-lora": NO_TOKENS, "headprune": NO_TOKENS,
          "manual-prompt": BLACK_BOX}


def _cfg(preset: str, model: str = "tiny-bert", **extra):
    over = {"method.name": preset, "model.name": model, **PRESET.get(preset, {}),
            **{k.replace("__", "."): v for k, v in extra.items()}}
    return load_config(None, tiny_overrides(**over))


@pytest.mark.parametrize("passes", [1, 2, None])  # one padded pass; rows sorted by length in 2; CPU default: alone
@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
@pytest.mark.parametrize("preset,key", [("fedbpt", "z"), ("discrete-prompt", "prompt")])
def test_calls_in_one_forward_give_each_call_its_own_logits(model, preset, key, passes):
    b = build(_cfg(preset, model))
    clf, data = b.exp.objective, b.exp.client(0).train
    base = b.method.initial_params()[key]
    gen = torch.Generator().manual_seed(0)
    calls = []
    for pop, rows in ((3, [0, 1, 2, 3]), (1, [5, 9]), (2, list(range(10, 17)))):  # unequal widths and sizes
        cand = base.unsqueeze(0).repeat(pop, *[1] * base.dim()) + 0.3 * torch.randn(pop, *base.shape, generator=gen)
        calls.append(({key: cand}, clf.batch(data, rows)))
    with torch.inference_mode():
        together = clf.logits_stacked(calls, passes)
        alone = [clf.logits(p, bt) for p, bt in calls]
    if passes is None:  # CPU default: no stacked call; each call runs on its own, bitwise what it gives alone
        assert together is None
        return
    assert [t.shape for t in together] == [a.shape for a in alone]
    for t, a in zip(together, alone):
        assert torch.allclose(t, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
@pytest.mark.parametrize("preset,key", [("fedbpt", "z"), ("discrete-prompt", "prompt")])
def test_a_population_call_sorts_its_rows_into_one_pass_per_candidate_on_cpu(model, preset, key, monkeypatch):
    """A call that stacks 4 candidates over one batch of unequal lengths runs 4 forwards over its rows sorted by
    length (each padded to its own longest row), with the logits of one padded forward."""
    b = build(_cfg(preset, model, task__max_length=96))  # unequal lengths for the tiny Llama tokenizer too
    clf, data = b.exp.objective, b.exp.client(0).train
    base = b.method.initial_params()[key]
    cand = base.unsqueeze(0).repeat(4, *[1] * base.dim()) + 0.3 * torch.randn(4, *base.shape,
                                                                           generator=torch.Generator().manual_seed(0))
    batch = clf.batch(data, list(range(9)))
    assert int(batch["attention_mask"].sum(1).min()) < int(batch["attention_mask"].sum(1).max())  # unequal lengths
    split = clf.backbone.body_and_head
    model_called = clf.backbone.model if split is None else split[1]
    widths = []
    hook = model_called.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["inputs_embeds"].shape[:2]),
                                                  with_kwargs=True)
    with torch.inference_mode():
        sorted_passes = clf.logits({key: cand}, batch)
        monkeypatch.setattr(type(clf), "_population_passes", lambda self, prep, batch: 1)
        one_pass = clf.logits({key: cand}, batch)
    hook.remove()
    assert [w[0] for w in widths] == [9, 9, 9, 9, 36]  # 4 passes of 9 rows, then one padded pass of 36
    assert min(w[1] for w in widths[:4]) < widths[4][1]  # the short rows' passes are narrower
    torch.testing.assert_close(sorted_passes, one_pass, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("passes,forwards", [(1, 1), (None, 3)])  # one stacked forward; CPU default: one per call
@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
def test_one_shared_backward_gives_each_client_its_own_gradient(model, passes, forwards):
    b = build(_cfg("fedprompt", model))
    clf, data = b.exp.objective, b.exp.client(0).train
    base = b.method.initial_params()
    gen = torch.Generator().manual_seed(0)
    calls = []
    for rows in ([0, 1, 2, 3], [5, 9], list(range(10, 17))):  # unequal widths and sizes
        params = {k: (v + 0.3 * torch.randn(v.shape, generator=gen)).requires_grad_(True) for k, v in base.items()}
        calls.append((params, clf.batch(data, rows)))

    def loss_fn(logits, batch):
        return torch.nn.functional.cross_entropy(logits.float(), batch["labels"])

    alone = []
    for params, batch in calls:
        loss = loss_fn(clf.logits(params, batch), batch)
        grads = torch.autograd.grad(loss, list(params.values()))
        alone.append((float(loss.detach()), grads))
    gather = ForwardGather(clf, len(calls), passes)
    results = [None] * len(calls)

    def client(i):
        params, batch = calls[i]
        for p in params.values():
            p.grad = None
        results[i] = gather.loss_and_backward(i, params, batch, lambda lg: loss_fn(lg, batch))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(calls))]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert gather.calls == forwards and gather.requests == len(calls)  # one backward for all three
    for (params, _), (loss, grads), got in zip(calls, alone, results):
        assert got == pytest.approx(loss, abs=1e-5)
        for p, g in zip(params.values(), grads):
            assert torch.allclose(p.grad, g, atol=1e-5, rtol=1e-4)


def test_a_groups_jth_call_holds_every_clients_jth_request_whatever_the_timing():
    class Recording:
        def __init__(self):
            self.calls = []

        def logits_stacked(self, calls, passes=None):
            self.calls.append([int(p["c"]) * 100 + int(p["j"]) for p, _ in calls])
            return [p["c"] * 10 + p["j"] for p, _ in calls]

    requests = {0: 3, 1: 1, 2: 2}  # client -> how many forwards it makes
    for trial in range(3):
        rec = Recording()
        gather = ForwardGather(rec, len(requests))
        got = {}
        rnd = random.Random(trial)

        def client(c):
            try:
                for j in range(requests[c]):
                    time.sleep(rnd.random() * 0.01)
                    got[(c, j)] = gather.logits(c, {"c": torch.tensor(c), "j": torch.tensor(j)}, {})
            finally:
                gather.leave()

        threads = [threading.Thread(target=client, args=(c,)) for c in (2, 0, 1)]
        [t.start() for t in threads]
        [t.join(10) for t in threads]
        assert rec.calls == [[0, 100, 200], [1, 201], [2]]  # client order within a call, j-th with j-th
        assert all(float(got[(c, j)]) == c * 10 + j for c in requests for j in range(requests[c]))
        assert (gather.calls, gather.requests) == (3, 6)


def test_a_failing_shared_forward_fails_every_waiting_client_and_nobody_hangs():
    class Broken:
        def logits_stacked(self, calls, passes=None):
            raise RuntimeError("out of memory")

    gather = ForwardGather(Broken(), 2)
    errors = []

    def client(c):
        try:
            gather.logits(c, {}, {})
        except RuntimeError as e:
            errors.append(str(e))
        finally:
            gather.leave()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(2)]
    [t.start() for t in threads]
    [t.join(10) for t in threads]
    assert not any(t.is_alive() for t in threads) and len(errors) == 2 and "out of memory" in errors[0]


OWN_FORWARD = ("fedpeptao", "fedavg-lora")  # deep prompts' key/value inputs and LoRA's weights: a forward per client


def _records(path):
    return RunDir(path).read_metrics()


# passes 1: one stacked forward per group call, the GPU default; None: the CPU default, no groups (exactly the
# sequential run). The discrete search's stacked run goes with one padded pass per population call in both arms:
# against the sequential client's length-sorted candidate passes, a stacked pass rounds differently (1e-6), enough
# to flip near-tied token choices of its argmin on this tiny random model.
@pytest.mark.parametrize("preset,passes", [("fedbpt", 1), ("discrete-prompt", 1), ("discrete-prompt", None),
                                           ("fedprompt", 1), ("fedprompt-ptuning", 1), ("fedpeptao", 1),
                                           ("fedavg-lora", 1)])
def test_a_run_with_clients_together_equals_one_after_another(tmp_path, preset, passes, monkeypatch):
    extra = {"fedprompt": {"method__trainer__reset_optimizer": False},  # Adam states carried over
             "fedbpt": {"method__trainer__iterations": 3},  # a short search: the same code path as I = 8
             "discrete-prompt": {"method__adapter__num_tokens": 8, "method__trainer__steps": 6,
                                 "method__post_tuning__iterations": 3}}.get(preset, {})
    if preset == "discrete-prompt" and passes == 1:
        monkeypatch.setattr(Classifier, "_population_passes", lambda self, prep, batch: 1)
    seq = _cfg(preset, federation__num_clients=4, **extra)
    vec = _cfg(preset, federation__num_clients=4, runtime__client_batch=3, runtime__client_batch_passes=passes,
               **extra)
    run_embedded(seq, tmp_path / "seq")
    run_embedded(vec, tmp_path / "vec")
    a, b = _records(tmp_path / "seq"), _records(tmp_path / "vec")
    for ra, rb in zip(a, b, strict=True):
        assert ra["accuracy"] == pytest.approx(rb["accuracy"], abs=1e-9)
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-4)
        for ca, cb in zip(ra["clients"], rb["clients"], strict=True):
            assert ca["train_loss"] == pytest.approx(cb["train_loss"], abs=1e-4)
            if preset in ("fedbpt", "discrete-prompt"):  # each client's own count of model calls is unchanged
                assert ca["queries"] == cb["queries"]
        if passes is None:  # CPU default: no groups
            untimed = [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in (ra, rb)]
            assert untimed[0] == untimed[1] and "client_batch" not in rb
        else:
            shared = rb["client_batch"]
            if preset in OWN_FORWARD:
                assert shared["backbone_calls"] == shared["forward_requests"] > 0
            else:
                assert 0 < shared["backbone_calls"] < shared["forward_requests"]  # forwards were actually shared
    assert "client_batch" not in a[0]
    sa, sb = RunDir(tmp_path / "seq").load_checkpoint()[1], RunDir(tmp_path / "vec").load_checkpoint()[1]
    for k in sa.tensors:
        atol = 1e-3 if preset == "fedprompt-ptuning" else 1e-4
        assert torch.allclose(sa.tensors[k].double(), sb.tensors[k].double(), atol=atol), k


def test_a_failing_client_in_a_group_leaves_the_others_to_finish(tmp_path):
    cfg = _cfg("fedbpt", federation__num_clients=3, federation__rounds=1, runtime__client_batch=3,
               runtime__client_batch_passes=1, faults__fail_clients="[1]", federation__min_clients=2)
    run_embedded(cfg, tmp_path / "run")
    rec = _records(tmp_path / "run")[0]
    assert [c["status"] for c in rec["clients"]] == ["ok", "failed", "ok"]
    assert rec["client_batch"]["backbone_calls"] > 0  # the two others ran as a group


def test_client_batch_needs_a_trainer_and_sharing_that_can_and_no_workers():
    with pytest.raises(ConfigError, match="runtime.client_batch: trainer 'no-training'"):
        _cfg("manual-prompt", runtime__client_batch=2)
    with pytest.raises(ConfigError, match="runtime.client_batch: sharing 'head_pruning'"):
        _cfg("headprune", runtime__client_batch=2)
    with pytest.raises(ConfigError, match="client_batch > 1 runs clients together"):
        _cfg("fedbpt", runtime__client_batch=2, runtime__client_workers=2)
    with pytest.raises(ConfigError, match="client_batch > 1 is how the embedded runtime"):
        _cfg("fedbpt", runtime__client_batch=2, runtime__name="flower-sim")
