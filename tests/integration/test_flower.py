"""Flower runtimes: same numbers as embedded, records without pickle, client state, resume, deployment.

The fast tests check the pieces (record packing, client-state files, node config); the slow ones
run real Flower: the simulation runtime (Ray) and a SuperLink + SuperNodes as separate processes
on 127.0.0.1 with free ports, always stopped in ``finally`` (``LocalFederation.__exit__``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_overrides

from fedpeft.comm.codec import Message, decode, encode
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.runtime.session import StopAfterRound
from fedpeft.runtime.threads import usable_cores
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS

flwr = pytest.importorskip("flwr")

from fedpeft.runtime.flower.client_app import owned_clients
from fedpeft.runtime.flower.client_state import ClientStateStore
from fedpeft.runtime.flower.records import Instruction, Reply, count_bytes

FLOWER_ONLY = ("flower_record_bytes", "model_loads")


def _comparable(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS + FLOWER_ONLY} for r in records]


# ---------------------------------------------------------------- fast unit tests


def test_records_carry_codec_bytes_unchanged_and_count_bytes():
    a = encode(Message({"prompt": torch.randn(4, 3)}, {"num_examples": 7}))
    b = encode(Message({"prompt": torch.randn(4, 3)}, {"num_examples": 9}))
    ins = Instruction({0: a, 12: b}, {"round": 3, "config_yaml": "seed: 0\n"})
    content = ins.content()
    back = Instruction.from_content(content)
    assert back.payloads == {0: a, 12: b} and back.settings["round"] == 3
    assert torch.equal(decode(back.payloads[12]).tensors["prompt"], decode(b).tensors["prompt"])
    # Flower's count: array bytes + key names, plus config values
    expected = len(a) + len(b) + len("0") + len("12") + 8 + len("seed: 0\n") + len("round") + len("config_yaml")
    assert count_bytes(content) == expected
    rep = Reply.from_content(Reply({1: a}, {2: "RuntimeError: x"}, {"pid": 5, "backbone_loads": 1}).content())
    assert rep.payloads == {1: a} and rep.errors == {2: "RuntimeError: x"} and rep.node["backbone_loads"] == 1


def test_non_codec_arrays_are_refused():
    from flwr.app import ArrayRecord, RecordDict

    content = RecordDict({"fedpeft.payload": ArrayRecord({"0": flwr.app.Array(torch.zeros(3).numpy())})})
    with pytest.raises(ValueError, match="not a fedpeft codec payload"):
        Instruction.from_content(content)


def test_client_state_store_reads_newest_state_before_the_round(tmp_path):
    store = ClientStateStore(tmp_path)
    assert store.load(0, 5).tensors == {}
    for r in (1, 2, 4):
        store.save(0, r, Message({"m": torch.full((2,), float(r))}, {"r": r}))
    assert store.load(0, 3).scalars == {"r": 2}  # training round 4 reads the state after round 2... here <=3
    assert store.load(0, 4).scalars == {"r": 4}
    assert store.load(0, 0).scalars == {}
    store.prune(0, checkpointed_round=3)  # keep the newest <= 3 (round 2) and everything after it
    assert sorted(p.name for p in (tmp_path / "client_0").iterdir()) == ["round_2.safetensors", "round_4.safetensors"]
    assert store.load(1, 9).scalars == {}


def test_owned_clients_from_node_config():
    assert owned_clients({"partition-ids": "3, 1,1"}) == [1, 3]
    assert owned_clients({"partition-ids": 4}) == [4]
    assert owned_clients({"partition-id": 2, "num-partitions": 5}) == [2]
    with pytest.raises(ValueError, match="partition-ids"):
        owned_clients({})


# ---------------------------------------------------------------- simulation (Ray)


def _cfg(**extra):
    base = {"runtime.threads": 1, "method.trainer.reset_optimizer": False}  # same threads -> same floats
    base.update({k.replace("__", "."): v for k, v in extra.items()})
    return load_config(None, tiny_overrides(**base))


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory):
    """One uninterrupted flower-sim run, the embedded run of the same config, and an interrupted+resumed sim."""
    from fedpeft.runtime.flower.simulation import run_flower_sim

    root = tmp_path_factory.mktemp("flower-sim")
    cfg = _cfg()
    out = {"cfg": cfg, "root": root}
    out["embedded"] = run_embedded(cfg, root / "embedded")
    out["sim"] = run_flower_sim(cfg, root / "sim")
    with pytest.raises(StopAfterRound):
        run_flower_sim(cfg, root / "cut", stop_after_round=1)
    out["cut_records"] = RunDir(root / "cut").read_metrics()
    out["resumed"] = run_flower_sim(cfg, root / "cut", resume=True)
    return out


@pytest.mark.slow
def test_flower_sim_matches_embedded_bit_for_bit(sim_runs):
    root = sim_runs["root"]
    emb, sim = RunDir(root / "embedded").read_metrics(), RunDir(root / "sim").read_metrics()
    assert [r["round"] for r in sim] == [1, 2]
    assert [r["accuracy"] for r in sim] == [r["accuracy"] for r in emb]  # exact float equality
    assert [r["loss"] for r in sim] == [r["loss"] for r in emb]
    assert [(r["bytes_up"], r["bytes_down"], r["eval_bytes_up"], r["eval_bytes_down"]) for r in sim] == \
        [(r["bytes_up"], r["bytes_down"], r["eval_bytes_up"], r["eval_bytes_down"]) for r in emb]
    assert _comparable(sim) == _comparable(emb)  # per-client statuses, losses, local accuracies too
    a = RunDir(root / "embedded").load_checkpoint()[1].tensors
    b = RunDir(root / "sim").load_checkpoint()[1].tensors
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Flower's own record size is the codec bytes plus keys and settings, never less
    for r in sim:
        assert r["flower_record_bytes"]["train_up"] >= r["bytes_up"]
        assert r["flower_record_bytes"]["train_down"] >= r["bytes_down"]
    # one backbone per client process, reused across rounds and clients
    procs = sim_runs["sim"]["flower"]["processes"]
    assert procs and all(p["backbone_loads"] == 1 and p["experiment_builds"] == 1 for p in procs.values())
    assert all(p["messages"] >= 1 for p in procs.values())  # which actor gets which message is Ray's choice
    assert {"config.yaml", "metrics.jsonl", "summary.json", "run.log", "checkpoint"} <= \
        {p.name for p in (root / "sim").iterdir()}


@pytest.mark.slow
def test_flower_sim_resume_gives_uninterrupted_metrics(sim_runs):
    root = sim_runs["root"]
    assert [r["round"] for r in sim_runs["cut_records"]] == [1]
    assert _comparable(RunDir(root / "cut").read_metrics()) == _comparable(RunDir(root / "sim").read_metrics())
    assert sim_runs["resumed"]["final_accuracy"] == sim_runs["sim"]["final_accuracy"]
    # persistent per-client state (Adam moments, reset_optimizer=false) lives in the client-side store
    states = sorted((root / "cut" / "client_state").glob("*/client_*/round_*.safetensors"))
    assert {p.parent.name for p in states} == {"client_0", "client_1", "client_2"}
    assert any("::exp_avg" in k for k in decode(states[-1].read_bytes()).tensors)


@pytest.mark.slow
@pytest.mark.skipif(usable_cores() < 2, reason="with one usable core every runtime computes with one thread")
def test_flower_sim_matches_embedded_at_the_default_threads(tmp_path):
    """runtime.threads unset, as a user runs it: the count is resolved once (2 on 2 cores, not 1) and the Ray
    actors' ClientApps compute with it too, so the numbers are the embedded runtime's. On MiniLM, whose matrix
    products sum in another order at another thread count (the tiny model's do not)."""
    from fedpeft.runtime.flower.simulation import run_flower_sim

    cfg = load_config(None, tiny_overrides(model__name="minilm", method__trainer__reset_optimizer=False))
    assert cfg.runtime.threads is None
    old = torch.get_num_threads()
    torch.set_num_threads(2)  # a plain process's count on 2 cores (conftest gives pytest-xdist workers fewer)
    try:
        emb = run_embedded(cfg, tmp_path / "embedded")
        sim = run_flower_sim(cfg, tmp_path / "sim")
    finally:
        torch.set_num_threads(old)
    assert emb["threads"] == sim["threads"] == 2
    assert {p["threads"] for p in sim["flower"]["processes"].values()} == {2}  # every client process used them
    assert _comparable(RunDir(tmp_path / "sim").read_metrics()) == \
        _comparable(RunDir(tmp_path / "embedded").read_metrics())  # train losses, accuracies, bytes: bit for bit
    a = RunDir(tmp_path / "embedded").load_checkpoint()[1].tensors
    b = RunDir(tmp_path / "sim").load_checkpoint()[1].tensors
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_fedbpt_on_flower_sim_matches_embedded(tmp_path):
    """The black-box method crosses Flower as it crosses the embedded runtime: same CMA-ES state, same bytes."""
    from fedpeft.runtime.flower.simulation import run_flower_sim

    cfg = _cfg(method__name="fedbpt", method__adapter__num_tokens=3, method__adapter__intrinsic_dim=16,
               method__trainer__iterations=2, method__trainer__max_steps=None, method__trainer__batch_size=None,
               method__trainer__reset_optimizer=None)
    run_embedded(cfg, tmp_path / "embedded")
    summary = run_flower_sim(cfg, tmp_path / "sim")
    emb, sim = RunDir(tmp_path / "embedded").read_metrics(), RunDir(tmp_path / "sim").read_metrics()
    assert _comparable(sim) == _comparable(emb)  # accuracies, losses, sigma', bytes up/down, per client
    assert summary["upload_tensor_bytes"] == (16 + 2 + 1) * 4  # z, the I sigmas, the loss
    assert all("sigma_prime" in r["server"] for r in sim)
    a = RunDir(tmp_path / "embedded").load_checkpoint()[1].tensors
    b = RunDir(tmp_path / "sim").load_checkpoint()[1].tensors
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_discrete_prompt_on_flower_sim_matches_embedded(tmp_path):
    """Token-index uploads, the stateful LASSO download (clients keep p' between rounds), a non-participant and
    post-tuning cross Flower as they cross the embedded runtime: same metrics and bytes, same final state."""
    from fedpeft.runtime.flower.simulation import run_flower_sim

    cfg = _cfg(method__name="discrete-prompt", method__adapter__num_tokens=3, method__trainer__steps=3,
               method__trainer__max_steps=None, method__trainer__batch_size=None,
               method__trainer__reset_optimizer=None, method__downlink__stage1=20,
               method__post_tuning__iterations=2, method__post_tuning__intrinsic_dim=8,
               method__post_tuning__popsize=4, method__post_tuning__shots=2, federation__num_clients=4,
               federation__clients_per_round=2, federation__non_participants__fraction=0.25, federation__rounds=3)
    run_embedded(cfg, tmp_path / "embedded")
    run_flower_sim(cfg, tmp_path / "sim")
    emb, sim = RunDir(tmp_path / "embedded").read_metrics(), RunDir(tmp_path / "sim").read_metrics()
    assert _comparable(sim) == _comparable(emb)
    assert "local_accuracy_NP" in sim[-1] and "local_accuracy_global_P" in sim[-1]
    a = RunDir(tmp_path / "embedded").load_checkpoint()[1].tensors
    b = RunDir(tmp_path / "sim").load_checkpoint()[1].tensors
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


LORA_TIERS = [{"name": "small", "share": 0.5, "rank": 2}, {"name": "large", "share": 0.5, "rank": 4}]


@pytest.mark.slow
@pytest.mark.parametrize("preset, extra", [
    ("fedsa-lora", {}),  # each client's B in the client-state store, never sent
    ("hetlora", {"federation__client_profiles": LORA_TIERS, "method__sharing__self_prune": True}),  # per-client ranks
    ("flexlora", {"federation__client_profiles": LORA_TIERS}),  # per-client truncated SVD downloads
    ("flora", {"federation__client_profiles": LORA_TIERS, "method__trainer__reset_optimizer": True}),  # a growing stack
    ("hetlora", {"federation__client_profiles": LORA_TIERS, "method__exchange": "[ranks, fedsa]",
                 "method__aggregator__name": "fedavg", "model__readout": "linear"}),  # a chain: ranks, private B
    ("headprune", {"method__exchange": "[head_pruning, private]", "model__readout": "linear"}),  # private head
    ("fed-sb", {"model__readout": "linear"}),  # B and A sent once, then kept on the client
], ids=["fedsa-lora", "hetlora", "flexlora", "flora", "ranks+fedsa", "head_pruning+private", "fed-sb"])
def test_the_lora_family_on_flower_sim_matches_embedded(preset, extra, tmp_path):
    """Personal factors, per-client ranks and downloads, and a growing stack cross Flower as they cross the
    embedded runtime: the same metrics, per-client records and bytes, and the same final state."""
    from fedpeft.runtime.flower.simulation import run_flower_sim

    cfg = _cfg(method__name=preset, method__adapter__num_tokens=None, method__adapter__r=4, federation__rounds=2,
               **extra)
    run_embedded(cfg, tmp_path / "embedded")
    run_flower_sim(cfg, tmp_path / "sim")
    emb, sim = RunDir(tmp_path / "embedded").read_metrics(), RunDir(tmp_path / "sim").read_metrics()
    assert _comparable(sim) == _comparable(emb)
    a = RunDir(tmp_path / "embedded").load_checkpoint()[1]
    b = RunDir(tmp_path / "sim").load_checkpoint()[1]
    assert a.tensors.keys() == b.tensors.keys() and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert a.scalars == b.scalars  # e.g. HetLoRA's clients' current ranks


@pytest.mark.slow
def test_fedpeft_run_cli_with_flower_sim_runtime(tmp_path):
    from typer.testing import CliRunner

    from fedpeft.cli import app

    args = ["run", "--runtime", "flower-sim", "--out", str(tmp_path / "run"), "--quiet"]
    for item in tiny_overrides(**{"federation.rounds": 1, "evaluation.local": False}):
        args += ["--set", item]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "final accuracy" in res.output
    assert RunDir(tmp_path / "run").read_metrics()[0]["num_ok"] == 3


# ---------------------------------------------------------------- deployment (SuperLink + SuperNodes)


def _wait_for(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.5)
    raise TimeoutError(f"'{text}' did not appear in {path} within {timeout:.0f} s")


@pytest.mark.slow
def test_deployment_superlink_and_two_supernodes(tmp_path):
    from fedpeft.runtime.flower.deployment import run_flower
    from fedpeft.runtime.flower.local import LocalFederation

    cfg = _cfg(federation__num_clients=2, evaluation__local=False)
    with LocalFederation(tmp_path / "fed") as fed:
        fed.start_superlink()
        fed.start_node("node0", [0])
        fed.start_node("node1", [1])
        summary = run_flower(cfg, tmp_path / "run", superlink=fed.address, timeout=420, insecure=True)
        assert all(p.alive() for p in fed.nodes.values())
        # the same federation under secure aggregation (SecAgg+ between the two nodes): every client aggregated
        secure = _cfg(federation__num_clients=2, evaluation__local=False, federation__rounds=1,
                      federation__secure_aggregation={"num_shares": 1.0, "reconstruction_threshold": 1.0})
        run_flower(secure, tmp_path / "secure", superlink=fed.address, timeout=420, insecure=True)
    secure_records = RunDir(tmp_path / "secure").read_metrics()
    assert secure_records[0]["num_ok"] == 2
    assert secure_records[0]["bytes_up"] > RunDir(tmp_path / "run").read_metrics()[0]["bytes_up"]  # the protocol's
    records = RunDir(tmp_path / "run").read_metrics()
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["num_ok"] == 2 and r["num_failed"] == 0 for r in records)
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint/meta.json", "run.log"):
        assert (tmp_path / "run" / name).exists(), name
    assert summary["rounds"] == 2 and summary["runtime"] == "flower"
    emb = run_embedded(cfg, tmp_path / "embedded")
    assert summary["bytes_up_total"] == emb["bytes_up_total"]
    assert summary["bytes_down_total"] == emb["bytes_down_total"]
    assert [r["accuracy"] for r in records] == [r["accuracy"] for r in RunDir(tmp_path / "embedded").read_metrics()]
    # client state went to each node's own state dir, not the server's run dir
    assert list((tmp_path / "fed" / "state" / "node0").glob("*/client_0/round_2.safetensors"))
    assert list((tmp_path / "fed" / "state" / "node1").glob("*/client_1/round_2.safetensors"))
    # one long-lived worker per node served both rounds: one backbone load per node per run
    assert summary["flower"]["client_processes"] == 2
    assert all(p["backbone_loads"] == 1 and p["messages"] == 2 for p in summary["flower"]["processes"].values())
    assert records[0]["model_loads"] == records[1]["model_loads"]  # the same two pids, one load each


