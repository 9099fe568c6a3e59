"""Evaluation done once (``evaluation.reuse_global``): where every client scores exactly the global tensors, the
local metrics come from the global test predictions and no evaluate message is sent; the records are those of
evaluating every client's shard again. Personalised methods still evaluate on their clients."""

from __future__ import annotations

import numpy as np
import pytest

import fedpeft.runtime.embedded as embedded
from fedpeft.build import build
from fedpeft.comm.codec import decode
from fedpeft.methods.state import ServerState
from fedpeft.runtime.embedded import run_embedded
from fedpeft.runtime.server import RoundDriver
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS

pytestmark = pytest.mark.usefixtures("one_thread")


def _records(root):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in RunDir(root).read_metrics()]


@pytest.fixture
def client_evaluations(monkeypatch):
    """Counts the evaluate messages the embedded runtime's clients answer, per round."""
    calls: list[int] = []
    real = embedded.handle_evaluate

    def counting(method, payload, ctx):
        calls.append(int(decode(payload).scalars["round"]))
        return real(method, payload, ctx)

    monkeypatch.setattr(embedded, "handle_evaluate", counting)
    return calls


def _both_ways(tiny_cfg, tmp_path, client_evaluations, **extra):
    """(records with reuse, records without, rounds whose clients evaluated with reuse on)."""
    run_embedded(tiny_cfg(evaluation__reuse_global=True, evaluation__round_zero=True, **extra), tmp_path / "once")
    evaluated = sorted(set(client_evaluations))
    run_embedded(tiny_cfg(evaluation__reuse_global=False, evaluation__round_zero=True, **extra), tmp_path / "twice")
    return _records(tmp_path / "once"), _records(tmp_path / "twice"), evaluated


@pytest.mark.parametrize("extra", [
    {"model__name": "tiny-llama"},
    {"method__name": "fedavg-full", "method__adapter__num_tokens": None,
     "federation__non_participants__fraction": 0.34},
    {"model__readout": "linear", "federation__clients_per_round": 2},
], ids=["fedprompt-llama", "fedavg-full-NP", "fedprompt-linear"])
def test_metrics_equal_those_of_evaluating_every_shard_again(tiny_cfg, tmp_path, client_evaluations, extra):
    once, twice, evaluated = _both_ways(tiny_cfg, tmp_path, client_evaluations, **extra)
    assert evaluated == []  # no client evaluated anything: every local metric came from the global pass
    assert once == twice    # global and local accuracies, P/NP means, eval bytes up and down: all of them
    assert all(r["eval_bytes_down"] > 0 and r["eval_bytes_up"] > 0 for r in once)


def test_personalised_rounds_still_evaluate_on_the_clients(tiny_cfg, tmp_path, client_evaluations):
    """FedPepTAO: during warm-up every layer is shared (one pass suffices); once layers are selected (after round
    2) the clients' private layers are scored on the clients."""
    once, twice, evaluated = _both_ways(
        tiny_cfg, tmp_path, client_evaluations, method__name="fedpeptao", method__adapter__num_tokens=3,
        method__sharing__warmup_rounds=2, federation__rounds=3, method__trainer__batch_size=8)
    assert evaluated == [2, 3]
    assert once == twice


def test_post_tuning_lossy_download_and_float16_wire_evaluate_on_the_clients(tiny_cfg):
    """The clients score other tensors than the global ones: no evaluation is taken from the global pass."""
    for extra in ({"method__codec__dtype": "float16"},
                  {"method__name": "discrete-prompt", "model__name": "tiny-llama", "method__trainer__max_steps": None,
                   "method__trainer__batch_size": None},
                  {"method__post_tuning__name": "gradient", "method__post_tuning__steps": 1}):
        cfg = tiny_cfg(**extra)
        b = build(cfg)
        state = b.method.server_init()
        final = cfg.federation.rounds
        once = RoundDriver(cfg.federation, b.method).evaluate_once(state, final, [0, 1, 2])
        assert once is None, extra


def test_parts_of_one_pass_score_like_each_part_alone(tiny_cfg):
    """The whole set's metrics are bit-identical to ``evaluate``; each part's accuracy and size equal its own
    evaluation's, its loss to float rounding (the padded width of an example's batch moves its logits ~1e-6)."""
    cfg = tiny_cfg()
    b = build(cfg)
    glob = ServerState.from_message(b.method.server_init()).glob
    trainer, test = b.method.trainer, b.exp.test_encoded
    parts = [np.asarray(p) for p in b.exp.test_parts] + [np.array([], dtype=np.int64)]
    whole, local = trainer.evaluate_parts(glob, test, parts)
    alone = trainer.evaluate(glob, test, predictions=True)
    assert np.array_equal(whole.pop("predictions"), alone.pop("predictions"))  # for macro-F1 and the confusion
    assert whole == alone
    for p, got in zip(parts, local):
        want = trainer.evaluate(glob, test.subset(p))
        assert {k: v for k, v in got.items() if k != "loss"} == {k: v for k, v in want.items() if k != "loss"}
        assert got.get("loss", 0.0) == pytest.approx(want.get("loss", 0.0), abs=1e-5)
    assert local[-1] == {"num_examples": 0}


def test_black_box_trainers_score_their_own_way(tiny_cfg):
    cfg = tiny_cfg(method__name="fedbpt", method__adapter__intrinsic_dim=8, method__trainer__max_steps=None,
                   method__trainer__batch_size=None)
    b = build(cfg)
    glob = ServerState.from_message(b.method.server_init()).glob
    assert b.method.trainer.evaluate_parts(glob, b.exp.test_encoded, list(b.exp.test_parts)) is None
