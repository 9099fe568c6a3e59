"""Reliability, fast part (the long sweep is ``benchmarks/reliability.py``): injected client faults and deadlines,
fuzzed replies and Flower reply records, a locked run directory, a crash while a line or file is written, and no
unsafe loading. Every case checks what must hold, not only that nothing raised."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedpeft.build import build
from fedpeft.comm.codec import WIRE_DTYPES, Message, decode, encode, own_dtypes
from fedpeft.runtime.client import handle_train
from fedpeft.runtime.embedded import run_embedded
from fedpeft.runtime.faults import fails
from fedpeft.runtime.server import RoundDriver, RoundFailed
from fedpeft.tracking.rundir import RunDir, RunDirLocked
from fedpeft.tracking.summary import TIMING_FIELDS

pytestmark = pytest.mark.usefixtures("one_thread")
SRC = Path(__file__).resolve().parents[2] / "src" / "fedpeft"


def _records(root) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in RunDir(root).read_metrics()]


# ---------------------------------------------------------------- injected faults and deadlines


def test_a_client_that_fails_every_round_is_left_out_and_accounted(tiny_cfg, tmp_path):
    run_embedded(tiny_cfg(federation__rounds=3, faults__fail_clients=[1]), tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    for r in recs:
        status = {c["client"]: c["status"] for c in r["clients"]}
        assert status == {0: "ok", 1: "failed", 2: "ok"} and r["num_failed"] == 1 and r["num_ok"] == 2
        assert r["bytes_up"] == sum(c["bytes_up"] for c in r["clients"] if c["client"] != 1)
        assert next(c for c in r["clients"] if c["client"] == 1)["bytes_up"] == 0
    assert "injected failure of client 1" in (tmp_path / "run" / "run.log").read_text()


def test_random_failures_skip_exactly_the_rounds_below_min_clients(tiny_cfg, tmp_path):
    """~25 % random failures over 12 rounds, min_clients = all 3, failed rounds skipped: exactly the rounds where
    the seeded draw fails a client are recorded as failed, and they leave the server state unchanged (the same
    global metrics as the round before); the run resumes to identical records."""
    cfg = tiny_cfg(federation__rounds=12, federation__min_clients=3, federation__on_round_failure="skip",
                   faults__fail_rate=0.25, evaluation__round_zero=True)
    run_embedded(cfg, tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    want = [r for r in range(1, 13) if any(fails(cfg.faults, cfg.seed, r, c) for c in range(3))]
    assert 0 < len(want) < 12
    assert [r["round"] for r in recs if "round_failed" in r] == want
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["failed_rounds"] == want
    for r in want:
        assert (recs[r]["accuracy"], recs[r]["loss"]) == (recs[r - 1]["accuracy"], recs[r - 1]["loss"])
        assert recs[r]["num_failed"] >= 1 and "min_clients is 3" in recs[r]["round_failed"]
    assert any(recs[r]["loss"] != recs[r - 1]["loss"] for r in range(1, 13) if r not in want)
    from fedpeft.runtime.embedded import StopAfterRound
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=5)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    assert _records(tmp_path / "cut") == _records(tmp_path / "run")


def test_stop_on_failure_applies_nothing_and_resume_retries_the_round(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__rounds=2, federation__min_clients=3, faults__fail_clients=[0], faults__rounds=[2])
    with pytest.raises(RoundFailed, match="min_clients"):
        run_embedded(cfg, tmp_path / "run")
    assert [r["round"] for r in RunDir(tmp_path / "run").read_metrics()] == [1]
    assert RunDir(tmp_path / "run").load_checkpoint()[0] == 1


def test_a_reply_past_the_round_deadline_is_ignored_and_its_state_not_kept(tiny_cfg, tmp_path, caplog):
    cfg = tiny_cfg(federation__rounds=2, federation__round_timeout=0.5, faults__hang_clients=[2], faults__hang_s=0.8,
                   faults__rounds=[1], method__trainer__reset_optimizer=False)
    with caplog.at_level(logging.WARNING, logger="fedpeft"):
        run_embedded(cfg, tmp_path / "run")
    first, second = RunDir(tmp_path / "run").read_metrics()
    late = next(c for c in first["clients"] if c["client"] == 2)
    assert late["status"] == "failed" and "deadline" in late["error"] and first["num_ok"] == 2
    assert second["num_ok"] == 3
    assert re.search(r"client 2 replied after .* reply ignored", caplog.text)
    # the late client's optimizer state of round 1 was dropped: round 2 starts it afresh, like a new client
    states = RunDir(tmp_path / "run").load_checkpoint()[2]
    assert set(states) == {0, 1, 2}
    steps = {c: float(states[c].tensors[next(k for k in states[c].tensors if k.endswith("::step"))]) for c in states}
    assert steps[2] < steps[0] == steps[1]


# ---------------------------------------------------------------- fuzzed replies


MESSAGE_KINDS = ("drop", "extra", "shape", "dtype", "nonfinite", "scalar", "no_scalar", "num_examples")
BYTE_KINDS = ("truncate", "random", "length", "header", "oversize")


def make_round_one(**extra):
    """A tiny round (FedPrompt unless ``extra`` overrides say otherwise): the driver, state, plan, every client's
    valid reply, the state aggregated without client 0, and the reply schema. Replies over 64 KiB are refused."""
    from conftest import tiny_overrides

    from fedpeft.resolve import load_config

    cfg = load_config(None, tiny_overrides(federation__max_message_bytes=1 << 16, **extra))
    b = build(cfg)
    driver = RoundDriver(cfg.federation, b.method, weights=b.exp.client_weights())
    state = b.method.server_init()
    plan = driver.plan_round(state, 1)
    valid = {}
    for cid, payload in plan.instructions.items():
        ctx = b.exp.client(cid)
        ctx.state = Message()
        valid[cid] = handle_train(b.method, payload, ctx)
    without0, _ = driver.finish_round(state, plan, {c: v for c, v in valid.items() if c != 0})
    return driver, state, plan, valid, without0, b.method.reply_schema(state)


@pytest.fixture(scope="module")
def round_one():
    return make_round_one()


@st.composite
def bad_messages(draw, valid: Message, schema, kind: str | None = None) -> Message:
    """A decoded valid reply with one thing (of ``kind``, else any) wrong in it."""
    msg = Message({k: v.clone() for k, v in valid.tensors.items()}, dict(valid.scalars))
    name = draw(st.sampled_from(sorted(schema.tensors)))
    t = msg.tensors[name]
    kind = kind or draw(st.sampled_from(MESSAGE_KINDS))
    if kind == "nonfinite" and not t.is_floating_point():  # integer tensors (token indices) hold no NaN
        kind = "dtype"
    if kind == "drop":
        del msg.tensors[name]
    elif kind == "extra":
        msg.tensors[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in msg.tensors))] = torch.zeros(2)
    elif kind == "shape":
        dim = draw(st.integers(0, t.dim()))
        shape = list(t.shape)
        shape = shape[:dim] + [draw(st.integers(1, 3))] + shape[dim:] if draw(st.booleans()) or not shape else \
            [s + draw(st.integers(1, 2)) if i == min(dim, len(shape) - 1) else s for i, s in enumerate(shape)]
        msg.tensors[name] = torch.zeros(shape, dtype=t.dtype)
    elif kind == "dtype":
        other = draw(st.sampled_from([d for d in WIRE_DTYPES.values() if d != schema.dtype_of(name)]))
        msg.tensors[name] = t.to(other)
    elif kind == "nonfinite":
        flat = t.flatten().clone()
        flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        msg.tensors[name] = flat.reshape(t.shape)
    elif kind == "scalar":
        key = draw(st.sampled_from(sorted(schema.scalars)))
        msg.scalars[key] = draw(st.one_of(st.text(max_size=5), st.none(), st.booleans(), st.lists(st.integers(),
                                                                                                  max_size=2),
                                          st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)))
    elif kind == "no_scalar":
        del msg.scalars[draw(st.sampled_from(sorted(schema.scalars)))]
    else:
        msg.scalars["num_examples"] = draw(st.one_of(st.integers(max_value=0), st.floats(0.01, 1e6).filter(
            lambda x: x != int(x))))
    return msg


@st.composite
def bad_bytes(draw, data: bytes, kind: str | None = None) -> bytes:
    """Valid reply bytes broken at the byte level (``kind``, else any): truncated, random, a forged header length
    or header, oversized."""
    n = int.from_bytes(data[:8], "little")
    kind = kind or draw(st.sampled_from(BYTE_KINDS))
    if kind == "truncate":
        return data[:draw(st.integers(0, len(data) - 1))]
    if kind == "random":
        return draw(st.binary(max_size=512))
    if kind == "length":
        forged = draw(st.integers(0, 2**64 - 1).filter(lambda x: x != n))
        return forged.to_bytes(8, "little") + data[8:]
    if kind == "header":
        json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                                   lambda inner: st.lists(inner, max_size=3)
                                   | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
        header = json.dumps(draw(json_values)).encode()
        return len(header).to_bytes(8, "little") + header + data[8 + n:]
    return data + bytes(1 << 16)  # over federation.max_message_bytes = 64 KiB


def rejected(fixture, bad) -> tuple[bool, bool, str]:
    """(rejected, left out of the aggregate, the logged reason) for client 0's reply ``bad`` next to the others'
    valid replies; an exception out of ``finish_round`` (a server crash) propagates."""
    driver, state, plan, valid, without0, _ = fixture
    new, records = driver.finish_round(state, plan, {**valid, 0: bad})
    rec = next(r for r in records if r["client"] == 0)
    left_out = all(torch.equal(new.tensors[k], without0.tensors[k]) for k in without0.tensors)
    return rec["status"] == "rejected", left_out, rec.get("error", "")


def _check_rejected(fixture, bad, caplog) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedpeft"):
        is_rejected, left_out, reason = rejected(fixture, bad)
    assert is_rejected and reason and left_out
    assert f"rejected reply of client 0: {reason}" in caplog.text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_reply_messages_are_rejected_and_never_averaged_in(round_one, data, caplog):
    valid0, schema = decode(round_one[3][0]), round_one[5]
    bad = data.draw(bad_messages(valid0, schema))
    _check_rejected(round_one, encode(bad, own_dtypes(bad)), caplog)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_reply_bytes_are_rejected_and_never_averaged_in(round_one, data, caplog):
    _check_rejected(round_one, data.draw(bad_bytes(round_one[3][0])), caplog)


def test_a_huge_declared_shape_is_refused_before_allocation():
    header = json.dumps({"prompt": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 4]}}).encode()
    with pytest.raises(ValueError, match="not a safetensors message|offsets"):
        decode(len(header).to_bytes(8, "little") + header + bytes(4))
    with pytest.raises(ValueError, match="max_message_bytes"):
        decode(bytes(2048), max_bytes=1024)


@pytest.mark.parametrize("claim", [10**12, 65, 63])
def test_a_reply_claiming_more_or_fewer_examples_than_its_shard_is_rejected(round_one, claim, caplog):
    """The server knows each client's shard from the partition: a reply claiming 10^12 examples (which would make
    the global model that client's upload) or one off by one is refused, logged, and the round goes on without it."""
    driver, state, plan, valid, without0, _ = round_one
    assert driver.weights[0] == 64
    bad = decode(valid[0])
    bad.scalars["num_examples"] = claim
    replies = {c: v for c, v in valid.items() if c != 0} | {0: encode(bad, own_dtypes(bad))}
    with caplog.at_level(logging.WARNING):
        got, records = driver.finish_round(state, plan, replies)
    assert records[0]["status"] == "rejected" and f"num_examples {claim}, but client 0 holds 64" in caplog.text
    assert all(torch.equal(got.tensors[k], without0.tensors[k]) for k in without0.tensors)


