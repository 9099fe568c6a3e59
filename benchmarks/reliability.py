"""Reliability and security, measured (benchmarks/results/reliability.md): the long sweep of what
``tests/unit/test_reliability.py`` checks on a few cases, with the same strategies and checks.

Sections (``--sections``; each writes its rows, the file says which sections ran):
- ``replies``: hypothesis-fuzzed replies per category (message level: keys, shapes, dtypes, NaN/Inf, scalars;
  byte level: truncated, random, forged header length or header, oversized) on three reply schemas (FedPrompt's
  soft prompt, FedBPT's CMA-ES distribution, the discrete prompt's uint16 indices): tried, rejected, left out of
  the aggregate, server exceptions (must be 0).
- ``configs``: hypothesis-fuzzed ``--set`` overrides: resolved, refused with an error naming the field, anything
  else (must be 0).
- ``faults``: injected client failures, random failures with ``min_clients`` (skip and stop), replies past the
  round deadline, on the embedded runtime and on a Flower simulation: rounds completed/failed against the
  seeded prediction, byte accounting, the server state unchanged by failed rounds.
- ``crashes``: ``fedpeft run`` (embedded, and ``--runtime flower-sim``) killed with SIGKILL at random moments
  (seeded), resumed until done: metrics and final server state against an uninterrupted run.
- ``audit``: every reply of a full run of every preset through ``fedpeft.runtime.audit``.
- ``tls``: a TLS deployment with SuperNode authentication: registered nodes serve, an unregistered node and a
  plain-text node are refused.
- ``attacks``: a malicious SecAgg+ server (``runtime.secure.adversary``) and what a dishonest server or node tries
  against a node's policy, the node registry and the server's checks: tried, refused, a client's update recovered.
- ``drops``: SecAgg+ clients dropped at each protocol stage: rounds completed, the mean that of the survivors.
- ``tamper``: damaged checkpoints and run directories, and bad inputs to ``fedpeft run``: a stated recovery or one
  clean error, and nothing written by a run refused before it starts.

    python -m benchmarks.reliability                               # all sections (~15 min on 2 cores)
    python -m benchmarks.reliability --sections replies configs --examples 1000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:  # the test modules import their conftest as pytest does
    sys.path.insert(0, str(ROOT / "tests"))

from tests.conftest import tiny_overrides  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tests.unit.test_reliability import (BYTE_KINDS, MESSAGE_KINDS, OVERRIDES, bad_bytes,  # noqa: E402
                                         bad_messages, make_round_one, rejected)

from fedpeft.comm.codec import decode, encode, own_dtypes  # noqa: E402
from fedpeft.config import ConfigError  # noqa: E402
from fedpeft.resolve import load_config  # noqa: E402
from fedpeft.runtime.faults import fails  # noqa: E402
from fedpeft.tracking.rundir import RunDir  # noqa: E402
from fedpeft.tracking.summary import TIMING_FIELDS  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "reliability.md"
SCHEMAS = {  # name -> overrides of the tiny config (None drops a tiny default)
    "FedPrompt (soft prompt, float32)": {},
    "FedBPT (z, sigma, C, loss)": {"method.name": "fedbpt", "method.adapter.num_tokens": 3,
                                   "method.adapter.intrinsic_dim": 8, "method.trainer.iterations": 2,
                                   "method.trainer.max_steps": None, "method.trainer.batch_size": None},
    "discrete prompt (uint16 indices)": {"method.name": "discrete-prompt", "model.name": "tiny-llama",
                                         "method.adapter.num_tokens": 3, "method.trainer.steps": 2,
                                         "method.trainer.max_steps": None, "method.trainer.batch_size": None},
}


def _records(root: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in RunDir(root).read_metrics()]


# ---------------------------------------------------------------- replies


def fuzz_replies(args) -> list[str]:
    rows = ["| reply schema | category | tried | rejected | left out of the aggregate | server exceptions |",
            "|---|---|---|---|---|---|"]
    for label, over in SCHEMAS.items():
        fixture = make_round_one(**{k.replace('.', '__'): v for k, v in over.items()})
        valid0, schema = decode(fixture[3][0]), fixture[5]
        for kind in MESSAGE_KINDS + BYTE_KINDS:
            c: Counter = Counter()
            strategy = (bad_messages(valid0, schema, kind).map(lambda m: encode(m, own_dtypes(m)))
                        if kind in MESSAGE_KINDS else bad_bytes(fixture[3][0], kind))

            @settings(max_examples=args.examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(bad=strategy)
            def sweep(bad):
                c["tried"] += 1
                try:
                    is_rejected, left_out, _ = rejected(fixture, bad)
                except Exception:  # noqa: BLE001 - counted: must stay 0
                    c["crashed"] += 1
                    return
                c["rejected"] += is_rejected
                c["left_out"] += left_out

            sweep()
            rows.append(f"| {label} | {kind} | {c['tried']} | {c['rejected']} | {c['left_out']} | {c['crashed']} |")
            print(rows[-1], flush=True)
    return rows


# ---------------------------------------------------------------- configs


def fuzz_configs(args) -> list[str]:
    c: Counter = Counter()

    @settings(max_examples=args.examples * 5, deadline=None, database=None, derandomize=True)
    @given(overrides=OVERRIDES)
    def sweep(overrides):
        c["tried"] += 1
        try:
            load_config(None, overrides)
            c["resolved"] += 1
        except ConfigError as e:
            keys = [o.split("=", 1)[0].strip() for o in overrides if "=" in o]
            named = "--set expects key=value" in str(e) or any(
                p and p in str(e) for k in keys for p in (k, k.split(".")[-1], k.split(".")[0]))
            c["named" if named else "unnamed"] += 1
        except Exception:  # noqa: BLE001 - counted: must stay 0
            c["other"] += 1

    sweep()
    return ["| tried | resolved | refused, naming the field | refused without naming it | other exceptions |",
            "|---|---|---|---|---|",
            f"| {c['tried']} | {c['resolved']} | {c['named']} | {c['unnamed']} | {c['other']} |"]


# ---------------------------------------------------------------- faults


def _tiny(**extra) -> list[str]:
    return tiny_overrides(runtime__threads=1, evaluation__round_zero=True, **extra)


def fault_runs(args, work: Path) -> list[str]:
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.runtime.server import RoundFailed

    rows = ["| scenario | runtime | rounds | failed rounds (expected = seeded prediction) | as expected | "
            "bytes accounted | state unchanged by failed rounds |", "|---|---|---|---|---|---|---|"]
    scenarios = {
        "client 1 fails every round": dict(federation__rounds=10, faults__fail_clients=[1]),
        "10 % random failures, min_clients = all 5, skip": dict(
            federation__rounds=args.fault_rounds, federation__num_clients=5, federation__min_clients=5,
            federation__on_round_failure="skip", faults__fail_rate=0.1),
        "10 % random failures, min_clients = 4 of 5, skip": dict(
            federation__rounds=args.fault_rounds, federation__num_clients=5, federation__min_clients=4,
            federation__on_round_failure="skip", faults__fail_rate=0.1),
        "client 2 replies 1.0 s late (deadline 0.5 s) in rounds 2, 4": dict(
            federation__rounds=5, federation__round_timeout=0.5, faults__hang_clients=[2], faults__hang_s=1.0,
            faults__rounds=[2, 4]),
    }
    for name, extra in scenarios.items():
        cfg = load_config(None, _tiny(**extra))
        n = cfg.federation.num_clients
        late = set(cfg.faults.rounds or []) if cfg.faults.hang_clients else set()
        down = {r: sum(fails(cfg.faults, cfg.seed, r, c) for c in range(n)) + (len(cfg.faults.hang_clients)
                                                                              if r in late else 0)
                for r in range(1, cfg.federation.rounds + 1)}
        want = [r for r, k in down.items() if n - k < cfg.federation.min_clients]
        out = work / f"faults-{len(rows)}"
        run_embedded(cfg, out)
        recs = RunDir(out).read_metrics()
        got = [r["round"] for r in recs if "round_failed" in r]
        expected = got == want and all(r["num_failed"] == down[r["round"]] for r in recs if r["round"] > 0)
        bytes_ok = all(r["bytes_up"] == sum(c["bytes_up"] for c in r["clients"] if c["status"] != "failed")
                       for r in recs)
        by_round = {r["round"]: r for r in recs}
        unchanged = all((by_round[r]["accuracy"], by_round[r]["loss"]) == (by_round[r - 1]["accuracy"],
                                                                           by_round[r - 1]["loss"]) for r in got)
        rows.append(f"| {name} | embedded | {cfg.federation.rounds} | {got or '–'} ({want or '–'}) | "
                    f"{'yes' if expected else 'NO'} | {'yes' if bytes_ok else 'NO'} | "
                    f"{'yes' if unchanged else 'NO'} |")
        print(rows[-1], flush=True)
    # stop: the run ends at the first failing round with nothing of it applied; resume without faults finishes
    cfg = load_config(None, _tiny(federation__rounds=6, federation__min_clients=3, faults__fail_clients=[0],
                                  faults__rounds=[4]))
    out = work / "faults-stop"
    try:
        run_embedded(cfg, out)
        stopped = False
    except RoundFailed:
        stopped = [r["round"] for r in RunDir(out).read_metrics()][-1] == 3 and RunDir(out).load_checkpoint()[0] == 3
    rows.append(f"| client 0 fails in round 4, min_clients = all 3, stop | embedded | 6 | stopped after round 3, "
                f"checkpoint of round 3 kept | {'yes' if stopped else 'NO'} | – | – |")
    # the same injected failure on a Flower simulation: records identical to the embedded runtime's
    from fedpeft.runtime.flower.simulation import run_flower_sim

    cfg = load_config(None, _tiny(federation__rounds=3, faults__fail_clients=[1], evaluation__local=False))
    run_embedded(cfg, work / "faults-emb")
    run_flower_sim(cfg, work / "faults-sim")
    same = _strip_flower(_records(work / "faults-sim")) == _strip_flower(_records(work / "faults-emb"))
    statuses = {c["client"]: c["status"] for c in RunDir(work / "faults-sim").read_metrics()[-1]["clients"]}
    rows.append(f"| client 1 fails every round | Flower simulation | 3 | – (–) | "
                f"{'yes' if statuses == {0: 'ok', 1: 'failed', 2: 'ok'} else 'NO'} | "
                f"{'yes, identical to embedded' if same else 'NO: differs from embedded'} | – |")
    return rows


def _strip_flower(recs: list[dict]) -> list[dict]:
    """Records without what names processes (pids, Flower's record bytes) or error texts."""
    drop = {"flower_record_bytes", "model_loads"}
    out = []
    for r in recs:
        r = {k: v for k, v in r.items() if k not in drop}
        r["clients"] = [{k: v for k, v in c.items() if k != "error"} for c in r["clients"]]
        out.append(r)
    return out


# ---------------------------------------------------------------- crashes


def _cli(out: Path, sets: list[str], runtime: str, resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fedpeft.cli", "run", "--quiet", "--out", str(out), "--runtime", runtime, *sets,
           *(["--resume"] if resume else [])]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=os.environ | {"PYTHONPATH": str(ROOT / "tests")})


