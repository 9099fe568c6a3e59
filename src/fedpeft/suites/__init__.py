"""Standard evaluation suites: the field's own yardsticks, so that a fedpeft number can stand beside a published one.

A suite scores a language model (the frozen backbone with a run's adapter, or bare) on a public benchmark by that
benchmark's protocol and returns its scores with every item's prediction (``base.SuiteResult``), so that a score can
be checked item by item. ``fedpeft suites`` lists the registered ones; each module's doc states its protocol and
the code it follows.
"""

from fedpeft.suites.base import SUITES, SuiteResult, build_suite
from fedpeft.suites import advbench, flowertune, gsm8k, humaneval, lmeval, mmlu  # noqa: F401  (registration)

__all__ = ["SUITES", "SuiteResult", "build_suite"]
