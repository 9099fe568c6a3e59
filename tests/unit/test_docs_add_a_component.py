"""The "Add a component" page's code runs as the page says: its ``# file: NAME`` blocks are written to a folder and
imported (FedNova and (IA)³ register), each runs a federated round on tiny BERT from the page's own YAML, FedNova
equals its formula on hand-made updates, (IA)³ trains exactly its vectors, leaves the pretrained weights as they
were and exports what peft computes alike, the page's conformance rows give the shared tests, and afterwards
every registry and table is as before (other tests never see the page's components)."""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fedpeft.adapters import ADAPTERS
from fedpeft.aggregators import AGGREGATORS, AggregatorContext
from fedpeft.backbones.loading import PROCESS_CACHE
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.config import ConfigError
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

from tests.conformance import cases
from tests.conformance import test_adapters as shared_adapters
from tests.conformance import test_aggregators as shared_aggregators
from tests.conformance import test_registries as shared_registries

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "add-a-component.md"
BLOCK = re.compile(r"^```(?:python|yaml|toml)\n(# file: (\S+)\n.*?)^```$", re.M | re.S)
MODULES = ("fednova", "ia3", "conformance_plugin")

pytestmark = pytest.mark.usefixtures("one_thread")


def page_text() -> str:
    """The page with its line breaks and runs of spaces as single spaces (a quoted message may wrap)."""
    return " ".join(PAGE.read_text(encoding="utf-8").split())


def page_files() -> dict[str, str]:
    """The page's ``# file: NAME`` blocks, by NAME (the comment line kept: valid Python and YAML)."""
    return {name: body for body, name in BLOCK.findall(PAGE.read_text(encoding="utf-8"))}


def _tables() -> list[dict]:
    """Everything registering the page's components and their conformance rows changes."""
    return [AGGREGATORS._entries, ADAPTERS._entries, *cases.LEAST.values(), cases.AGGREGATOR_CASES,
            cases.ADAPTER_CASES]


@contextlib.contextmanager
def page_components(folder: Path):
    """The page's files in ``folder``, FedNova and (IA)³ imported (registered) from there, and tiny models of their
    own (the IA3 layers are injected into those, not into the ones the process's other tests share); on exit the
    registries, the conformance tables, the imported modules and the model cache are as they were. The registry
    has no public way to remove an entry, hence the snapshot of its table (``dummy_plugin.py`` never needs one: it
    runs in a pytest of its own)."""
    for name, text in page_files().items():
        (folder / name).write_text(text, encoding="utf-8")
    saved = [dict(t) for t in _tables()]
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        mp.setattr(PROCESS_CACHE, "_models", {})
        mp.setattr(PROCESS_CACHE, "loads", {})
        try:
            yield SimpleNamespace(folder=folder, fednova=importlib.import_module("fednova"),
                                  ia3=importlib.import_module("ia3"))
        finally:
            for table, before in zip(_tables(), saved):
                table.clear()
                table.update(before)
            for name in MODULES:
                sys.modules.pop(name, None)


@pytest.fixture
def page(tmp_path):
    folder = tmp_path / "page"
    folder.mkdir()
    with page_components(folder) as ns:
        yield ns


def _tiny(path: Path, **extra: object):
    from conftest import tiny_overrides

    return load_config(path, tiny_overrides(**extra))


def test_the_page_has_its_files_and_cleans_up_after_them(tmp_path):
    assert set(page_files()) == {"fednova.py", "ia3.py", "fednova.yaml", "ia3.yaml", "pyproject.toml",
                                 "conformance_plugin.py"}
    before = [dict(t) for t in _tables()]
    with page_components(tmp_path):
        assert "fednova" in AGGREGATORS and "ia3" in ADAPTERS
    assert "fednova" not in AGGREGATORS and "ia3" not in ADAPTERS
    assert [dict(t) for t in _tables()] == before and not set(MODULES) & set(sys.modules)


# ---------------------------------------------------------------- FedNova


