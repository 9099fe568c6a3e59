"""Shared fixtures: tiny configs on synthetic data, so the unit tests run in seconds; and how the suite shares the
machine when pytest-xdist runs it on several workers (`make test`: one per core)."""

from __future__ import annotations

import os

import pytest
import torch

from fedpeft.resolve import load_config


def _threads_per_worker() -> int | None:
    """Under pytest-xdist, this worker's share of the cores: two workers at torch's default of one thread per core
    would each oversubscribe the machine (tiny forwards then run several times slower)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return None
    # macOS: no affinity
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(workers))


def pytest_configure(config: pytest.Config) -> None:
    threads = _threads_per_worker()
    if threads is not None:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the subprocesses a test starts (CLI runs, node workers)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The `slow` tests first (stable otherwise), so no worker is left alone with a minute-long test at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def tiny_overrides(**extra: object) -> list[str]:
    base = {
        "task.name": "synthetic-sentiment",
        "task.num_examples": 240,
        "task.max_length": 24,
        "model.name": "tiny-bert",
        "federation.num_clients": 3,
        "federation.rounds": 2,
        "method.adapter.num_tokens": 4,
        "method.trainer.max_steps": 3,
        "method.trainer.batch_size": 8,
        "evaluation.batch_size": 64,
        "evaluation.round_zero": False,  # records start at round 1 here; round 0 has its own tests
        "runtime.progress": False,
    }
    base.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in base.items() if v is not None]  # None drops a default


@pytest.fixture
def tiny_cfg():
    def make(**extra: object):
        return load_config(None, tiny_overrides(**extra))

    return make


def _single_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def one_thread():
    """Tiny forwards are far slower with 2 threads on a shared 2-core machine (oversubscription)."""
    yield from _single_thread()


@pytest.fixture(scope="module")
def one_thread_module():
    """``one_thread`` for a module's shared runs (module-scoped fixtures build them once)."""
    yield from _single_thread()


def plain_copy(backbone):
    """The shared frozen weights as a plain transformers model (what a PEFT user starts from), without fedpeft's
    injected LoRA layers."""
    from transformers import AutoConfig

    from fedpeft.backbones.loading import _auto_class

    state = {k.replace(".base_layer.", "."): v for k, v in backbone.model.state_dict().items() if ".lora_" not in k}
    config = AutoConfig.for_model(**backbone.model.config.to_dict())
    base = _auto_class(backbone.family).from_config(config, attn_implementation="eager")
    base.load_state_dict(state, strict=True)
    return base.eval()


def last_hidden_ours_and_peft(exp, params, peft_dir, rows=(0, 1, 2)):
    """The last hidden states of a few test rows under fedpeft's ``params`` and under the PEFT adapter in
    ``peft_dir`` loaded on ``plain_copy`` of the backbone, for an export test to compare."""
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(plain_copy(exp.backbone), peft_dir)
    batch = exp.objective.batch(exp.test_encoded, list(rows))
    with torch.no_grad():
        ours = exp.objective.hidden_states(params, batch)[-1]
        theirs = peft_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            output_hidden_states=True).hidden_states[-1]
    return ours, theirs


def assert_resumes_identically(cfg, root, stop_after_round: int) -> None:
    """A run stopped after ``stop_after_round`` and resumed gives the uninterrupted run's records (timing aside) and
    the same final state, tensor for tensor."""
    from fedpeft.runtime.embedded import StopAfterRound, run_embedded
    from fedpeft.tracking.rundir import RunDir
    from fedpeft.tracking.summary import TIMING_FIELDS

    run_embedded(cfg, root / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, root / "cut", stop_after_round=stop_after_round)
    run_embedded(cfg, root / "cut", resume=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    assert strip(RunDir(root / "cut").read_metrics()) == strip(RunDir(root / "full").read_metrics())
    a, b = (RunDir(root / d).load_checkpoint()[1] for d in ("full", "cut"))
    assert a.tensors.keys() == b.tensors.keys() and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert a.scalars == b.scalars
