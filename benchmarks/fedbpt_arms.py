"""The FedBPT benchmark's grid (``benchmarks/fedbpt.py``): budget scales, tasks, partitions and arms, and the config
overrides of each job, so that running, post-hoc scoring and the report build the very same configs."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
SCALES = {  # the defaults of the budget flags
    "cpu": {"dim": 30, "tokens": 5, "iterations": 5, "popsize": 5, "rounds": 20, "every": 5, "device": "cpu",
            "runs_dir": "runs/fedbpt", "results": HERE / "results" / "fedbpt.md"},
    "paper": {"dim": 500, "tokens": 50, "iterations": 8, "popsize": 5, "rounds": 200, "every": 10, "device": "cuda",
              "runs_dir": "runs/fedbpt-paper", "results": HERE / "results" / "fedbpt_paper_scale.md"},
}
TASKS = {  # max_test None: the whole dev/test set
    "sst2": {"max_test": None, "max_length": 64, "perturb": 0.6},    # 872 dev examples; r_p: paper's best (Table 4)
    "agnews": {"max_test": 1000, "max_length": 64, "perturb": 0.4},  # 1,000 of 7,600, stratified, seeded
}
ALPHAS = {"1.0": 2, "0.1": 1}  # alpha -> partition.min_size (alpha 0.1 cannot give every SST-2 client 2 examples)
MODELS = ("minilm", "smollm2")
ARMS = {  # key -> (label, depends on the partition)
    "manual": ("Manual prompt (raw)", False),
    "manual-cal": ("Manual prompt (contextual calibration)", False),
    "fedavg-bbt": ("FedAvg-BBT", True),
    "fedavg-bbt-2x": ("FedAvg-BBT, query-matched (2I iterations)", True),
    "fedbpt": ("FedBPT (clean loss uploaded, paper)", True),
    "fedbpt-ratio": ("FedBPT (ratio uploaded, authors' code)", True),
    "fedbpt-rp0": ("FedBPT, r_p = 0 (server CMA-ES only)", True),
    "central": ("Centralised BBT (1 client, pooled data; upper bound)", False),
    "local": ("Local-only BBT (personalised: own test shard, pooled)", True),
}
REFERENCE, MATCHED, HEADLINE = "fedavg-bbt", "fedavg-bbt-2x", "fedbpt"
BLACK_BOX = ("fedavg-bbt", "fedavg-bbt-2x", "fedbpt", "fedbpt-ratio", "fedbpt-rp0", "central")


def part_key(arm: str, alpha: str) -> str:
    return f"a{alpha}" if ARMS[arm][1] else "shared"


def job_name(model: str, task: str, part: str, arm: str, seed: int) -> str:
    return f"{model}__{task}__{part}__{arm}__s{seed}"


def arm_overrides(args, model: str, task: str, arm: str) -> list[str]:
    """The arm's method settings on top of the common ones; every trained arm has the same d, m, lambda."""
    adapter = [f"method.adapter.num_tokens={args.tokens}", f"method.adapter.intrinsic_dim={args.dim}"]
    cmaes = [*adapter, f"method.trainer.iterations={args.iterations}", f"method.trainer.popsize={args.popsize}",
             "method.trainer.evaluate_start=true"]  # clean loss of the incoming global z on each client's data
    calibrated = ["model.calibration=contextual"]
    trained_readout = calibrated if model == "smollm2" else []
    rp = TASKS[task]["perturb"]
    return {
        "manual": ["method.name=manual-prompt", "federation.rounds=1", "evaluation.round_zero=false"],
        "manual-cal": ["method.name=manual-prompt", "federation.rounds=1", "evaluation.round_zero=false",
                       *calibrated],
        "fedavg-bbt": ["method.name=fedavg-bbt", *cmaes, *trained_readout],
        "fedavg-bbt-2x": ["method.name=fedavg-bbt", *cmaes, f"method.trainer.iterations={2 * args.iterations}",
                          *trained_readout],
        "fedbpt": ["method.name=fedbpt", *cmaes, f"method.trainer.perturb_rate={rp}",
                   "method.trainer.server_fitness=clean", *trained_readout],
        "fedbpt-ratio": ["method.name=fedbpt", *cmaes, f"method.trainer.perturb_rate={rp}",
                         "method.trainer.server_fitness=ratio", *trained_readout],
        "fedbpt-rp0": ["method.name=fedbpt", *cmaes, "method.trainer.perturb_rate=0.0", *trained_readout],
        # FedAvg over one client: BBT on the pooled few-shot set, T rounds of I iterations (paths reset per round)
        "central": ["method.name=fedavg-bbt", *cmaes, "federation.num_clients=1", *trained_readout],
        # BBT on each client alone (post-tuning after one no-training round): T*I iterations of lambda candidates
        # from z = 0 with sigma = 1 on all its examples (no dev split), scored on its own test shard
        "local": ["method.name=bbt-local", *adapter, f"method.post_tuning.popsize={args.popsize}",
                  f"method.post_tuning.iterations={args.rounds * args.iterations}", "method.post_tuning.sigma=1.0",
                  "method.post_tuning.shots=100000", "method.post_tuning.select=last", "federation.rounds=1",
                  "evaluation.local=true", "evaluation.round_zero=false", *trained_readout],
    }[arm]