def crash_runs(args, work: Path) -> list[str]:
    rows = ["| runtime | trials | kills landed | resumes | identical metrics and final state | kill times (s) |",
            "|---|---|---|---|---|---|"]
    rng = random.Random(0)
    for runtime, trials, rounds in (("embedded", args.crash_trials, 8), ("flower-sim", args.sim_crash_trials, 3)):
        sets = [a for o in _tiny(federation__rounds=rounds, method__trainer__reset_optimizer=False,
                                 evaluation__local=runtime == "embedded")
                for a in ("--set", o)]
        full = work / f"crash-{runtime}-full"
        t0 = time.monotonic()
        assert _cli(full, sets, runtime, False).wait() == 0, f"{runtime}: the uninterrupted run failed"
        span = time.monotonic() - t0
        kills, resumes, identical, times = 0, 0, 0, []
        for trial in range(trials):
            out = work / f"crash-{runtime}-{trial}"
            resume = False
            for _ in range(3):  # up to three kills per trial, each at a uniform moment of a whole run
                p = _cli(out, sets, runtime, resume)
                at = rng.uniform(0.2, 1.0) * span
                try:
                    p.wait(at)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    kills += 1
                    times.append(at)
                resume = True
                if (out / "summary.json").exists():
                    break
            if not (out / "summary.json").exists():
                resumes += 1
                _cli(out, sets, runtime, True).wait()
            else:
                resumes += resume
            a, b = RunDir(full).load_checkpoint()[1], RunDir(out).load_checkpoint()[1]
            got, want = _strip_flower(_records(out)), _strip_flower(_records(full))  # pids differ, nothing else may
            same = got == want and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
            identical += same
            diff = sorted({k for g, w in zip(got, want) for k in g.keys() | w.keys() if g.get(k) != w.get(k)})
            print(f"{runtime} trial {trial}: {'identical' if same else f'DIFFERENT in {diff}'}", flush=True)
        spread = f"{min(times):.1f}–{max(times):.1f} of a {span:.0f} s run" if times else "–"
        rows.append(f"| {runtime} | {trials} | {kills} | {resumes} | {identical} / {trials} | {spread} |")
    return rows