@pytest.mark.slow
def test_killed_supernode_round_completes_and_node_rejoins(tmp_path):
    from fedpeft.runtime.flower.deployment import run_flower
    from fedpeft.runtime.flower.local import LocalFederation

    cfg = _cfg(federation__rounds=3, federation__min_clients=2, evaluation__local=False)
    run_dir = tmp_path / "run"
    import threading

    with LocalFederation(tmp_path / "fed") as fed:
        fed.start_superlink()
        for i in range(3):
            fed.start_node(f"node{i}", [i])
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(
            s=run_flower(cfg, run_dir, superlink=fed.address, rejoin_wait=120.0, timeout=540, insecure=True)),
            daemon=True)
        t.start()
        try:
            _wait_for(run_dir / "run.log", "round 1: accuracy", 300)
            fed.nodes["node2"].stop(signal.SIGKILL)  # mid round 2: its message is pulled or about to be
            _wait_for(run_dir / "run.log", "failed during train", 240)
            fed.start_node("node2-restarted", [2], state_dir=tmp_path / "fed" / "state" / "node2")
            t.join(480)
        finally:
            if t.is_alive():
                fed.stop()
                t.join(30)
    assert "s" in result, "the run did not finish"
    records = RunDir(run_dir).read_metrics()
    assert [r["round"] for r in records] == [1, 2, 3]
    assert records[0]["num_ok"] == 3
    assert records[1]["num_ok"] == 2 and records[1]["num_failed"] == 1
    assert {c["client"]: c["status"] for c in records[1]["clients"]}[2] == "failed"
    assert records[2]["num_ok"] == 3  # the restarted node serves client 2 again
    log = (run_dir / "run.log").read_text()
    assert "SuperNode" in log and "client 2 failed" in log
    assert result["s"]["flower"]["node_failures"][0]["clients"] == [2]


