"""Equal budgets, checked before anything runs: the arms of every paired contrast a benchmark's results file reads
train with the same budget (rounds, clients a round, training examples, the local trainer and each of its settings,
the readout head's learning rate), unless the grid declares the difference as the thing compared, with why
(``budget_differences`` in ``benchmarks/grids/<name>.yaml``; ``benchmarks.budget``)."""

from __future__ import annotations

import importlib

import pytest

from benchmarks.budget import differences, planned
from benchmarks.grids import load_grid
from fedpeft.resolve import load_config

BENCHMARKS = ["lora_family", "generation", "headprune", "secagg", "fedprompt_security", "discrete_prompt",
              "fedpeptao", "fedbpt", "feddpo", "zeroth_order"]


def _undeclared(name: str) -> tuple[list[str], dict[str, set[str]]]:
    """The contrasts' undeclared differences, and per arm the keys its contrasts differ in."""
    module = importlib.import_module(f"benchmarks.{name}")
    declared = load_grid(name).get("budget_differences") or {}
    problems, seen = [], {}
    for arm, ref, a, b in module.contrasts(module.parse([])):
        diff = differences(planned(load_config(None, a)), planned(load_config(None, b)))
        for side in (arm, ref):
            seen.setdefault(side, set()).update(diff)
        allowed = set(declared.get(arm, {})) | set(declared.get(ref, {}))
        problems += [f"{arm} − {ref}: {k} {x!r} against {y!r}" for k, (x, y) in diff.items() if k not in allowed]
    return list(dict.fromkeys(problems)), seen


@pytest.mark.parametrize("name", BENCHMARKS)
def test_paired_arms_train_with_equal_budgets_unless_the_grid_declares_the_difference(name):
    problems, _ = _undeclared(name)
    assert not problems, "undeclared budget differences:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_declared_difference_is_one_of_the_arms_contrasts(name):
    """No stale declaration: each declared key differs in at least one contrast of its arm, and each key has a
    reason."""
    _, seen = _undeclared(name)
    for arm, keys in (load_grid(name).get("budget_differences") or {}).items():
        assert arm in seen, f"{name}: budget_differences names {arm!r}, which no contrast compares"
        assert set(keys) <= seen[arm], f"{name}: {arm!r} declares {set(keys) - seen[arm]} but does not differ in it"
        assert all(isinstance(why, str) and why.strip() for why in keys.values())


def test_the_check_finds_the_local_only_preset_training_twice_as_long():
    """The confound the check exists for: the local-only preset inherits FedPepTAO's trainer (2 local epochs,
    weight decay 0.1) where dense LoRA trains one epoch without decay; and the readout head's rate is a budget key."""
    lora = ["method.adapter.name=lora", "model.readout=linear", "method.trainer.lr=1e-3"]
    diff = differences(planned(load_config(None, ["method.name=local-only", *lora])),
                       planned(load_config(None, ["method.name=fedavg-lora", *lora])))
    assert diff["local_epochs"] == (2.0, 1.0) and diff["weight_decay"] == (0.1, 0.0)
    head = planned(load_config(None, ["method.name=fedprompt", "model.readout=linear", "method.trainer.head_lr=1e-3"]))
    assert (head["lr"], head["head lr"]) == (0.03, 1e-3)
    assert "head lr" not in planned(load_config(None, ["method.name=fedprompt", "model.readout=similarity"]))