# ---------------------------------------------------------------- payload audit


def audit_runs(args, work: Path) -> list[str]:
    from fedpeft.experiment import build_experiment
    from fedpeft.methods import PRESETS
    from fedpeft.runtime.audit import FULL_MODEL_PRESETS, audit_reply
    from fedpeft.runtime.embedded import run_embedded

    from tests.conformance.test_presets import _cfg  # the smallest settings that exercise each preset

    rows = ["| preset | model | replies audited | problems |", "|---|---|---|---|"]
    for preset in PRESETS.names():
        for model in ("tiny-bert", "tiny-llama"):
            cfg = _cfg(preset, model)
            exp = build_experiment(cfg)
            seen: dict[tuple[int, int], bytes] = {}
            run_embedded(cfg, work / f"audit-{preset}-{model}", experiment=exp,
                         reply_hook=lambda r, c, d: seen.setdefault((r, c), d))
            problems = [p for (r, c), d in seen.items() for p in audit_reply(d, exp, c, preset in FULL_MODEL_PRESETS)]
            rows.append(f"| {preset} | {model} | {len(seen)} | {len(problems) or 0}"
                        f"{' (' + problems[0] + ')' if problems else ''} |")
    return rows


# ---------------------------------------------------------------- TLS and node authentication


def tls_checks(args, work: Path) -> list[str]:
    from fedpeft.runtime.flower.deployment import run_flower
    from fedpeft.runtime.flower.local import LocalFederation, free_port, start, supernode_cmd
    from fedpeft.runtime.flower.security import make_certificates, make_node_key

    from fedpeft.runtime.flower.node_registry import record

    certs = make_certificates(work / "certs")
    keys = {n: make_node_key(work / "keys", n) for n in ("node0", "node1", "intruder", "rogue")}
    cfg = load_config(None, _tiny(federation__num_clients=2, federation__rounds=2, evaluation__local=False))
    checks = []
    registry = work / "nodes.json"
    with LocalFederation(work / "fed", certs=certs, node_auth=True) as fed:
        fed.start_superlink()
        for n, clients in (("node0", [0]), ("node1", [1]), ("rogue", [])):
            record(registry, fed.register(keys[n].public), keys[n].public, clients)
        fed.start_node("intruder", [1], auth_key=keys["intruder"].private)
        fed.start_node("rogue", [1], auth_key=keys["rogue"].private)
        fed.nodes["insecure"] = start("insecure", supernode_cmd(fed.address, [0], free_port(), auth_key=keys[
            "node0"].private), work / "fed" / "insecure.log")  # a registered key, but no TLS
        fed.start_node("node0", [0], auth_key=keys["node0"].private)
        fed.start_node("node1", [1], auth_key=keys["node1"].private)
        summary = run_flower(cfg, work / "tls-run", superlink=fed.address, timeout=600, root_cert=certs.ca_cert,
                             registry=registry)
        intruder_log = (work / "fed" / "intruder.log").read_text()
        rogue_log = (work / "fed" / "rogue.log").read_text()
        insecure_log = (work / "fed" / "insecure.log").read_text()
        recs = [r for r in RunDir(work / "tls-run").read_metrics() if r["round"] > 0]
        checks.append(("registered nodes over TLS run the federation (every round: both clients ok)",
                       len(recs) == 2 and all(r["num_ok"] == 2 for r in recs) and summary["rounds"] == 2))
        checks.append(("an unregistered node is refused (Flower exit code 305) and never served",
                       "Failed to activate SuperNode" in intruder_log and "served train" not in intruder_log))
        checks.append(("a registered node bound to no client by the registry claims client 1 and is refused, never "
                       "served", "which the registry binds to node" in (work / "tls-run" / "run.log").read_text()
                       and "served train" not in rogue_log))
        checks.append(("a plain-text node cannot reach the TLS SuperLink and is never served",
                       "served train" not in insecure_log))
        try:
            run_flower(cfg, work / "plain-run", superlink=fed.address, timeout=120, insecure=True)
            checks.append(("a plain-text `flwr run` against the TLS SuperLink is refused", False))
        except (RuntimeError, subprocess.TimeoutExpired):
            checks.append(("a plain-text `flwr run` against the TLS SuperLink is refused", True))
    try:
        run_flower(cfg, work / "no-tls", superlink=fed.address)
        refused = False
    except ValueError:
        refused = True
    checks.append(("`fedpeft flower run` without --root-certificates or --insecure is refused", refused))
    return ["| check | holds |", "|---|---|"] + [f"| {c} | {'yes' if ok else 'NO'} |" for c, ok in checks]