def test_malformed_evaluation_replies_are_left_out(round_one):
    driver = round_one[0]
    good = encode(Message(scalars={"accuracy": 0.5, "loss": 1.0, "num_examples": 4}))
    bad = {1: b"\x00" * 5, 2: encode(Message({"x": torch.zeros(1)}, {"accuracy": 0.5})),
           3: encode(Message(scalars={"accuracy": "high"})), 4: RuntimeError("offline")}
    out = driver.finish_evaluate(1, {0: good, **bad})
    assert set(out) == {0} and out[0]["accuracy"] == 0.5


# ---------------------------------------------------------------- fuzzed configs


def _config_keys() -> list[str]:
    """Every dotted key of the resolved default config (component settings included)."""
    import yaml

    from fedpeft.config import dump_config
    from fedpeft.resolve import load_config

    def walk(node, prefix):
        for k, v in node.items():
            yield from walk(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]

    return sorted(walk(yaml.safe_load(dump_config(load_config(None))), ""))


KEYS = _config_keys()
YAML_VALUES = st.one_of(st.sampled_from(["-1", "0", "1e9", "null", "true", "[]", "{}", "[1, 2]", "{a: 1}", "nan",
                                         "'x'", "", "[", "a: b: c", "{name: nope}", "!!python/object:os.system"]),
                        st.text(max_size=12).filter(lambda t: "\n" not in t))