def overrides(args, model: str, task: str, part: str, arm: str, seed: int) -> list[str]:
    t = TASKS[task]
    max_test = args.max_test if args.max_test is not None else t["max_test"]
    common = [f"seed={seed}", f"task.name={task}", "task.few_shot=40", f"task.max_length={t['max_length']}",
              *([f"task.max_test={max_test}"] if max_test else []), f"model.name={model}",
              *([f"model.pooling={args.pooling}"] if model == "minilm" and args.pooling != "none" else []),
              "federation.num_clients=10", f"federation.rounds={args.rounds}", f"evaluation.every={args.every}",
              "evaluation.local=false", f"evaluation.batch_size={args.eval_batch}", "evaluation.report=false",
              "runtime.progress=false", f"runtime.threads={args.threads}", f"runtime.device={args.device}"]
    if part.startswith("a"):
        alpha = part[1:]
        common += ["federation.partition.scheme=dirichlet", f"federation.partition.alpha={alpha}",
                   f"federation.partition.min_size={ALPHAS[alpha]}"]
    else:
        common.append("federation.partition.scheme=iid")
    placement = [f"method.adapter.placement={args.placement}"] \
        if model == "smollm2" and args.placement != "prefix" and not arm.startswith("manual") else []
    return common + arm_overrides(args, model, task, arm) + placement  # later overrides win


def plan(args) -> list[tuple[str, str, str, str, int]]:
    """(model, task, part, arm, seed): model by model, seeds outermost, partition-free arms once per seed."""
    jobs = []
    for model in args.models:
        for seed in args.seeds:
            for task in args.tasks:
                for arm in args.arms:
                    if not ARMS[arm][1]:
                        jobs.append((model, task, "shared", arm, seed))
                for alpha in args.alphas:
                    jobs += [(model, task, f"a{alpha}", arm, seed) for arm in args.arms if ARMS[arm][1]]
    return jobs


def contrasts(args) -> list[tuple[str, str, list[str], list[str]]]:
    """(arm, reference, the arm's overrides, the reference's) of every paired contrast the results file reads: each
    arm but local-only (personalised) against FedAvg-BBT, FedBPT's arms against the query-matched FedAvg-BBT, FedBPT
    against r_p = 0 (criterion 3); on each task (r_p is the task's), with the first model and α (a budget does not
    depend on them), for the budget test over the grids (``benchmarks/grids/fedbpt.yaml`` declares the
    differences)."""
    model, alpha = args.models[0], args.alphas[0]
    pairs = [(a, REFERENCE) for a in args.arms if a not in (REFERENCE, "local")]
    pairs += [(a, MATCHED) for a in args.arms if a.startswith("fedbpt")] + [(HEADLINE, "fedbpt-rp0")]
    one = lambda task, arm: overrides(args, model, task, part_key(arm, alpha), arm, 0)  # noqa: E731
    return [(a, r, one(t, a), one(t, r)) for t in args.tasks for a, r in pairs if {a, r} <= set(args.arms)]