# ---------------------------------------------------------------- a malicious server, a dishonest node


def _secure_nodes(node_config=None):
    """Five in-process SecAgg+ nodes (one client each), their updates, and their instructions."""
    from fedpeft.comm.codec import Message
    from fedpeft.runtime.secure.protocol import node_handler, node_id

    def update(c):
        return {"w": torch.randn(6, 7, generator=torch.Generator().manual_seed(c)) * 0.1}

    def run_node(settings, payloads):
        return {c: encode(Message(update(c), {"num_examples": 100 + c})) for c in payloads}, {}

    clients = range(5)
    handlers = {node_id(c): node_handler(run_node, node_id(c), node_config) for c in clients}
    groups = {node_id(c): {c: encode(Message(scalars={"round": 1}))} for c in clients}
    return handlers, groups, update


def attack_checks(args, work: Path) -> list[str]:
    import numpy as np

    from fedpeft.config import SecureAggregationConfig
    from fedpeft.runtime.node_policy import NodePolicy, PolicyError, state_root
    from fedpeft.runtime.secure.adversary import run_attack
    from fedpeft.runtime.secure.protocol import node_id

    rows = []
    majority, minority = (SecureAggregationConfig(num_shares=5, reconstruction_threshold=t) for t in (3, 2))
    cases = [("both survivor and dropped (Bell et al.)", "both", majority, None),
             ("a split view, threshold 3 of 5", "split", majority, None),
             ("a split view, threshold 2 of 5, nodes requiring SecAgg+", "split", minority,
              {"require-secure-aggregation": True}),
             ("a non-neighbour named", "stranger", majority, None),
             ("the node itself named dropped", "self_dropped", majority, None),
             ("a survivor named twice", "repeat", majority, None),
             ("fewer survivors than the threshold", "too_few", majority, None)]
    for label, attack, cfg, node_config in cases:
        refused = recovered = 0
        for trial in range(args.attack_trials):
            handlers, groups, update = _secure_nodes(node_config)
            out = run_attack(attack, node_id(2), handlers, groups, cfg, seed=trial)
            refused += bool(out.refused) or (out.seed_shares == 0 and out.key_shares == 0)
            recovered += out.recovered is not None and bool(
                np.abs(out.recovered[0] - update(2)["w"].numpy()).max() < 1e-3)
        rows.append((f"malicious server: {label}", args.attack_trials, refused, recovered))
    handlers, groups, update = _secure_nodes()
    out = run_attack("split", node_id(2), handlers, groups, minority)
    rows.append(("(reference) a split view, threshold 2 of 5, nodes that do not insist", 1, int(bool(out.refused)),
                 int(out.recovered is not None)))
    policy = NodePolicy(require_secure_aggregation=True)
    node_cases = [("a plain TRAIN message to a node requiring SecAgg+", policy.check_plain_train),
                  ("a SecAgg+ setup of 2 of 4 shares to that node", lambda: policy.check_secure_setup(4, 2)),
                  ("model.trust_remote_code in the server's config",
                   lambda: NodePolicy().check_config(load_config(None, ["model.name=org/m",
                                                                        "model.trust_remote_code=true"]))),
                  ("a model outside the node's list", lambda: NodePolicy(models=["minilm"]).check_config(
                      load_config(None, ["model.name=smollm2"]))),
                  ("a run key leaving the state dir (../..)", lambda: state_root({"state-dir": str(work)},
                                                                                {"run_key": "../../etc"}))]
    for label, fn in node_cases:
        try:
            fn()
            rows.append((f"dishonest server: {label}", 1, 0, 0))
        except PolicyError:
            rows.append((f"dishonest server: {label}", 1, 1, 0))
    driver, state, plan, valid, _, _ = make_round_one()
    bad = decode(valid[0])
    bad.scalars["num_examples"] = 10**12
    _, recs = driver.finish_round(state, plan, {**valid, 0: encode(bad, own_dtypes(bad))})
    rows.append(("dishonest client: num_examples 10^12", 1, int(recs[0]["status"] == "rejected"), 0))
    rows.append(("a stranger's `flwr run` to the SuperLink from a non-loopback address", 1,
                 int(_stranger_refused(work)), 0))
    lines = ["| attack | tried | refused | a client's update recovered |", "|---|---|---|---|"]
    return lines + [f"| {a} | {n} | {r} | {u} |" for a, n, r, u in rows]