@pytest.mark.slow
def test_deployment_over_tls_admits_only_registered_supernodes(tmp_path):
    """TLS with certificates made here and SuperNode authentication: the two registered nodes run the federation;
    a third node with an unregistered key (claiming client 1) is refused by the SuperLink and never serves, and a
    fourth, registered but bound to no client, has its claim of client 1 refused by the run's node registry."""
    from fedpeft.runtime.flower.deployment import run_flower
    from fedpeft.runtime.flower.local import LocalFederation
    from fedpeft.runtime.flower.node_registry import owners, record
    from fedpeft.runtime.flower.security import make_certificates, make_node_key

    certs = make_certificates(tmp_path / "certs")
    keys = {n: make_node_key(tmp_path / "keys", n) for n in ("node0", "node1", "intruder", "rogue")}
    cfg = _cfg(federation__num_clients=2, federation__rounds=1, evaluation__local=False)
    registry = tmp_path / "nodes.json"
    with LocalFederation(tmp_path / "fed", certs=certs, node_auth=True) as fed:
        fed.start_superlink()
        for n, clients in (("node0", [0]), ("node1", [1]), ("rogue", [])):
            record(registry, fed.register(keys[n].public), keys[n].public, clients)
        fed.start_node("intruder", [1], auth_key=keys["intruder"].private)
        fed.start_node("rogue", [1], auth_key=keys["rogue"].private)
        fed.start_node("node0", [0], auth_key=keys["node0"].private)
        fed.start_node("node1", [1], auth_key=keys["node1"].private)
        summary = run_flower(cfg, tmp_path / "run", superlink=fed.address, timeout=420, root_cert=certs.ca_cert,
                             registry=registry)
        intruder_log = (tmp_path / "fed" / "intruder.log").read_text()
        rogue_log = (tmp_path / "fed" / "rogue.log").read_text()
        intruder_alive = fed.nodes["intruder"].alive()
    records = RunDir(tmp_path / "run").read_metrics()
    assert records[0]["num_ok"] == 2 and summary["flower"]["client_processes"] == 2
    assert "Failed to activate SuperNode" in intruder_log and not intruder_alive  # Flower exit code 305
    assert "served train" not in intruder_log and "served train" not in rogue_log
    run_log = (tmp_path / "run" / "run.log").read_text()
    assert "claims client 1, which the registry binds to node" in run_log and set(owners(registry)) == {0, 1}
    # submitted as the FAB v1 app in the run directory (`flwr run` builds it as `flwr build` does): the embedded
    # run's records, bytes included, to the last digit
    assert (tmp_path / "run" / "flower-app" / "LICENSE").exists()
    run_embedded(cfg, tmp_path / "embedded")
    assert _comparable(records) == _comparable(RunDir(tmp_path / "embedded").read_metrics())


