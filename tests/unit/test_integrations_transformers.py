"""``fedpeft.integrations.transformers``: TRL ``SFTTrainer``s (and a plain ``Trainer``) on a tiny random LLaMA with a
PEFT LoRA adapter, federated by fedpeft. One round equals fedpeft's own ``adamw`` trainer on the same batches; a
one-client federation of three rounds equals the trainer's own uninterrupted ``train()`` of the same steps (the
schedule and Adam's moments run on; with ``reset_optimizer`` they do not, and the naive per-round ``train()``
restarts the schedule); a run resumed by fresh trainers ends as the uninterrupted one; bytes are counted and a
corrupted reply is rejected; FFA-LoRA, SecAgg+ and DP-FedAvg rounds; trainers sharing one model; what is refused; a
server without the clients' trainers; and Flower's simulation gives the embedded metrics."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from transformers import TrainerCallback  # noqa: E402

from fedpeft.adapters.peft_model import PeftLora  # noqa: E402
from fedpeft.backbones.loading import _tiny  # noqa: E402
from fedpeft.clients import sub_state  # noqa: E402
from fedpeft.comm.codec import Message, decode, encode  # noqa: E402
from fedpeft.integrations.transformers import federate  # noqa: E402
from fedpeft.methods.state import OPT, ServerState  # noqa: E402
from fedpeft.rng import SERVER, torch_rng  # noqa: E402
from fedpeft.tracking.rundir import RunDir  # noqa: E402
from fedpeft.tracking.summary import TIMING_FIELDS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["apple", "river", "stone", "cloud", "green", "music", "light", "house"]
QUIET = {"runtime.progress": False}


def _data(client: int, n: int):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"say {WORDS[(i + client) % 8]}" for i in range(n)],
                              "completion": [f" {WORDS[(i + client) % 8]} {WORDS[(3 * i + client) % 8]}"
                                             for i in range(n)]})


def _peft_model(lora: dict | None = None):
    from peft import LoraConfig, get_peft_model

    backbone = _tiny("causal", "llama")  # seeded: every call builds the same base weights
    settings = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0} | (lora or {})
    tok = copy.deepcopy(backbone.tokenizer)
    tok.eos_token = "[SEP]"  # TRL appends the end token; the WordPiece tokenizer names none
    return get_peft_model(backbone.model, LoraConfig(**settings)), tok


def sft(client: int = 0, n: int = 6, batch: int = 3, lora: dict | None = None, out: str | None = None,
        callbacks=None, model=None, **config):
    """An SFTTrainer of client ``client``: float32 (SFTConfig's bf16 autocast off), lr 1e-2, linear decay; on its own
    PEFT model, or on ``model`` (a PEFT model and its tokenizer) shared with other trainers."""
    from trl import SFTConfig, SFTTrainer

    model, tok = model or _peft_model(lora)
    out = out or os.path.join(tempfile.gettempdir(), "fedpeft-sft")  # the trainer saves nothing there
    args = SFTConfig(**{"output_dir": out, "per_device_train_batch_size": batch, "learning_rate": 1e-2,
                        "bf16": False, "use_cpu": True, "report_to": "none", "save_strategy": "no",
                        "logging_strategy": "no", "disable_tqdm": True} | config)
    data = _data(client, n)
    return SFTTrainer(model=model, args=args, train_dataset=data, eval_dataset=data.select(range(2)),
                      processing_class=tok, callbacks=callbacks)


def _glob(root: Path) -> dict[str, torch.Tensor]:
    return ServerState.from_message(RunDir(root).load_checkpoint()[1]).glob


def _init(fed) -> dict[str, torch.Tensor]:
    """The global adapter a run starts from (fedpeft's seeded init, as ``methods.assembly.Shared`` draws it)."""
    return fed.experiment.objective.init_params(torch_rng(fed.config.seed, 0, SERVER, "adapter-init"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


class Rates(TrainerCallback):
    """Records the scheduler's rate and step after every optimizer step."""

    def __init__(self) -> None:
        self.lrs, self.steps = [], []

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        self.lrs.append(lr_scheduler.get_last_lr()[0])
        self.steps.append(lr_scheduler.last_epoch)


# ---------------------------------------------------------------- (a) one round = fedpeft's gradient trainer


def test_one_round_equals_fedpeft_adamw_on_the_same_batches(tmp_path: Path) -> None:
    """Two clients, 6 examples each, batches of 3 (shuffled: fedpeft's (seed, round, client) order, which the
    hf_trainer's sampler replays), 2 steps, AdamW at 1e-2 decaying linearly, gradients clipped at 1: the global
    adapter after the round is fedpeft's adamw trainer's to float rounding, and so are the clients' losses and the
    bytes on the wire (the same exchange)."""
    hf = federate([sft(0), sft(1)], rounds=1, local_steps=2, model_name="tiny-llama", settings=QUIET)
    ours = federate([sft(0), sft(1)], rounds=1, model_name="tiny-llama", settings=QUIET | {
        "method.trainer.name": "adamw", "method.trainer.lr": 1e-2, "method.trainer.batch_size": 3,
        "method.trainer.max_steps": 2, "method.trainer.schedule": "linear", "method.trainer.grad_clip": 1.0})
    assert hf.config.method.trainer.name == "hf_trainer" and ours.config.method.trainer.name == "adamw"
    s_hf, s_ours = hf.run(tmp_path / "hf"), ours.run(tmp_path / "ours")
    a, b, init = _glob(tmp_path / "hf"), _glob(tmp_path / "ours"), _init(hf)
    assert _max_diff(b, init) > 5e-3  # the round moved the adapter (B from zero by about lr per step)
    assert _max_diff(a, b) < 1e-6
    rec_hf, rec_ours = RunDir(tmp_path / "hf").read_metrics()[-1], RunDir(tmp_path / "ours").read_metrics()[-1]
    for c_hf, c_ours in zip(rec_hf["clients"], rec_ours["clients"]):
        assert c_hf["status"] == c_ours["status"] == "ok" and c_hf["steps"] == c_ours["steps"] == 2
        assert c_hf["train_loss"] == pytest.approx(c_ours["train_loss"], abs=1e-5)
        assert c_hf["bytes_down"] == c_ours["bytes_down"] > 0
        assert abs(c_hf["bytes_up"] - c_ours["bytes_up"]) <= 16  # the same tensors; the loss's digits may differ
    tensor_bytes = sum(v.numel() * 4 for v in init.values())
    assert s_hf["upload_tensor_bytes"] == s_ours["upload_tensor_bytes"] == tensor_bytes
    assert rec_hf["loss"] == pytest.approx(rec_ours["loss"], abs=1e-5)  # the global adapter on the eval rows


@pytest.mark.parametrize("method,extra", [("flexlora", {}), ("hetlora", {"method.sharing.self_prune": False})])
def test_rank_tiers_of_trainers_equal_fedpeft_adamw_at_the_same_tiers(tmp_path: Path, method: str, extra: dict) -> None:
    """Three clients whose trainers' LoRA ranks differ (4, 4 and 8, alpha scaled to one alpha/r): federate makes the
    tiers from the ranks (client_profiles naming each client), each lower-rank trainer trains the first r_k ranks of
    the global rank-8 adapter, and the round of FlexLoRA (SVD) and HetLoRA (zero-padding) equals fedpeft's own adamw
    at the same tiers, per client rank on the wire too."""
    def trainers():
        return [sft(0), sft(1), sft(2, lora={"r": 8, "lora_alpha": 16})]

    hf = federate(trainers(), rounds=1, local_steps=2, method=method, model_name="tiny-llama", settings=QUIET | extra)
    profiles = hf.config.federation.client_profiles
    assert [(p.name, p.rank, p.clients) for p in profiles] == [("r4", 4, [0, 1]), ("r8", 8, [2])]
    assert hf.config.method.adapter.r == 8
    ours = federate(trainers(), rounds=1, method=method, model_name="tiny-llama", settings=QUIET | extra | {
        "method.trainer.name": "adamw", "method.trainer.lr": 1e-2, "method.trainer.batch_size": 3,
        "method.trainer.max_steps": 2, "method.trainer.schedule": "linear", "method.trainer.grad_clip": 1.0})
    hf.run(tmp_path / "hf")
    ours.run(tmp_path / "ours")
    a, b = _glob(tmp_path / "hf"), _glob(tmp_path / "ours")
    assert _max_diff(b, _init(hf)) > 1e-3
    assert _max_diff(a, b) < 1e-6
    rec_hf, rec_ours = RunDir(tmp_path / "hf").read_metrics()[-1], RunDir(tmp_path / "ours").read_metrics()[-1]
    for c_hf, c_ours in zip(rec_hf["clients"], rec_ours["clients"]):
        assert c_hf["status"] == c_ours["status"] == "ok"
        assert c_hf["bytes_down"] == c_ours["bytes_down"] and abs(c_hf["bytes_up"] - c_ours["bytes_up"]) <= 16
    assert rec_hf["clients"][0]["bytes_up"] < rec_hf["clients"][2]["bytes_up"]  # rank 4 uploads less than rank 8
    with pytest.raises(ValueError, match="set its lora_alpha to 8"):
        federate([sft(0, lora={"lora_alpha": 16}), sft(2, lora={"r": 8, "lora_alpha": 16})], rounds=1,
                 local_steps=1, method=method, model_name="tiny-llama")


# ---------------------------------------------------------------- (b, c) the schedule and Adam run on


def test_three_rounds_equal_one_uninterrupted_training(tmp_path: Path) -> None:
    """One client, every example in every batch (so the order cannot matter), 3 rounds of 2 steps, linear decay with
    2 warm-up steps: the rates of the 6 steps, the scheduler's step after round 3 (3 x 2), Adam's moments and step
    count, and the adapter all equal the same trainer's uninterrupted train() of 6 steps (FedAvg of one client is
    that client's tensors). With reset_optimizer the rates still run on but the moments restart (the adapter differs),
    and the naive round, train() with max_steps 2 three times, restarts the schedule."""
    rates = Rates()
    fed = federate([sft(batch=6, warmup_steps=2, callbacks=[rates])], rounds=3, local_steps=2,
                   model_name="tiny-llama", settings=QUIET)
    assert fed.config.method.trainer.schedule_steps == 6
    fed.run(tmp_path / "fed")
    ref_rates = Rates()
    ref = sft(batch=6, warmup_steps=2, callbacks=[ref_rates], max_steps=6)
    PeftLora(ref.model).load(_init(fed))
    ref.train()
    assert rates.lrs == pytest.approx(ref_rates.lrs, abs=1e-12) and len(rates.lrs) == 6
    assert rates.steps == ref_rates.steps == [1, 2, 3, 4, 5, 6]  # after round 3 the scheduler stands at step 6
    assert max(rates.lrs) == pytest.approx(1e-2) and rates.lrs[-1] == 0.0
    glob = _glob(tmp_path / "fed")
    assert _max_diff(glob, PeftLora(ref.model).read()) < 1e-6
    _, _, clients, _ = RunDir(tmp_path / "fed").load_checkpoint()
    kept = sub_state(clients[0], OPT)
    want = ref.optimizer.state_dict()["state"]
    names = [n for n, p in ref.model.named_parameters() if p.requires_grad]
    assert len(kept) == 3 * len(names) and len(want) == len(names)
    for i, name in enumerate(names):  # the optimizer's order is its parameters' order here (one group trains)
        assert float(kept[f"{name}::step"]) == float(want[i]["step"]) == 6.0
        for k in ("exp_avg", "exp_avg_sq"):
            assert (kept[f"{name}::{k}"] - want[i][k]).abs().max().item() < 1e-6, (name, k)

    reset_rates = Rates()
    reset = federate([sft(batch=6, warmup_steps=2, callbacks=[reset_rates])], rounds=3, local_steps=2,
                     model_name="tiny-llama", settings=QUIET | {"method.trainer.reset_optimizer": True})
    reset.run(tmp_path / "reset")
    assert reset_rates.lrs == pytest.approx(ref_rates.lrs, abs=1e-12)
    assert _max_diff(_glob(tmp_path / "reset"), glob) > 1e-3  # Adam's bias correction restarted every round
    assert not sub_state(RunDir(tmp_path / "reset").load_checkpoint()[2].get(0, Message()), OPT)

    naive_rates = Rates()
    naive = sft(batch=6, warmup_steps=2, callbacks=[naive_rates], max_steps=2)
    for _ in range(3):
        naive.train()
    assert naive_rates.lrs != pytest.approx(ref_rates.lrs) and naive_rates.steps == [1, 2] * 3


def test_a_run_resumed_with_fresh_trainers_ends_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """Stopped after round 1 and resumed by new trainers (a new process: no optimizer, no scheduler in memory), the
    run records the uninterrupted run's numbers and ends with its adapter: the schedule comes from the round number,
    Adam's moments from the checkpointed client state."""
    from fedpeft.runtime.session import StopAfterRound

    def fed():
        return federate([sft(0, warmup_steps=1), sft(1, warmup_steps=1)], rounds=3, local_steps=2,
                        model_name="tiny-llama", settings=QUIET)

    fed().run(tmp_path / "full")
    with pytest.raises(StopAfterRound):
        fed().run(tmp_path / "cut", stop_after_round=1)
    fed().run(tmp_path / "cut", resume=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    full, cut = RunDir(tmp_path / "full").read_metrics(), RunDir(tmp_path / "cut").read_metrics()
    assert [r["round"] for r in cut] == [0, 1, 2, 3] and strip(cut) == strip(full)
    assert _max_diff(_glob(tmp_path / "cut"), _glob(tmp_path / "full")) == 0.0


# ---------------------------------------------------------------- (d) the wire


def test_bytes_are_counted_and_a_corrupted_reply_is_rejected(tmp_path: Path) -> None:
    """Every client's reply crosses the codec (bytes per client and direction in the records); a reply whose tensor
    turned NaN on the way is rejected by the server's validation, the other client's is aggregated alone."""
    def corrupt(round: int, client: int, payload: bytes) -> bytes:
        if client != 1:
            return payload
        msg = decode(payload)
        k = next(iter(msg.tensors))
        return encode(Message(msg.tensors | {k: torch.full_like(msg.tensors[k], float("nan"))}, msg.scalars))

    fed = federate([sft(0), sft(1)], rounds=1, local_steps=1, model_name="tiny-llama", settings=QUIET)
    fed.run(tmp_path / "run", reply_hook=corrupt)
    rec = RunDir(tmp_path / "run").read_metrics()[-1]
    ok, bad = rec["clients"]
    assert ok["status"] == "ok" and bad["status"] == "rejected" and "NaN" in bad["error"]
    assert ok["bytes_up"] > sum(v.numel() * 4 for v in _init(fed).values()) and ok["bytes_down"] > 0
    assert rec["bytes_up"] == ok["bytes_up"] + bad["bytes_up"] and rec["num_ok"] == 1
    assert all(torch.isfinite(v).all() for v in _glob(tmp_path / "run").values())


# ---------------------------------------------------------------- methods on the server


@pytest.mark.parametrize("settings", [
    {"method.name": "ffa-lora"},
    {"federation.secure_aggregation": {"num_shares": 3, "reconstruction_threshold": 2}},
    {"method.wrappers": [{"name": "dp_fedavg", "clip": 1.0, "noise_multiplier": 0.1}],
     "method.aggregator.name": "uniform"},
], ids=["ffa-lora", "secagg", "dp_fedavg"])
def test_server_side_methods_take_the_trainers_updates(tmp_path: Path, settings: dict) -> None:
    method = settings.pop("method.name", "fedit")
    fed = federate([sft(c) for c in range(3)], rounds=1, local_steps=1, method=method, model_name="tiny-llama",
                   settings=QUIET | settings)
    fed.run(tmp_path / "run")
    rec = RunDir(tmp_path / "run").read_metrics()[-1]
    assert [c["status"] for c in rec["clients"]] == ["ok"] * 3
    glob, init = _glob(tmp_path / "run"), _init(fed)
    moved = {k: (glob[k] - init[k]).abs().max().item() for k in init}
    assert all(v > 0 for k, v in moved.items() if ".lora_B." in k)
    if method == "ffa-lora":  # A stays at its seeded initialisation on every client
        assert all(v == 0 for k, v in moved.items() if ".lora_A." in k)


def test_trainers_sharing_one_model_train_as_trainers_with_their_own(tmp_path: Path) -> None:
    """One PEFT model under every client's trainer (one copy of the weights in the process) gives the same run as a
    model per trainer: the global adapter is written in before each client's round, each client's optimizer state
    lives in its client state."""
    shared = _peft_model()
    one = federate([sft(c, model=shared) for c in range(2)], rounds=2, local_steps=2, model_name="tiny-llama",
                   settings=QUIET)
    own = federate([sft(c) for c in range(2)], rounds=2, local_steps=2, model_name="tiny-llama", settings=QUIET)
    one.run(tmp_path / "one")
    own.run(tmp_path / "own")
    assert _max_diff(_glob(tmp_path / "one"), _glob(tmp_path / "own")) < 1e-6


def test_a_plain_transformers_trainer_is_federated_too(tmp_path: Path) -> None:
    """A ``transformers.Trainer`` on a tokenized language-modelling dataset (every token scored, as
    DataCollatorForLanguageModeling labels it)."""
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    model, tok = _peft_model()
    rows = Dataset.from_dict({"input_ids": [tok(f"say {w} and {v}")["input_ids"] for w, v in zip(WORDS, WORDS[1:])]})
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, use_cpu=True,
                             report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             learning_rate=1e-2, max_steps=4)
    trainer = Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows.select(range(3)),
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False), processing_class=tok)
    fed = federate([trainer], rounds=2, model_name="tiny-llama", settings=QUIET)  # local_steps: max_steps / rounds
    assert fed.config.method.trainer.local_steps == 2
    fed.run(tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    assert [r["clients"][0]["status"] for r in recs[1:]] == ["ok", "ok"] and recs[-1]["loss"] < recs[0]["loss"]


# ---------------------------------------------------------------- what is refused


def test_what_a_round_cannot_keep_is_refused_naming_it(tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from fedpeft.resolve import load_config
    from fedpeft.runtime.server import RoundFailed

    with pytest.raises(ValueError, match="LoraConfig.use_dora=True is not supported"):
        federate([sft(lora={"use_dora": True})], rounds=1, local_steps=1, model_name="tiny-llama")
    with pytest.raises(ValueError, match="LoraConfig.init_lora_weights='pissa' changes the base weights"):
        federate([sft(lora={"init_lora_weights": "pissa"})], rounds=1, local_steps=1, model_name="tiny-llama")
    plain = Trainer(model=_tiny("causal", "llama").model, args=TrainingArguments(
        output_dir=str(tmp_path / "p"), use_cpu=True, report_to="none"), train_dataset=_data(0, 4))
    with pytest.raises(ValueError, match="not a PEFT model"):
        federate([plain], rounds=1, local_steps=1, model_name="tiny-llama")
    with pytest.raises(ValueError, match="train_sampling_strategy 'sequential'"):
        federate([sft(train_sampling_strategy="sequential")], rounds=1, local_steps=1, model_name="tiny-llama")
    with pytest.raises(ValueError, match="lr_scheduler_type 'reduce_lr_on_plateau'"):
        federate([sft(lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="steps")], rounds=1, local_steps=1,
                 model_name="tiny-llama")
    with pytest.raises(ValueError, match="model_name: the trainers' model was built in code"):
        federate([sft()], rounds=1, local_steps=1)
    with pytest.raises(ValueError, match="local_steps: give the optimizer steps per round"):
        federate([sft(max_steps=5)], rounds=2, model_name="tiny-llama")
    with pytest.raises(ValueError, match="evaluation.generate_every"):
        federate([sft()], rounds=1, local_steps=1, model_name="tiny-llama", settings={"evaluation.generate_every": 1})
    with pytest.raises(ValueError, match="base model differs"):
        other = sft(1)
        with torch.no_grad():
            other.model.get_base_model().lm_head.weight.add_(1.0)
        federate([sft(0), other], rounds=1, local_steps=1, model_name="tiny-llama")
    with pytest.raises(ValueError, match="method.trainer.name: 'hf_trainer' trains through the user's own trainers"):
        load_config(None, ["model.name=tiny-llama", "method.name=fedavg-lora", "method.trainer.name=hf_trainer"])
    with pytest.raises(ValueError, match="task.name: 'hf-trainers' holds the data of transformers Trainers"):
        from fedpeft.experiment import build_experiment

        build_experiment(federate([sft()], rounds=1, local_steps=1, model_name="tiny-llama").config)
    head_pruned = federate([sft()], rounds=1, local_steps=1, method="headprune", model_name="tiny-llama",
                           settings=QUIET)
    with pytest.raises(RoundFailed) as failed:
        head_pruned.run(tmp_path / "headprune")
    assert "method.sharing: the exchange freezes part of" in failed.value.records[0]["error"]  # head pruning's slices


# ---------------------------------------------------------------- (e) Flower


def test_a_server_without_the_clients_trainers_aggregates_their_replies(tmp_path: Path) -> None:
    """What a Flower deployment does, without Flower: the server holds one trainer of the model (no client's data),
    each node builds its own experiment and method from the config; the nodes' replies pass the server's checks,
    their num_examples taken as their weights, and the server scores the result on its own eval rows."""
    from fedpeft.build import build_method
    from fedpeft.integrations.trainer_data import trainer_experiment
    from fedpeft.integrations.transformers import server_federation
    from fedpeft.runtime.client import handle_train
    from fedpeft.runtime.server import RoundDriver

    server = server_federation(sft(0), num_clients=2, rounds=1, local_steps=1, model_name="tiny-llama",
                               settings=QUIET)
    assert not server.experiment.trainers and server.experiment.client_weights() is None
    method = build_method(server.config, server.experiment)
    driver = RoundDriver(server.config.federation, method, weights=server.experiment.client_weights())
    state = method.server_init()
    plan = driver.plan_round(state, 1)
    replies = {}
    for c in (0, 1):
        node = trainer_experiment(server.config, {c: sft(c)})
        replies[c] = handle_train(build_method(server.config, node), plan.instructions[c], node.client(c))
    new, records = driver.finish_round(state, plan, replies)
    assert [(r["status"], r["num_examples"]) for r in records] == [("ok", 6), ("ok", 6)]
    scores = method.evaluate_global(new)
    assert scores["num_examples"] == 2 and scores["loss"] < method.evaluate_global(state)["loss"]
    with pytest.raises(ValueError, match="holds the trainers of clients"):
        server.run(tmp_path / "run")



def sim_trainer(client: int):
    """What each simulated Flower node builds its client's trainer with (a module-level function: it is pickled)."""
    return sft(client, out=os.path.join(tempfile.gettempdir(), f"fedpeft-sft-{client}"))


@pytest.mark.slow
def test_flower_sim_gives_the_embedded_metrics(tmp_path: Path) -> None:
    """The same federation in Flower's simulation runtime (each node builds its trainer with ``sim_trainer`` in its
    own Ray process, its optimizer state kept in the node's client-state store between rounds) records the embedded
    run's metrics: losses, statuses, bytes."""
    pytest.importorskip("flwr")
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the Ray workers cannot import the test module
    settings = QUIET | {"runtime.threads": 1}
    emb = federate([sim_trainer(c) for c in range(2)], rounds=2, local_steps=2, model_name="tiny-llama",
                   settings=settings)
    emb.run(tmp_path / "embedded")
    sim = federate([sim_trainer(c) for c in range(2)], rounds=2, local_steps=2, model_name="tiny-llama",
                   settings=settings)
    sim.run_flower_sim(tmp_path / "sim", sim_trainer)
    drop = TIMING_FIELDS + ("flower_record_bytes", "model_loads")
    strip = lambda rs: [{k: v for k, v in r.items() if k not in drop} for r in rs]  # noqa: E731
    a, b = RunDir(tmp_path / "embedded").read_metrics(), RunDir(tmp_path / "sim").read_metrics()
    assert [r["round"] for r in b] == [0, 1, 2] and strip(b) == strip(a)
    states = sorted((tmp_path / "sim" / "client_state").glob("*/client_*/round_*.safetensors"))
    assert any("::exp_avg" in k for k in decode(states[-1].read_bytes()).tensors)  # Adam's moments kept on the node