def test_fednova_equals_the_formula_on_two_hand_made_updates(page):
    """x = 0; client 0: n = 1, τ = 1, Δ = [1, 0]; client 1: n = 3, τ = 4, Δ = [0, 4] (the page's table)."""
    entry = AGGREGATORS.entry("fednova")
    glob = {"w": torch.zeros(2)}
    ups = [Update(1, {"w": torch.tensor([0.0, 4.0])}, 3, scalars={"steps": 4, "train_loss": 0.5}),
           Update(0, {"w": torch.tensor([1.0, 0.0])}, 1, scalars={"steps": 1, "train_loss": 0.7})]
    for rho, a1 in ((0.0, 4.0), (0.5, 2 * (0.5 + 0.75 + 0.875 + 0.9375))):  # ‖a‖₁ of 4 momentum steps: 6.125
        agg = entry.obj(entry.settings(), AggregatorContext(2, 0, trainer=SimpleNamespace(momentum=rho)))
        new, state = agg.aggregate(glob, ups, agg.init(glob), 1)
        tau_eff = 0.25 * 1 + 0.75 * a1
        want = tau_eff * (0.25 * torch.tensor([1.0, 0.0]) + 0.75 * torch.tensor([0.0, 4.0]) / a1)
        torch.testing.assert_close(new["w"], want, rtol=1e-6, atol=1e-7)
        assert agg.diagnostics(state) == pytest.approx({"tau_eff": tau_eff})
    torch.testing.assert_close(new["w"], torch.tensor([1.2109375, 2.3724489]), rtol=1e-6, atol=1e-6)
    plain = entry.obj(entry.settings(server_lr=2.0), AggregatorContext(2, 0))  # no trainer settings: ρ = 0
    out, _ = plain.aggregate(glob, ups, Message(), 1)
    torch.testing.assert_close(out["w"], 2 * torch.tensor([0.8125, 2.4375]))  # FedAvg: [0.25, 3.0]


def test_fednova_normaliser_is_what_sgd_with_momentum_does(page):
    """τ SGD steps with momentum ρ on a constant gradient g move the weight by −lr · g · ‖a‖₁."""
    for rho in (0.0, 0.9):
        for steps in (1, 3, 7):
            w = torch.zeros(1, requires_grad=True)
            opt = torch.optim.SGD([w], lr=0.1, momentum=rho)
            for _ in range(steps):
                opt.zero_grad()
                (2.0 * w).sum().backward()  # g = 2
                opt.step()
            assert float(w.detach()) == pytest.approx(-0.1 * 2.0 * page.fednova.normaliser(steps, rho), rel=1e-5)


def test_fednova_round_with_tiered_local_steps(page, tmp_path):
    cfg = _tiny(page.folder / "fednova.yaml", federation__rounds=1, federation__num_clients=4)
    assert cfg.method.aggregator.name == "fednova" and cfg.method.trainer.name == "sgd"
    summary = run_embedded(cfg, tmp_path / "run")
    rec = RunDir(tmp_path / "run").read_metrics()[-1]
    clients = [c for c in rec["clients"] if c["status"] == "ok"]
    steps = sorted({c["steps"] for c in clients})
    # the slow tier's cap; the fast tier's cap of 8 replaces the trainer's, and 48 examples in batches of 8 take 6
    assert steps == [2, 6]
    n = sum(c["num_examples"] for c in clients)
    assert rec["server"]["tau_eff"] == pytest.approx(sum(c["num_examples"] * c["steps"] for c in clients) / n)
    assert summary["backbone_unchanged"] and summary["method_resolved"]["aggregator"] == "fednova"


def test_fednova_is_refused_where_the_page_says(page):
    bad = {"discrete_search": "method.aggregator.name: 'fednova' reads ['steps'] from every client, which neither "
                              "trainer 'discrete_search' nor sharing 'all' uploads"}
    text = page_text()
    for trainer, message in bad.items():
        assert message in text
        with pytest.raises(ConfigError, match=re.escape(message)):
            _tiny(None, method__aggregator__name="fednova", method__trainer__name=trainer,
                  method__adapter__name="token_prompt", method__trainer__max_steps=None,
                  method__trainer__batch_size=None)
    with pytest.raises(ConfigError, match="'fednova' needs each client's update; secure aggregation reveals"):
        _tiny(None, method__aggregator__name="fednova", federation__secure_aggregation__protocol="secaggplus")
    for key, value, message in (("server_lr", 0, "server_lr: Input should be greater than 0"),
                                ("serverlr", 1, "serverlr: unknown field")):
        assert f"method.aggregator.{message}" in text
        with pytest.raises(ConfigError, match=re.escape(message)):
            _tiny(page.folder / "fednova.yaml", **{f"method__aggregator__{key}": value})


# ---------------------------------------------------------------- (IA)³