def _own_address() -> str | None:
    """This machine's address on its default route (not loopback), if it has one."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # UDP: sends nothing, picks the route
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


@pytest.mark.slow
@pytest.mark.skipif(_own_address() is None, reason="no non-loopback address to connect from")
def test_superlink_refuses_a_submission_from_a_non_loopback_address(tmp_path):
    """`fedpeft flower superlink --host 0.0.0.0`'s SuperLink: a `flwr run` from this machine's network address (not
    loopback) is refused with 403 and starts no run; `flwr ls` over loopback is answered and lists none."""
    import subprocess

    from fedpeft.runtime.flower.deployment import run_flower
    from fedpeft.runtime.flower.local import BIN, LocalFederation, flower_env, flwr_home

    ip = _own_address()
    with LocalFederation(tmp_path / "fed", host="0.0.0.0") as fed:
        fed.start_superlink()
        with pytest.raises(RuntimeError, match="exited with 1"):
            run_flower(_cfg(), tmp_path / "run", superlink=f"{ip}:{fed.port}", timeout=120, insecure=True)
        home = flwr_home(tmp_path / "home", f"127.0.0.1:{fed.port}")
        listed = subprocess.run([str(BIN / "flwr"), "ls"], env=flower_env() | {"FLWR_HOME": str(home)},
                                capture_output=True, text=True, timeout=120)
        link_log = (tmp_path / "fed" / "superlink.log").read_text()
    assert "does not answer" in (tmp_path / "run" / "flwr_run.log").read_text()
    assert f"refused POST /v1/control/start-run from {ip}" in link_log
    assert listed.returncode == 0 and "Listing all runs" in listed.stdout
    assert "StartRun" not in link_log and "Starting Flower ServerApp" not in link_log


def test_discovery_refuses_a_second_claim_and_oversized_or_malformed_replies(caplog):
    """A node claiming a client that a live node serves is refused (the first claim holds while its node lives);
    a reply naming more ids than MAX_CLAIMS, or ids that are not integers, is ignored whole."""
    from types import SimpleNamespace

    from fedpeft.runtime.flower.records import CLIENTS
    from fedpeft.runtime.flower.transport import MAX_CLAIMS, FlowerTransport

    def reply(node, ids):
        content = SimpleNamespace(config_records={CLIENTS: {"client_ids": ids}})
        return SimpleNamespace(has_error=lambda: False, metadata=SimpleNamespace(src_node_id=node), content=content)

    answers = {1: reply(1, [0, 1]), 2: reply(2, [1, 2, 7]), 3: reply(3, list(range(MAX_CLAIMS + 1))),
               4: reply(4, ["0"]), 5: reply(5, [3, 3])}
    grid = SimpleNamespace(get_node_ids=lambda: [1, 2, 3, 4, 5])
    t = FlowerTransport(grid, {"run_key": "k"}, num_clients=4)
    t._exchange = lambda msgs, timeout: {m.metadata.dst_node_id: answers[m.metadata.dst_node_id] for m in msgs}
    from fedpeft.runtime.secure.inprocess import task_identity

    with caplog.at_level("WARNING"), task_identity():
        t._discover(wait=0)
    assert t.owner == {0: 1, 1: 1, 2: 2, 3: 5}
    assert "node 2 claims client 1, which node 1 serves; refused" in caplog.text
    assert "clients [7] outside the run's 4 clients" in caplog.text
    assert f"node 3: malformed discovery reply (ValueError: client_ids must be a list of at most {MAX_CLAIMS}" \
        in caplog.text and "node 4: malformed discovery reply" in caplog.text
