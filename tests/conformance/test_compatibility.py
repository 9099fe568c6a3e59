"""The compatibility check over a seeded sample of the component matrix (adapter × trainer × aggregator × sharing ×
selector, each with its least settings): every combination it refuses fails before anything loads, naming a
``method`` field; the first 8 it accepts run a round on tiny BERT. The sample (seed 0): 200 of the 10 × 9 × 18 × 12 × 3
combinations, 12 accepted (the full product is too slow to run)."""

from __future__ import annotations

import itertools
import random


from fedpeft.components import AXIS_REGISTRIES
from fedpeft.config import ConfigError
from fedpeft.resolve import load_config
from tests.conformance.cases import least

AXES = ("adapter", "trainer", "aggregator", "sharing", "selector")
SAMPLE, RUN = 200, 8


def _overrides(combo: dict[str, str]) -> dict[str, object]:
    over = {"method.adapter.num_tokens": None, "method.trainer.max_steps": None, "method.trainer.batch_size": None,
            "federation.rounds": 1, "task.num_examples": 48, "evaluation.local": False}
    for axis, name in combo.items():
        over[f"method.{axis}.name"] = name
        over |= {f"method.{axis}.{k}": v for k, v in least(axis, name).items()}
    if combo["trainer"] in ("adam", "adamw", "sgd"):
        over |= {"method.trainer.max_steps": 1, "method.trainer.batch_size": 8}
    return over


def _sample() -> list[dict[str, str]]:
    names = [AXIS_REGISTRIES[a].names() for a in AXES]
    product = list(itertools.product(*names))
    return [dict(zip(AXES, c)) for c in random.Random(0).sample(product, SAMPLE)]


def _load(combo):
    from conftest import tiny_overrides

    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in _overrides(combo).items()}))


def test_refused_combinations_name_the_field_and_accepted_ones_run(tmp_path, one_thread):
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    accepted, refused = [], []
    for combo in _sample():
        try:
            cfg = _load(combo)
        except (ConfigError, ValueError) as e:
            assert "method." in str(e) or "federation." in str(e), (combo, str(e))
            refused.append(combo)
            continue
        accepted.append((combo, cfg))
    assert accepted and refused  # the sample exercises both sides
    for i, (combo, cfg) in enumerate(accepted[:RUN]):
        run_embedded(cfg, tmp_path / str(i))
        rec = RunDir(tmp_path / str(i)).read_metrics()[-1]
        assert [c["status"] for c in rec["clients"]] == ["ok"] * len(rec["clients"]), (combo, rec["clients"])


def test_training_that_cannot_happen_is_refused_before_anything_loads():
    """A gradient trainer on an adapter without float tensors (read by no trainable head), and a stage that decides
    what travels beside a trainer that uploads nothing: each refused naming its field (the seeded sample above met
    both as runtime failures once the sharing axis grew)."""
    from conftest import tiny_overrides

    none = {"method__adapter__num_tokens": None}
    for over, field in ((dict(none, method__adapter__name="demonstrations", method__trainer__name="sgd"),
                         "method.trainer"),
                        (dict(none, method__adapter__name="template_only", method__trainer__name="adam"),
                         "method.trainer"),
                        (dict(method__name="headprune", method__trainer__name="no-training",
                              method__aggregator__name="keep-global", method__adapter__num_tokens=None,
                              method__trainer__batch_size=None, method__trainer__max_steps=None),
                         "method.sharing.name")):
        try:
            load_config(None, tiny_overrides(**over))
        except ConfigError as e:
            assert field in str(e), str(e)
        else:
            raise AssertionError(f"accepted {over}")
    load_config(None, tiny_overrides(method__adapter__name="template_only", method__trainer__name="adam",
                                     model__readout="linear", **none))  # a linear probe on the template: trainable
