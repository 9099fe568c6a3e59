"""``fedpeft.integrations.transformers`` with TRL ``DPOTrainer``s on a tiny random LLaMA with a PEFT LoRA adapter: one
round equals fedpeft's own ``dpo`` trainer on the same batches; the run's scores of the global adapter equal TRL's
own ``DPOTrainer.evaluate()`` of it; what fedpeft's scoring cannot follow is refused, naming the option."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")

from fedpeft.adapters.peft_model import PeftLora  # noqa: E402
from fedpeft.integrations.transformers import federate  # noqa: E402
from fedpeft.tracking.rundir import RunDir  # noqa: E402
from tests.unit.test_integrations_transformers import (  # noqa: E402
    QUIET, WORDS, _glob, _init, _max_diff, _peft_model, sft)

pytestmark = pytest.mark.usefixtures("one_thread")


def _pairs(client: int, n: int):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"say {WORDS[(i + client) % 8]}" for i in range(n)],
                              "chosen": [f" {WORDS[(i + client) % 8]}" for i in range(n)],
                              "rejected": [f" {WORDS[(i + 3 + client) % 8]} {WORDS[(5 * i) % 8]}" for i in range(n)]})


def dpo(client: int = 0, n: int = 6, batch: int = 3, ref_model=None, **config):
    """A DPOTrainer of client ``client``: float32, lr 1e-2, linear decay, beta 0.1 (TRL's defaults otherwise)."""
    from trl import DPOConfig, DPOTrainer

    model, tok = _peft_model()
    args = DPOConfig(**{"output_dir": os.path.join(tempfile.gettempdir(), "fedpeft-dpo"),
                        "per_device_train_batch_size": batch, "per_device_eval_batch_size": 8, "learning_rate": 1e-2,
                        "bf16": False, "use_cpu": True, "report_to": "none", "save_strategy": "no",
                        "logging_strategy": "no", "disable_tqdm": True} | config)
    data = _pairs(client, n)
    return DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=data,
                      eval_dataset=data.select(range(4)), processing_class=tok)


def test_one_dpo_round_equals_fedpeft_dpo_on_the_same_batches(tmp_path: Path) -> None:
    """Two clients, 6 pairs each, batches of 3 pairs in fedpeft's (seed, round, client) order, 2 steps of AdamW at
    1e-2 decaying linearly, gradients clipped at 1, beta 0.1: TRL's DPO round and fedpeft's dpo trainer give the same
    global adapter to float rounding, and the same losses."""
    hf = federate([dpo(0), dpo(1)], rounds=1, local_steps=2, model_name="tiny-llama", settings=QUIET)
    ours = federate([dpo(0), dpo(1)], rounds=1, model_name="tiny-llama", settings=QUIET | {
        "method.trainer.name": "dpo", "method.trainer.lr": 1e-2, "method.trainer.batch_size": 3,
        "method.trainer.max_steps": 2, "method.trainer.schedule": "linear", "method.trainer.grad_clip": 1.0,
        "method.trainer.beta": 0.1})
    assert hf.config.method.trainer.name == "hf_dpo_trainer" and hf.config.task.kind == "preference"
    hf.run(tmp_path / "hf")
    ours.run(tmp_path / "ours")
    a, b = _glob(tmp_path / "hf"), _glob(tmp_path / "ours")
    assert _max_diff(b, _init(hf)) > 5e-3
    assert _max_diff(a, b) < 1e-6
    rec_hf, rec_ours = RunDir(tmp_path / "hf").read_metrics(), RunDir(tmp_path / "ours").read_metrics()
    for c_hf, c_ours in zip(rec_hf[-1]["clients"], rec_ours[-1]["clients"]):
        assert c_hf["status"] == c_ours["status"] == "ok" and c_hf["steps"] == c_ours["steps"] == 2
        assert c_hf["train_loss"] == pytest.approx(c_ours["train_loss"], abs=1e-5)
    assert rec_hf[0]["accuracy"] == 0.5 and rec_hf[0]["loss"] == pytest.approx(0.6931472, abs=1e-6)  # no adapter yet
    for key in ("accuracy", "loss", "reward_margin"):
        assert rec_hf[-1][key] == pytest.approx(rec_ours[-1][key], abs=1e-5), key


def test_the_runs_scores_equal_trls_own_evaluate(tmp_path: Path) -> None:
    """One client, 3 rounds: the final global adapter loaded into a fresh DPOTrainer, TRL's evaluate() on the same
    4 eval pairs gives the loss, reward accuracy and margin the run recorded for its last round."""
    fed = federate([dpo(0)], rounds=3, local_steps=2, model_name="tiny-llama", settings=QUIET)
    fed.run(tmp_path / "fed")
    last = RunDir(tmp_path / "fed").read_metrics()[-1]
    judge = dpo(0)
    PeftLora(judge.model).load(_glob(tmp_path / "fed"))
    theirs = judge.evaluate()
    assert last["loss"] == pytest.approx(theirs["eval_loss"], abs=1e-5)
    assert last["reward_margin"] == pytest.approx(theirs["eval_rewards/margins"], abs=1e-5)
    assert last["accuracy"] == pytest.approx(theirs["eval_rewards/accuracies"], abs=1e-6)  # no tie after training
    assert last["loss"] < 0.69  # the rounds learnt something


def test_what_fedpeft_cannot_score_is_refused_naming_it() -> None:
    from trl import DPOTrainer

    with pytest.raises(ValueError, match=r"DPOConfig.loss_type \['hinge'\]"):
        federate([dpo(loss_type=["hinge"])], rounds=1, local_steps=1, model_name="tiny-llama")
    with pytest.raises(ValueError, match="ref_model: fedpeft scores against the base model"):
        federate([dpo(ref_model=_peft_model()[0].get_base_model())], rounds=1, local_steps=1,
                 model_name="tiny-llama")
    with pytest.raises(ValueError, match="all DPOTrainers or none"):
        federate([dpo(0), sft(1)], rounds=1, local_steps=1, model_name="tiny-llama")
    with pytest.raises(ValueError, match="their DPOConfigs differ"):
        federate([dpo(0), dpo(1, beta=0.5)], rounds=1, local_steps=1, model_name="tiny-llama")
    assert issubclass(type(dpo()), DPOTrainer)