def _pretrained(model) -> dict[str, torch.Tensor]:
    """The backbone's own weights under their own names (the injected IA3 layers' vectors left out)."""
    return {k.replace(".base_layer.", "."): v.clone() for k, v in model.state_dict().items() if ".ia3_l" not in k}


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's loading
def test_ia3_round_trains_its_vectors_only_and_exports_what_peft_computes(page, tmp_path):
    from peft import PeftModel
    from transformers import AutoConfig

    from fedpeft.backbones.loading import _auto_class, load_backbone
    from fedpeft.experiment import build_experiment
    from fedpeft.export import export_peft
    from fedpeft.predict import open_model

    backbone = load_backbone("tiny-bert")  # this test's own (page_components)
    before = _pretrained(backbone.model)
    cfg = _tiny(page.folder / "ia3.yaml", federation__rounds=1, method__adapter__num_tokens=None)
    summary = run_embedded(cfg, tmp_path / "run")
    c = backbone.model.config
    # keys and values (d each), attention.output.dense's and the feed-forward output.dense's inputs (d, d_ff)
    assert summary["trainable_params"] == c.num_hidden_layers * (3 * c.hidden_size + c.intermediate_size) == 320
    after = _pretrained(backbone.model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    injected = [p for n, p in backbone.model.named_parameters() if ".ia3_l." in n]
    assert len(injected) == 8 and all(not p.requires_grad and p.grad is None and bool((p == 1).all())
                                      for p in injected)

    out, _ = export_peft(tmp_path / "run", tmp_path / "peft")
    assert json.loads((out / "adapter_config.json").read_text())["peft_type"] == "IA3"
    params = open_model(tmp_path / "run").params  # the global vectors after the round, as exported
    assert not all(bool((v == 1).all()) for v in params.values())  # the round moved them
    plain = _auto_class(backbone.family).from_config(AutoConfig.for_model(**c.to_dict()), attn_implementation="eager")
    plain.load_state_dict(before, strict=True)
    theirs = PeftModel.from_pretrained(plain.eval(), str(out))
    exp = build_experiment(cfg)
    clf = exp.objective
    batch = clf.batch(exp.test_encoded, [0, 1, 2])
    with torch.no_grad():
        ours = clf.hidden_states(params, batch)[-1]
        peft_out = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          output_hidden_states=True).hidden_states[-1]
        frozen = clf.hidden_states(clf.init_params(torch.Generator()), batch)[-1]
    torch.testing.assert_close(ours, peft_out, rtol=1e-5, atol=1e-5)
    assert (ours - frozen).abs().max() > 1e-4  # the comparison could fail: the vectors change the forward


# ---------------------------------------------------------------- the conformance rows and the launcher


def test_the_page_rows_give_the_shared_conformance_tests(page, tmp_path):
    text = page_text()
    for axis, name, row in (("aggregator", "fednova", cases.aggregator_case), ("adapter", "ia3", cases.adapter_case)):
        for lookup in (lambda: cases.least(axis, name), lambda: row(name)):
            with pytest.raises(AssertionError) as missing:
                lookup()
            assert str(missing.value) in text  # the page quotes the error a missing row gives
    importlib.import_module("conformance_plugin")
    shared_registries.test_settings_validate_and_document_every_field("aggregator", "fednova")
    shared_registries.test_settings_validate_and_document_every_field("adapter", "ia3")
    agg = shared_aggregators
    for test in (agg.test_declared_as_it_behaves, agg.test_independent_of_the_clients_order, agg.test_fixed_points,
                 agg.test_state_survives_the_codec_and_restrict):
        test("fednova")
    for model, objective in (("tiny-bert", "classification"), ("tiny-llama", "classification"),
                             ("tiny-llama", "generation")):
        folder = tmp_path / f"{model}-{objective}"
        folder.mkdir()
        shared_adapters.test_one_round_without_a_preset("ia3", model, objective, folder)


def test_the_installed_package_gives_the_command_line_both_components(page):
    """The page's pyproject.toml, installed as pip leaves a package (its modules and a .dist-info with the entry
    points): a fresh ``fedpeft`` process knows both components."""
    import os
    import subprocess
    import tomllib

    project = tomllib.loads((page.folder / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["fedpeft.plugins"]
    assert plugins == {"fednova": "fednova", "ia3": "ia3"}
    info = page.folder / "my_fedpeft_components-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-fedpeft-components\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedpeft.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in plugins.items()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(page.folder), str(ROOT)])}
    for name, key in (("fednova", "server_lr"), ("ia3", "feedforward_modules")):
        res = subprocess.run([sys.executable, "-m", "fedpeft.cli", "components", name], env=env, cwd=page.folder,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        assert key in res.stdout