OVERRIDES = st.lists(st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), YAML_VALUES),
    st.builds(lambda k, v: f"{k}={v}", st.text(alphabet="abcdefgmnoprst._", min_size=1, max_size=20), YAML_VALUES),
    st.text(max_size=15)), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(overrides=OVERRIDES)
def test_fuzzed_configs_fail_with_an_error_naming_the_field(overrides):
    """Any override list either resolves, or fails with a ConfigError that names a key it set (or says the
    override itself is malformed): never another exception."""
    from fedpeft.config import ConfigError
    from fedpeft.resolve import load_config

    try:
        load_config(None, overrides)
    except ConfigError as e:
        text = str(e)
        named = [o.split("=", 1)[0].strip() for o in overrides if "=" in o]
        assert "--set expects key=value" in text or any(
            part and part in text for key in named for part in (key, key.split(".")[-1], key.split(".")[0])), text


def test_cli_reports_an_invalid_config_without_a_traceback(tmp_path):
    from typer.testing import CliRunner

    from fedpeft.cli import app

    for bad in (["--set", "federation.rounds=-2"], ["--set", "method.trainer.lr=[1"], ["--set", "nonsense"],
                ["--set", "method.aggregator.name=nope"], ["--set", "model.pooling=cls"]):
        res = CliRunner().invoke(app, ["run", "--dry-run", "--out", str(tmp_path / "x"), *bad])
        assert res.exit_code != 0 and "Traceback" not in res.output and res.exception is None or \
            isinstance(res.exception, SystemExit), (bad, res.output)
        assert bad[1].split("=")[0].split(".")[-1] in res.output or "key=value" in res.output, res.output