def _stranger_refused(work: Path) -> bool:
    """Whether ``fedpeft flower superlink --host 0.0.0.0``'s SuperLink refuses a submission from this machine's
    network address (not loopback), starting no run."""
    import socket

    from fedpeft.runtime.flower.deployment import run_flower
    from fedpeft.runtime.flower.local import LocalFederation

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("198.51.100.1", 9))
        ip = sock.getsockname()[0]
    cfg = load_config(None, _tiny())
    with LocalFederation(work / "guard", host="0.0.0.0") as fed:
        fed.start_superlink()
        try:
            run_flower(cfg, work / "stranger", superlink=f"{ip}:{fed.port}", timeout=120, insecure=True)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        log = (work / "guard" / "superlink.log").read_text()
    return f"refused POST /v1/control/start-run from {ip}" in log and "StartRun" not in log


def drop_checks(args, work: Path) -> list[str]:
    import numpy as np

    from fedpeft.config import SecureAggregationConfig
    from fedpeft.runtime.secure.inprocess import grid_class, task_identity
    from fedpeft.runtime.secure.protocol import node_id, secure_round

    lines = ["| stage a client drops at | rounds | completed | mean = the survivors' (within 1e-3) |",
             "|---|---|---|---|"]
    cfg = SecureAggregationConfig(num_shares=5, reconstruction_threshold=3)
    for stage in ("setup", "share_keys", "collect_masked_vectors", "unmask"):
        done = right = 0
        for trial in range(args.attack_trials):
            gone = node_id(trial % 5)
            handlers, groups, update = _secure_nodes()
            with task_identity():
                out = secure_round(cfg, trial, 1, groups, grid_class()(
                    handlers, lambda node, s, stage=stage, gone=gone: node == gone and s == stage))
            if out.mean is None:
                continue
            done += 1
            kept = [c for c in range(5) if stage == "unmask" or node_id(c) != gone]
            w = {c: 100 + c for c in kept}
            want = sum(w[c] * update(c)["w"].double().numpy() for c in kept) / sum(w.values())
            right += bool(np.abs(out.mean["w"] - want).max() < 1e-3)
        lines.append(f"| {stage} | {args.attack_trials} | {done} | {right} |")
    return lines


