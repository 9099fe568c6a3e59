"""Every registered aggregator and server-side wrapper, from the table in ``cases.py``: declared as it behaves,
independent of the clients' order, its fixed points, a state that survives the codec and ``restrict``, and
diagnostics that are its state's numbers. Rules the shared updates cannot drive say why in their row."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from fedpeft.aggregators.base import AGGREGATORS, PARAMS, WRAPPERS, AggregatorContext
from fedpeft.comm.codec import decode, encode
from fedpeft.comm.lora_pairs import products
from fedpeft.comm.update import Update

from tests.conformance.cases import AGGREGATOR_CASES, aggregator_case, least

NAMES = [*AGGREGATORS.names(), *WRAPPERS.names()]
WEIGHTS = [3, 1, 4, 1, 5]
CTX = AggregatorContext(num_clients=5, seed=0, trainer=SimpleNamespace(lr=0.1))


def build(name: str):
    """The rule with its least settings (a wrapper around its case's inner aggregator)."""
    case = aggregator_case(name)
    if case.skip:
        pytest.skip(case.skip)
    if name in WRAPPERS:
        inner = AGGREGATORS.get(case.inner)(AGGREGATORS.entry(case.inner).settings and
                                            AGGREGATORS.entry(case.inner).settings(), CTX)
        cls, entry = WRAPPERS.get(name), WRAPPERS.entry(name)
        return cls(entry.settings.model_validate(least("wrappers", name)), CTX, inner)
    entry = AGGREGATORS.entry(name)
    settings = entry.settings.model_validate(least("aggregator", name)) if entry.settings else None
    return entry.obj(settings, CTX)


def make_glob(kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = ({"a": (3, 2), "b": (4,)} if kind == "plain" else
              {"m.lora_A.weight": (2, 5), "m.lora_B.weight": (4, 2)})
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def make_updates(glob, seed: int) -> list[Update]:
    g = torch.Generator().manual_seed(seed)
    return [Update(i, {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in glob.items()}, w,
                   scalars={"steps": 3})
            for i, w in enumerate(WEIGHTS)]


def run_rounds(agg, glob, rounds):
    state = agg.init(glob)
    for r, ups in enumerate(rounds, start=1):
        glob, state = agg.aggregate(glob, ups, state, r)
    return glob, state


def view(name: str, params) -> dict[str, torch.Tensor]:
    """What the rule fixes: the tensors, or B·A per module where it may refactor the factors."""
    return products(params) if AGGREGATOR_CASES[name].compare == "product" else params


@pytest.mark.parametrize("name", NAMES)
def test_declared_as_it_behaves(name):
    agg = build(name)
    assert PARAMS in agg.accepts
    assert agg.needs <= {"steps"}, "the shared updates carry the local steps only: add what it needs to cases.py"


@pytest.mark.parametrize("name", NAMES)
def test_independent_of_the_clients_order(name):
    kind = aggregator_case(name).updates
    glob = make_glob(kind)
    rounds = [make_updates(glob, 1), make_updates(glob, 2)]
    perm = [3, 0, 4, 2, 1]
    out, state = run_rounds(build(name), glob, rounds)
    out_p, state_p = run_rounds(build(name), glob, [[r[i] for i in perm] for r in rounds])
    assert all(v.dtype == torch.float32 and v.shape == glob[k].shape for k, v in out.items())
    for k, v in view(name, out).items():
        torch.testing.assert_close(v, view(name, out_p)[k], rtol=1e-5, atol=1e-6)
    assert state.tensors.keys() == state_p.tensors.keys()


@pytest.mark.parametrize("name", NAMES)
def test_fixed_points(name):
    agg = build(name)
    case = aggregator_case(name)
    glob = make_glob(case.updates)
    if case.zero_fixed_point:  # every client returns the global itself: the global stays
        same = [Update(i, {k: v.clone() for k, v in glob.items()}, w, scalars={"steps": 3})
                for i, w in enumerate(WEIGHTS)]
        out, _ = agg.aggregate(glob, same, agg.init(glob), 1)
        for k, v in view(name, glob).items():
            torch.testing.assert_close(view(name, out)[k], v, rtol=1e-5, atol=1e-6)
    if case.fixed_point:  # n identical updates x_c (within any clipping norm of the global): x_c
        xc = {k: v + 0.01 * torch.arange(v.numel(), dtype=torch.float32).view(v.shape) / v.numel()
              for k, v in glob.items()}
        ups = [Update(i, {k: v.clone() for k, v in xc.items()}, w, scalars={"steps": 3})
               for i, w in enumerate(WEIGHTS)]
        out, _ = agg.aggregate(glob, ups, agg.init(glob), 1)
        for k, v in view(name, xc).items():
            torch.testing.assert_close(view(name, out)[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_state_survives_the_codec_and_restrict(name):
    kind = aggregator_case(name).updates
    glob = make_glob(kind)
    rounds = [make_updates(glob, 1), make_updates(glob, 2)]
    agg = build(name)
    mid, state = run_rounds(agg, glob, rounds[:1])
    assert all(v.dtype == torch.float32 for v in state.tensors.values())
    json.dumps(state.scalars, allow_nan=False)
    out1, s1 = agg.aggregate(mid, rounds[1], state, 2)
    out2, s2 = build(name).aggregate(mid, rounds[1], decode(encode(state)), 2)
    for k in out1:
        torch.testing.assert_close(out1[k], out2[k], rtol=0, atol=0)
    assert s1.scalars == s2.scalars and s1.tensors.keys() == s2.tensors.keys()
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in agg.diagnostics(s1).values())
    kept = agg.restrict(s1, set(glob))  # every tensor still shared: nothing dropped
    assert kept.tensors.keys() == s1.tensors.keys() and kept.scalars == s1.scalars
    first = sorted(glob)[0]
    dropped = agg.restrict(s1, {first})
    assert all(not k.endswith("::" + other) for k in dropped.tensors for other in set(glob) - {first})