# ---------------------------------------------------------------- Flower reply records


class _FakeGrid:
    """A Grid whose nodes answer with whatever ``answer(msg)`` builds (one node per client)."""

    def __init__(self, nodes, answer):
        self.nodes, self.answer, self.out = nodes, answer, {}

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            mid = f"m{len(self.out)}"
            m.metadata.__dict__["_message_id"] = mid
            self.out[mid] = m
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self.answer(self.out.pop(i)) for i in ids if i in self.out]


def test_flower_replies_for_another_round_node_or_client_are_rejected(caplog, monkeypatch):
    from flwr.app import ConfigRecord, MessageType, RecordDict
    from flwr.app import Message as FlwrMessage
    from flwr.supercore.task_identity import TaskIdentity

    from fedpeft.runtime.flower.records import CLIENTS, Instruction, Reply
    from fedpeft.runtime.flower.transport import FlowerTransport

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)

    def answer(msg):
        if msg.metadata.message_type == MessageType.QUERY:
            return FlwrMessage(RecordDict({CLIENTS: ConfigRecord({"client_ids": [msg.metadata.dst_node_id]})}),
                               reply_to=msg)
        cid = msg.metadata.dst_node_id
        payloads = Instruction.from_content(msg.content).payloads
        reply = FlwrMessage(Reply({**payloads, 7: b"extra"}).content(), reply_to=msg)
        if cid == 1:  # claims another round
            reply.metadata.group_id = "99"
        if cid == 2:  # claims to come from another node
            reply.metadata.__dict__["_src_node_id"] = 0
        return reply

    t = FlowerTransport(_FakeGrid([0, 1, 2], answer), {"run_key": "k"}, 3, poll_interval=0.0)
    with caplog.at_level(logging.WARNING, logger="fedpeft"):
        out = t.train(3, {0: b"a", 1: b"b", 2: b"c"})
    assert out[0] == b"a"
    assert isinstance(out[1], ValueError) and "round '99'" in str(out[1])
    assert isinstance(out[2], ValueError) and "from node 0" in str(out[2])
    assert "clients [7] it was not asked for; ignored" in caplog.text


