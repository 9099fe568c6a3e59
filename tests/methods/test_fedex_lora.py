"""FedEx-LoRA (``sharing.fedex_residual``): the residual step on hand-made factors, then whole runs — exact every
round, the residual on the downlink as it travels, the shared backbone untouched, resumed bit-identically and
exported to PEFT exactly."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_resumes_identically, tiny_overrides

from fedpeft.build import build
from fedpeft.comm.lora_pairs import RESIDUAL, A, B, pairs
from fedpeft.config import ConfigError
from fedpeft.methods.state import ServerState
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.sharing.fedex_residual import residual_step
from fedpeft.tracking.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(**over):
    base = {"method.name": "fedex-lora", "method.adapter.num_tokens": None, "model.readout": "linear",
            "federation.rounds": 3}
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in (base | over).items()}))


def test_the_residual_makes_the_global_update_the_exact_average():
    g = torch.Generator().manual_seed(0)
    f = lambda: {"m" + A: torch.randn(2, 3, generator=g), "m" + B: torch.randn(4, 2, generator=g)}  # noqa: E731
    before = f() | {"m" + RESIDUAL: torch.randn(4, 3, generator=g)}
    clients, weights = [f(), f(), f()], [1.0, 2.0, 5.0]
    glob = {k: sum(w / 8 * c[k] for w, c in zip(weights, clients)) for k in clients[0]}  # FedAvg of A and B
    new = residual_step(glob, before, clients, weights)
    prod = lambda p: p["m" + B].double() @ p["m" + A].double()  # noqa: E731
    exact = sum(w / 8 * (before["m" + RESIDUAL].double() + prod(c)) for w, c in zip(weights, clients))
    torch.testing.assert_close(new["m" + RESIDUAL].double() + prod(glob), exact, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("over, why", [
    ({"method.exchange": "[fedex, fedsa]"}, "'fedex' needs both LoRA factors of every client"),
    ({"method.aggregator.name": "median"}, "sharing 'fedex' uploads what only fedavg or uniform can combine"),
    ({"federation.secure_aggregation": "{}"}, "'fedex' uploads what cannot be summed"),
])
def test_what_fedex_cannot_run_with_is_refused_before_anything_loads(over, why):
    with pytest.raises(ConfigError, match=why):
        _cfg(**over)


def test_every_round_is_exact_and_the_residual_travels_down_in_full_from_round_two(tmp_path):
    cfg = _cfg()
    b = build(cfg)
    weights = {n: p.detach().clone() for n, p in b.exp.objective.backbone.model.named_parameters()}
    run_embedded(cfg, tmp_path / "fedex", experiment=b.exp)
    recs = RunDir(tmp_path / "fedex").read_metrics()
    assert all(0 <= r["server"]["aggregation_error"] <= 1e-6 for r in recs)
    st = ServerState.from_message(RunDir(tmp_path / "fedex").load_checkpoint()[1])
    residual = {k: v for k, v in st.glob.items() if k.endswith(RESIDUAL)}
    assert set(residual) == {a[: -len(A)] + RESIDUAL for a, _ in pairs(st.glob).values()}
    assert all(v.any() for v in residual.values())
    extra = sum(4 * v.numel() for v in residual.values())  # float32 on the wire
    down = [c["bytes_down"] for r in recs for c in r["clients"] if c["client"] == 0]
    assert down[1] - down[0] >= extra and down[1] - down[0] < extra + 4096 and down[2] == down[1]
    up = [c["bytes_up"] for r in recs for c in r["clients"] if c["client"] == 0]
    assert max(up) - min(up) < 64  # never uploaded
    for n, p in b.exp.objective.backbone.model.named_parameters():  # the shared backbone is untouched
        assert torch.equal(p, weights[n]), n
    plain = _cfg(**{"method.name": "fedit", "method.adapter.r": 16, "method.adapter.target_modules": None})
    run_embedded(plain, tmp_path / "fedavg")
    assert RunDir(tmp_path / "fedavg").read_metrics()[-1]["server"]["aggregation_error"] > 1e-4


def test_the_global_model_is_w_plus_s_r_plus_s_ba_wherever_it_is_evaluated(tmp_path):
    """The residual enters a forward as the base weight W + s·R (overrides) and the decoding merge as
    W + s·(B A + R); both give what the merged weights give."""
    cfg = _cfg(**{"federation.rounds": 2})
    b = build(cfg)
    run_embedded(cfg, tmp_path / "run", experiment=b.exp)
    glob = ServerState.from_message(RunDir(tmp_path / "run").load_checkpoint()[1]).glob
    clf = b.exp.objective
    batch = clf.batch(b.exp.test_encoded, list(range(8)))
    got = clf.logits(glob, batch)
    merged = clf.adapter.merged(clf.backbone, glob)
    without = {k: v for k, v in glob.items() if not k.endswith((A, B, RESIDUAL))}
    with clf.adapter.bypassed(clf.backbone):
        want = clf.logits(without, batch, static=merged)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_fedex_run_resumes_bit_identically_and_exports_the_residual_exactly(tmp_path):
    assert_resumes_identically(_cfg(), tmp_path, stop_after_round=2)
    from safetensors.torch import load_file

    from fedpeft.export import export_peft

    out, _ = export_peft(tmp_path / "full", tmp_path / "peft")
    peft = load_file(out / "adapter_model.safetensors")
    glob = ServerState.from_message(RunDir(tmp_path / "full").load_checkpoint()[1]).glob
    for a_key, b_key in pairs(glob).values():
        res = glob[a_key[: -len(A)] + RESIDUAL].double()
        want = glob[b_key].double() @ glob[a_key].double() + res
        got = peft["base_model.model." + b_key].double() @ peft["base_model.model." + a_key].double()
        assert float(torch.linalg.norm(got - want) / torch.linalg.norm(want)) < 1e-5  # float32 factors


def test_under_the_uniform_mean_of_the_authors_code_the_residual_is_exact_too(tmp_path):
    """Unequal clients (Dirichlet) averaged alike, as ``CERT-Lab/fedex-lora``'s aggregation does: the residual and
    the aggregation error take the aggregator's weights, so the round is exact against the uniform average."""
    cfg = _cfg(**{"method.aggregator.name": "uniform", "federation.rounds": 2,
                  "federation.partition.scheme": "dirichlet", "federation.partition.alpha": 0.5})
    run_embedded(cfg, tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    sizes = {c["num_examples"] for c in recs[0]["clients"]}
    assert len(sizes) > 1 and all(r["server"]["aggregation_error"] <= 1e-6 for r in recs)