# ---------------------------------------------------------------- damaged run directories, bad inputs


def tamper_checks(args, work: Path) -> list[str]:
    import shutil

    from typer.testing import CliRunner

    from fedpeft.cli import app
    from fedpeft.runtime.embedded import StopAfterRound, run_embedded

    cfg = load_config(None, _tiny(federation__rounds=3, runtime__checkpoint_every=1))
    run_embedded(cfg, work / "full")
    full = _records(work / "full")

    def stopped(name: str) -> Path:
        try:
            run_embedded(cfg, work / name, stop_after_round=2)
        except StopAfterRound:
            pass
        return work / name

    def flip(p: Path) -> None:
        b = bytearray(p.read_bytes())
        b[-5] ^= 1
        p.write_bytes(bytes(b))

    damages = {"a flipped byte in the server state": lambda d: flip(d / "checkpoint" / "server.safetensors"),
               "a truncated server state": lambda d: (d / "checkpoint" / "server.safetensors").write_bytes(b"\x10"),
               "meta.json deleted": lambda d: (d / "checkpoint" / "meta.json").unlink(),
               "both checkpoints damaged": lambda d: (flip(d / "checkpoint" / "server.safetensors"),
                                                      flip(d / "checkpoint-prev" / "server.safetensors")),
               "metrics.jsonl deleted": lambda d: (d / "metrics.jsonl").unlink(),
               "another run's checkpoint copied in": lambda d: (
                   shutil.rmtree(d / "checkpoint"), shutil.copytree(other / "checkpoint", d / "checkpoint"))}
    other = work / "other"
    try:
        run_embedded(load_config(None, _tiny(federation__rounds=3, runtime__checkpoint_every=1, seed=9)), other,
                     stop_after_round=2)
    except StopAfterRound:
        pass
    lines = ["| damage | outcome |", "|---|---|"]
    for i, (label, damage) in enumerate(damages.items()):
        d = stopped(f"cut{i}")
        damage(d)
        try:
            run_embedded(cfg, d, resume=True)
            outcome = ("resumed from checkpoint-prev, metrics identical to an uninterrupted run"
                       if _records(d) == full else "resumed, metrics DIFFER")
        except ValueError as e:
            outcome = f"one-line error: {str(e).splitlines()[0].replace(str(work) + '/', '')[:160]}"
        lines.append(f"| {label} | {outcome} |")
    files = {name: _write(work / f"{name}.csv", text) for name, text in (
        ("good", "text,label\n" + "".join(f"text {i},{'ab'[i % 2]}\n" for i in range(40))),
        ("nolabel", "text\na\n"), ("empty", ""), ("one", "text,label\na,x\nb,x\n"))}
    good = files["good"]
    bad_inputs = {
        "a data file that does not exist": ["task.name=csv", f"task.path={work / 'missing.csv'}"],
        "a CSV without a label column": ["task.name=csv", f"task.path={files['nolabel']}"],
        "an empty CSV": ["task.name=csv", f"task.path={files['empty']}"],
        "a label column with one class": ["task.name=csv", f"task.path={files['one']}"],
        "an unknown config key": ["federation.num_clientz=3"],
        "a negative round count": ["federation.rounds=-1"],
        "an unknown method": ["method.name=fedprompz"],
        "a model that is not there": ["model.name=/nonexistent/model"],
        "more clients than examples": ["task.name=csv", f"task.path={good}", "federation.num_clients=500"],
        "a prompt template with an unknown field": ["task.name=csv", f"task.path={good}",
                                                    "task.prompt_template={text} {mr}"],
        "secure aggregation in a field too small": ["federation.secure_aggregation={modulus_range: 8388608}",
                                                    "federation.num_clients=5"],
        "faults.secure_stage without secure aggregation": ["faults.fail_clients=[0]", "faults.secure_stage=setup"],
    }
    runner = CliRunner()
    clean = untouched = 0
    for j, (label, sets) in enumerate(bad_inputs.items()):
        out = work / f"bad{j}"
        res = runner.invoke(app, ["run", "--out", str(out), *[a for x in _tiny() + sets for a in ("--set", x)]])
        clean += res.exit_code == 2 and "Traceback" not in res.output
        untouched += not out.exists()
    lines += ["", "| bad inputs to `fedpeft run` | tried | a clean error (exit 2, no traceback) | nothing written |",
              "|---|---|---|---|", f"| {', '.join(bad_inputs)} | {len(bad_inputs)} | {clean} | {untouched} |"]
    return lines


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