# ---------------------------------------------------------------- run directory: lock, torn writes


def test_a_run_directory_is_locked_while_a_run_writes_it(tmp_path):
    first = RunDir(tmp_path / "run")
    first.lock()
    try:
        with pytest.raises(RunDirLocked, match=r"another process \(pid \d+\)"):
            RunDir(tmp_path / "run").lock()
    finally:
        first.unlock()
    RunDir(tmp_path / "run").lock()  # free again


def test_resume_after_a_crash_mid_line_and_mid_checkpoint(tiny_cfg, tmp_path):
    """A metrics line cut short and a half-written checkpoint.tmp (a kill while writing) are never read."""
    from fedpeft.runtime.embedded import StopAfterRound

    cfg = tiny_cfg(federation__rounds=3)
    run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=2)
    with (tmp_path / "cut" / "metrics.jsonl").open("a") as f:
        f.write('{"round": 3, "accur')  # the kill came while round 3's line was written
    (tmp_path / "cut" / "checkpoint.tmp").mkdir()
    (tmp_path / "cut" / "checkpoint.tmp" / "server.safetensors").write_bytes(b"\x10\x00")
    assert [r["round"] for r in RunDir(tmp_path / "cut").read_metrics()] == [1, 2]
    run_embedded(cfg, tmp_path / "cut", resume=True)
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")


def test_a_kill_between_the_checkpoint_renames_resumes_from_the_previous_checkpoint(tiny_cfg, tmp_path,
                                                                                    monkeypatch):
    cfg = tiny_cfg(federation__rounds=3)
    run_embedded(cfg, tmp_path / "full")
    real = Path.rename

    def dying_rename(self, target):  # the kill lands after checkpoint -> checkpoint-prev, before tmp -> checkpoint
        out = real(self, target)
        if self.name == "checkpoint":  # round 2: round 1's checkpoint moved aside
            raise KeyboardInterrupt("killed")
        return out

    monkeypatch.setattr(Path, "rename", dying_rename)
    with pytest.raises(KeyboardInterrupt):
        run_embedded(cfg, tmp_path / "cut")
    monkeypatch.setattr(Path, "rename", real)
    assert not (tmp_path / "cut" / "checkpoint").exists() and (tmp_path / "cut" / "checkpoint-prev").exists()
    assert RunDir(tmp_path / "cut").load_checkpoint()[0] == 1  # round 2's checkpoint never completed
    run_embedded(cfg, tmp_path / "cut", resume=True)
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")


