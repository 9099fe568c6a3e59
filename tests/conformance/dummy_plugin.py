"""A pytest plugin that registers a new aggregator and a new adapter, each one file's worth plus its row, the way a
contributor would: ``test_free_tests.py`` runs the conformance suite with it and counts what they get."""

from __future__ import annotations

from fedpeft.adapters import ADAPTERS
from fedpeft.adapters.soft_prompt import SoftPrompt, SoftPromptSettings
from fedpeft.aggregators import AGGREGATORS
from fedpeft.aggregators.fedavg import FedAvg

from tests.conformance import cases


@AGGREGATORS.register("dummy-mean", "a contributor's new aggregator (the weighted mean)")
class DummyMean(FedAvg):
    secure_sum = False


@ADAPTERS.register("dummy-prompt", "a contributor's new adapter (a soft prompt)", SoftPromptSettings)
class DummyPrompt(SoftPrompt):
    name = "dummy-prompt"


cases.LEAST["aggregator"]["dummy-mean"] = {}
cases.LEAST["adapter"]["dummy-prompt"] = {"num_tokens": 2}
cases.AGGREGATOR_CASES["dummy-mean"] = cases.AggregatorCase(fixed_point=True)
cases.ADAPTER_CASES["dummy-prompt"] = cases.AdapterCase()
