"""Fed-SB over LoRA-SB (``adapters.lora_sb``, ``sharing.latent_only``): the initialisation is the rank-r SVD of the
sign step of the base weights' real gradient; B and A stay fixed and reach each client once; only R travels up;
every round is exact; the run
composes with secure aggregation and DP-FedAvg, resumes bit-identically and exports to PEFT as the same update."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_resumes_identically, tiny_overrides

from fedpeft.build import build
from fedpeft.comm.lora_pairs import LATENT, A, B
from fedpeft.methods.state import ServerState
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")
R = 4


def _cfg(**over):
    base = {"method.name": "fed-sb", "method.adapter.num_tokens": None, "model.readout": "linear",
            "method.adapter.r": R, "federation.rounds": 3}
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in (base | over).items()}))


def test_the_initialisation_is_the_rank_r_svd_of_the_sign_step_of_the_real_gradient():
    """G recomputed through the backbone's own parameters (autograd on the module, not the adapter's override):
    B R A is the best rank-r approximation of −η·sign(G); B and A have orthonormal columns and rows, R is the
    diagonal of its singular values."""
    cfg = _cfg()
    b = build(cfg)
    clf, adapter = b.exp.objective, b.exp.objective.adapter
    init = b.method.initial_params()
    # the same examples and head the adapter drew: replay the generator up to the initialisation
    from fedpeft.rng import SERVER, torch_rng

    g = torch_rng(cfg.seed, 0, SERVER, "adapter-init")
    drawn = adapter.init(clf.backbone, g) | clf.head.init(clf, g)
    pick = torch.randperm(len(clf.task.train), generator=g)[: adapter.cfg.init_examples].tolist()
    batch = clf.batch(clf.encode([clf.task.train[i] for i in pick]), list(range(len(pick))))
    modules = adapter.modules(clf.backbone)
    layers = [clf.backbone.model.get_submodule(m).base_layer.weight for m in modules]
    for w in layers:
        w.requires_grad_(True)
    try:
        clf.loss(clf.outputs(drawn, batch), batch).backward()
        grads = [w.grad.detach().double().clone() for w in layers]
    finally:
        for w in layers:
            w.grad = None
            w.requires_grad_(False)
    eta = adapter.cfg.init_step
    for m, grad in zip(modules, grads):
        delta = -eta * torch.sign(grad)
        u, s, vh = torch.linalg.svd(delta)
        best = u[:, :R] @ torch.diag(s[:R]) @ vh[:R]
        got = init[m + B].double() @ init[m + LATENT].double() @ init[m + A].double()
        assert float(torch.linalg.norm(got - best) / torch.linalg.norm(best)) < 1e-5
        torch.testing.assert_close(init[m + B].T.double() @ init[m + B].double(), torch.eye(R, dtype=torch.float64),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(init[m + A].double() @ init[m + A].T.double(), torch.eye(R, dtype=torch.float64),
                                   atol=1e-5, rtol=0)
        lat = init[m + LATENT]
        assert torch.equal(lat, torch.diag(torch.diagonal(lat))) and bool((torch.diagonal(lat) > 0).all())
    assert all(p.grad is None for p in clf.backbone.model.parameters())


def test_only_r_travels_up_b_and_a_stay_fixed_and_every_round_is_exact(tmp_path):
    cfg = _cfg()
    b = build(cfg)
    init = b.method.initial_params()
    run_embedded(cfg, tmp_path / "run", experiment=b.exp)
    recs = RunDir(tmp_path / "run").read_metrics()
    assert all(0 <= r["server"]["aggregation_error"] <= 1e-6 for r in recs)
    glob = ServerState.from_message(RunDir(tmp_path / "run").load_checkpoint()[1]).glob
    fixed = [k for k in glob if k.endswith((A, B))]
    latent = [k for k in glob if k.endswith(LATENT)]
    assert fixed and all(torch.equal(glob[k], init[k]) for k in fixed)
    assert latent and all(not torch.equal(glob[k], init[k]) for k in latent)
    head = sum(v.numel() for k, v in glob.items() if k.startswith("head."))
    payload = 4 * (len(latent) * R * R + head)  # float32: R of every module and the head, nothing else
    up = [c["bytes_up"] for r in recs for c in r["clients"]]
    down = [c["bytes_down"] for r in recs for c in r["clients"]]
    assert all(payload <= u < payload + 2048 for u in up)
    fixed_bytes = 4 * sum(glob[k].numel() for k in fixed)
    for c in range(3):  # B and A reach each client once, with R in its first round; later rounds send R alone
        down = [x["bytes_down"] for r in recs for x in r["clients"] if x["client"] == c]
        assert down[0] >= fixed_bytes + payload and all(payload <= d < payload + 2048 for d in down[1:])


@pytest.mark.parametrize("over", [{"federation.secure_aggregation": "{}"},
                                  {"method.aggregator.name": "uniform",
                                   "method.wrappers": "[{name: dp_fedavg, clip: 1.0, noise_multiplier: 0.1}]"}])
def test_fed_sb_composes_with_secure_aggregation_and_dp_fedavg(over, tmp_path):
    run_embedded(_cfg(**{"federation.rounds": 2} | over), tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    assert len(recs) == 2 and all(r["num_ok"] == 3 for r in recs)


def test_a_fed_sb_run_resumes_bit_identically_and_exports_the_same_update_to_peft(tmp_path):
    assert_resumes_identically(_cfg(), tmp_path, stop_after_round=2)
    from safetensors.torch import load_file

    from fedpeft.export import export_peft

    out, _ = export_peft(tmp_path / "full", tmp_path / "peft")
    peft = load_file(out / "adapter_model.safetensors")
    glob = ServerState.from_message(RunDir(tmp_path / "full").load_checkpoint()[1]).glob
    for k in (k for k in glob if k.endswith(LATENT)):
        m = k[: -len(LATENT)]
        want = glob[m + B].double() @ glob[k].double() @ glob[m + A].double()
        got = peft["base_model.model." + m + B].double() @ peft["base_model.model." + m + A].double()
        assert float(torch.linalg.norm(got - want) / torch.linalg.norm(want)) < 1e-5