@pytest.fixture
def stopped_run(tiny_cfg, tmp_path):
    """A 3-round run and the same run stopped after round 2 (checkpoints of rounds 1 and 2 on disk)."""
    from fedpeft.runtime.embedded import StopAfterRound

    cfg = tiny_cfg(federation__rounds=3, runtime__checkpoint_every=1)
    run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=2)
    return cfg, tmp_path / "full", tmp_path / "cut"


def _flip_byte(path: Path, at: int = -5) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "no meta.json", "the server file gone"])
def test_a_damaged_checkpoint_is_named_and_the_resume_falls_back_to_the_previous_one(stopped_run, damage, caplog):
    cfg, full, cut = stopped_run
    ckpt = cut / "checkpoint"
    assert RunDir(cut).load_checkpoint()[0] == 2 and (cut / "checkpoint-prev" / "meta.json").exists()
    server = ckpt / "server.safetensors"
    if damage == "flipped byte":
        _flip_byte(server)
    elif damage == "truncated":
        server.write_bytes(server.read_bytes()[:100])
    elif damage == "no meta.json":
        (ckpt / "meta.json").unlink()
    else:
        server.unlink()
    with caplog.at_level(logging.WARNING):
        assert RunDir(cut).load_checkpoint()[0] == 1
    named = {"no meta.json": "meta.json is missing", "the server file gone": "server.safetensors is missing"}.get(
        damage, "server.safetensors does not match the SHA-256")
    assert named in caplog.text and "checkpoint-prev (round 1) instead" in caplog.text
    run_embedded(cfg, cut, resume=True)
    assert _records(cut) == _records(full)  # the round the damaged checkpoint held is redone, exactly


def test_no_usable_checkpoint_is_one_error_naming_each_file(stopped_run):
    from fedpeft.tracking.rundir import CheckpointError

    cfg, _, cut = stopped_run
    _flip_byte(cut / "checkpoint" / "server.safetensors")
    (cut / "checkpoint-prev" / "server.safetensors").write_bytes(b"\x10\x00")
    with pytest.raises(CheckpointError, match=r"checkpoint/server.safetensors does not match .*"
                                              r"checkpoint-prev/server.safetensors does not match"):
        run_embedded(cfg, cut, resume=True)


def test_lost_round_records_and_a_checkpoint_of_another_run_are_one_line_errors(stopped_run, tiny_cfg, tmp_path):
    import shutil

    from fedpeft.tracking.rundir import CheckpointError

    cfg, full, cut = stopped_run
    (cut / "metrics.jsonl").unlink()
    with pytest.raises(CheckpointError, match=r"has no record of rounds 1-2 that the checkpoint \(round 2\)"):
        run_embedded(cfg, cut, resume=True)
    other = tiny_cfg(federation__rounds=3, runtime__checkpoint_every=1, seed=5)
    with pytest.raises(Exception):
        run_embedded(other, tmp_path / "other", stop_after_round=2)
    shutil.rmtree(full / "checkpoint")
    shutil.copytree(tmp_path / "other" / "checkpoint", full / "checkpoint")
    with pytest.raises(CheckpointError, match="belongs to run .* it was copied from another run"):
        run_embedded(cfg, full, resume=True)


