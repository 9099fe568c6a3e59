"""How a method's tensors are scored, apart from how they are trained and exchanged: the objective's metrics on
encoded data (accuracy, loss, macro-F1 and the confusion matrix of a classifier; the loss per natural client of a
language model), the backdoor's attack success rate where it is measured, and in the generating rounds
(``evaluation.generate_every``) what the model writes, scored (``generation_eval``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpeft.comm.update import Params
from fedpeft.generation_eval import by_group, generation_metrics, sample_rows
from fedpeft.methods.state import GEN
from fedpeft.metrics import class_metrics
from fedpeft.formats.base import floats


class Evaluation:
    """Scores tensors with the trainer's ``evaluate`` on the experiment's test data, under the evaluation section's
    settings (``RunFacts.evaluation``)."""

    def __init__(self, trainer: Any, experiment: Any, settings: Any, seed: int, rounds: int) -> None:
        self.trainer, self.exp, self.settings, self.seed, self.rounds = trainer, experiment, settings, seed, rounds
        self.clf = experiment.objective
        self._suites: list[tuple[str, Any]] | None = None  # evaluation.round_suites, built at first use

    def on(self, glob: Params, data: Any) -> dict[str, Any]:
        """``glob``'s accuracy, loss, macro-F1 and confusion matrix on labelled encoded ``data``."""
        return self.with_classes(self.trainer.evaluate(glob, data, predictions=True), data)

    def with_classes(self, metrics: dict[str, Any], data: Any) -> dict[str, Any]:
        """``metrics`` with its ``predictions`` replaced by the macro-F1 and confusion matrix they give (generation
        and preference tasks: by the metrics per natural client of the test set)."""
        preds = metrics.pop("predictions", None)
        if preds is None:
            return metrics
        if self.clf.kind != "classification":
            test = data is self.exp.test_encoded
            return metrics | (by_group(self.clf, preds, self.exp.task.test, self.seen_groups()) if test else {})
        return metrics | class_metrics(data.labels, preds, self.clf.task.num_classes)

    def asr(self, glob: Params) -> dict[str, float]:
        """The backdoor's attack success rate on the triggered test inputs, where the attack is measured."""
        asr_test = getattr(self.exp, "asr_test", None)
        if asr_test is None or not len(asr_test):
            return {}
        return {"asr": self.trainer.evaluate(glob, asr_test)["accuracy"]}

    def generating(self, round: int) -> bool:
        every, last = self.settings.generate_every, round == self.rounds
        return self.clf.kind == "generation" and every != 0 and (last or every is not None and round % every == 0)

    def generation(self, glob: Params, round: int) -> dict[str, Any]:
        """Greedy generations of ``glob`` on the fixed test sample, scored, in a generating round."""
        if not self.generating(round):
            return {}
        ev = self.settings
        rows = sample_rows(self.exp.task.test, ev.generate_examples, self.seed)
        return {"generation": generation_metrics(self.clf, floats(glob), self.exp.task.test, rows, self.seen_groups(),
                                                 ev.max_new_tokens, ev.batch_size, ev.show_examples, ev.bootstrap)}

    def client_generation(self, params: Params, client_id: int, round: int) -> dict[str, Any]:
        """In a generating round: the scores of what a client's own tensors write for its share of the fixed test
        sample (the global sample's rows in its test shard; numbers only, no texts leave the client)."""
        if not self.generating(round) or client_id >= len(self.exp.test_parts):
            return {}
        ev, test = self.settings, self.exp.task.test
        mine = np.intersect1d(sample_rows(test, ev.generate_examples, self.seed), self.exp.test_parts[client_id])
        if not len(mine):
            return {}
        scores = generation_metrics(self.clf, floats(params), test, mine, set(), ev.max_new_tokens, ev.batch_size, 0)
        return {GEN + k: v for k, v in scores.items() if isinstance(v, (int, float))}  # flat numbers, as replies are

    def suites(self, glob: Params) -> dict[str, Any]:
        """The scores of ``evaluation.round_suites`` on ``glob`` (each suite built once, on its fixed items)."""
        if not self.settings.round_suites:
            return {}
        if self._suites is None:
            from fedpeft.suites import build_suite

            self._suites = [(s.name, build_suite(s.name, s.limit, **s.settings)) for s in self.settings.round_suites]
        return {"suites": {name: suite.run(self.clf, floats(glob), self.settings.batch_size).scores
                           for name, suite in self._suites}}

    def seen_groups(self) -> set[str]:
        return {e.group for e in self.exp.task.train if e.group is not None}