SECTIONS = {"replies": ("Fuzzed replies", fuzz_replies), "configs": ("Fuzzed configs", fuzz_configs),
            "faults": ("Injected faults", fault_runs), "crashes": ("Crash anywhere (SIGKILL) and resume", crash_runs),
            "audit": ("Payload audit", audit_runs), "tls": ("TLS and SuperNode authentication", tls_checks),
            "attacks": ("Attacks by a malicious server or a dishonest node", attack_checks),
            "drops": ("SecAgg+ drops at every stage", drop_checks),
            "tamper": ("Damaged run directories and bad inputs", tamper_checks)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    p.add_argument("--examples", type=int, default=300, help="fuzzed cases per reply category (configs: 5x)")
    p.add_argument("--fault-rounds", type=int, default=40)
    p.add_argument("--crash-trials", type=int, default=8)
    p.add_argument("--sim-crash-trials", type=int, default=2)
    p.add_argument("--attack-trials", type=int, default=5, help="protocol rounds per attack and per drop stage")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--work", type=Path, help="keep the run directories and logs here (default: a temporary folder)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    logging.getLogger("fedpeft").setLevel(logging.ERROR)
    parts, intro = {}, ""
    if args.out.exists():  # keep the sections not run this time, and the summary written beside them
        text = args.out.read_text()
        intro = text.split("\n## ", 1)[0].split("\n\n", 2)[2].strip() if text.count("\n\n") >= 2 else ""
        for key, (title, _) in SECTIONS.items():
            if f"## {title}\n" in text:
                parts[key] = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0].strip()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.work or tmp
        for key in args.sections:
            title, fn = SECTIONS[key]
            t0 = time.monotonic()
            rows = fn(args) if key in ("replies", "configs") else fn(args, Path(tmp) / key)
            parts[key] = "\n".join(rows) + f"\n\n({time.monotonic() - t0:.0f} s, {time.strftime('%Y-%m-%d')})"
            print(f"{title}: done", flush=True)
    head = ("# Reliability and security, measured (issues 17 and 70)\n\n"
            f"Last command: `python -m benchmarks.reliability --sections {' '.join(args.sections)} --examples "
            f"{args.examples}` (tiny random models, synthetic data; torch {torch.__version__}, CPU). Each section "
            "ends with its date; sections not in the last command keep the rows of their last run. The fast part of "
            "each section runs in `make test` (`tests/unit/test_reliability.py`, `tests/unit/test_secure_*.py`, "
            "`tests/conformance/test_presets.py`, `tests/integration/test_flower.py`).\n"
            + (f"\n{intro}\n" if intro else ""))
    body = "\n\n".join(f"## {SECTIONS[k][0]}\n\n{parts[k]}" for k in SECTIONS if k in parts)
    args.out.write_text(head + "\n" + body + "\n")
    print(json.dumps({"written": str(args.out)}))


if __name__ == "__main__":
    main()