def test_a_run_refused_for_its_data_leaves_nothing_behind(tiny_cfg, tmp_path):
    """Bad data found while the run is built (before it writes its config): no lock, no log, no directory."""
    bad = tmp_path / "bad.csv"
    bad.write_text("text,stars\na fine film,5\na dull one,1\n")  # no label column
    cfg = tiny_cfg(task__name="csv", task__path=str(bad))
    with pytest.raises(Exception):
        run_embedded(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "notes.txt").write_text("mine")
    with pytest.raises(Exception):
        run_embedded(cfg, tmp_path / "existing")
    assert sorted(p.name for p in (tmp_path / "existing").iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_is_bit_identical(tmp_path):
    """The CLI in a subprocess, killed (SIGKILL) twice at seeded points of its progress (a seeded number of round
    records, then a seeded delay, so mid-round or mid-checkpoint), then resumed: the metrics and the final server state
    equal those of an uninterrupted run. The kills follow progress, not wall time, so a fast machine cannot finish the
    run before them."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from conftest import tiny_overrides

    sets = [a for o in tiny_overrides(federation__rounds=12, runtime__threads=1) for a in ("--set", o)]

    def cli(out, resume=False):
        return subprocess.Popen([sys.executable, "-m", "fedpeft.cli", "run", "--quiet", "--out", str(out), *sets,
                                 *(["--resume"] if resume else [])], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def records_written(out) -> int:
        path = RunDir(out).metrics_path
        return path.read_text().count("\n") if path.exists() else 0

    assert cli(tmp_path / "full").wait() == 0
    rng, killed, target = random.Random(0), 0, 0
    for attempt in range(2):
        target += rng.randint(2, 4)
        p = cli(tmp_path / "cut", resume=attempt > 0)
        while p.poll() is None and records_written(tmp_path / "cut") < target:
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.02))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.wait()
    assert not (tmp_path / "cut" / "summary.json").exists()  # a killed run is unfinished
    assert cli(tmp_path / "cut", resume=True).wait() == 0
    assert killed == 2
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")
    a, b = RunDir(tmp_path / "full").load_checkpoint()[1], RunDir(tmp_path / "cut").load_checkpoint()[1]
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)


# ---------------------------------------------------------------- no unsafe loading


def test_no_pickle_on_the_wire_or_in_checkpoints():
    """Nothing in fedpeft imports pickle or calls torch.load / numpy.load with pickles allowed."""
    hits = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        for pattern in (r"^\s*(import|from)\s+(c?pickle|dill|joblib)\b", r"torch\.load\(", r"allow_pickle\s*=\s*True",
                        r"trust_remote_code\s*=\s*True"):
            hits += [f"{path.name}: {m.group(0).strip()}" for m in re.finditer(pattern, text, re.M)]
    assert hits == []


def test_trust_remote_code_is_off_unless_the_config_turns_it_on(tiny_cfg, monkeypatch):
    import fedpeft.backbones.loading as loading

    seen = {}

    def fake(name, trust_remote_code=False):
        seen[name] = trust_remote_code
        raise loading.ModelLoadError("stop here")

    monkeypatch.setattr(loading, "_from_hub_or_path", fake)
    for trust in (False, True):
        with pytest.raises(loading.ModelLoadError):
            loading.BackboneCache().get(f"someone/model-{trust}", trust)
    assert seen == {"someone/model-False": False, "someone/model-True": True}
    assert tiny_cfg().model.trust_remote_code is False


def test_a_checkpoint_written_before_checksums_is_read_as_it_is(tmp_path):
    """Runs checkpointed by earlier fedpeft versions (no ``files`` in meta.json, no checkpoint-prev) still resume."""
    run = RunDir(tmp_path / "run")
    server = Message({"w": torch.arange(4.0)}, {"k": 1})
    run.save_checkpoint(3, server, {0: Message({"s": torch.ones(2)})}, {"threads": 1})
    meta = json.loads((run.ckpt / "meta.json").read_text())
    del meta["files"]
    (run.ckpt / "meta.json").write_text(json.dumps(meta))
    rnd, got, clients, extra = run.load_checkpoint()
    assert rnd == 3 and torch.equal(got.tensors["w"], server.tensors["w"]) and extra == {"threads": 1}
    assert torch.equal(clients[0].tensors["s"], torch.ones(2))


def test_the_servers_client_weights_are_the_clients_own(tiny_cfg):
    """The weights the server checks replies against equal what each client reports (backdoor clients included)."""
    for cfg in (tiny_cfg(), tiny_cfg(attack__malicious_clients=[1], attack__weight="poisoned")):
        exp = build(cfg).exp
        assert exp.client_weights() == {c: exp.client(c).num_examples for c in range(exp.num_clients)}
