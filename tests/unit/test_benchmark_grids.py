"""The benchmark scripts' shared statistics and their grids: paired intervals by hand, and every planned job's
overrides resolve to a valid config (a renamed config key would otherwise surface hours into a benchmark)."""

import math

import pytest

def test_paired_interval_by_hand():
    from benchmarks.stats import paired_cell, paired_ci

    mean, lo, hi = paired_ci([1.0, 2.0, 3.0])  # mean 2, sample sd 1, t(0.975, 2 df) = 4.302653
    half = 4.302653 / math.sqrt(3)
    assert mean == pytest.approx(2.0)
    assert (lo, hi) == (pytest.approx(2.0 - half, abs=1e-5), pytest.approx(2.0 + half, abs=1e-5))
    assert paired_cell([1.0, 2.0, 3.0]) == "+2.0 [-0.5, +4.5] (n=3)"
    assert paired_cell([-1.25]) == "-1.2 (n=1)" and paired_cell([]) == "–" and paired_ci([0.5]) is None


def test_welch_interval_matches_scipy():
    from scipy.stats import ttest_ind

    from benchmarks.stats import welch_cell, welch_ci

    a, b = [84.0, 85.5, 83.0], [82.0, 84.5, 81.0, 83.5]
    ref = ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    m, lo, hi = welch_ci(a, b)
    assert m == pytest.approx(sum(a) / 3 - sum(b) / 4)
    assert (lo, hi) == (pytest.approx(ref.low), pytest.approx(ref.high))
    assert welch_cell([1.0], [0.5]) == "+0.5 (n=1 vs 1, no interval)" and welch_cell([], b) == "–"
    assert welch_cell(a, b).endswith("(n=3 vs 4, unpaired)")


def test_the_per_item_interval_is_the_normal_one_by_hand():
    from benchmarks.stats import items_cell

    d = [100.0, 0.0, 0.0, 0.0, -100.0, 0.0, 100.0, 0.0]  # mean 12.5, sd 64.09, se 22.66
    assert items_cell(d) == "+12.5 [-31.9, +56.9] (n=8)"
    assert items_cell([1.0]) == "–" and items_cell([]) == "–"


@pytest.mark.parametrize("argv", [
    [],
    ["--paper-scale"],
    ["--models", "smollm2", "--placement", "suffix", "--tasks", "sst2", "--alphas", "1.0"],
])
def test_every_fedbpt_job_resolves_to_a_valid_config(argv):
    from benchmarks.fedbpt import parse
    from benchmarks.fedbpt_arms import overrides, plan

    from fedpeft.resolve import load_config

    args = parse(argv)
    jobs = plan(args)
    assert len(jobs) == len(set(jobs)) > 0
    for job in jobs:
        cfg = load_config(None, overrides(args, *job))
        model, task, part, arm, seed = job
        assert (cfg.model.name, cfg.task.name, cfg.seed) == (model, task, seed)
        assert cfg.federation.partition.scheme == ("iid" if part == "shared" else "dirichlet")


@pytest.mark.parametrize("argv", [[], ["--paper-scale", "--device", "cuda"]])
def test_every_generation_job_resolves_and_the_empty_table_renders(tmp_path, argv):
    from benchmarks.generation import ARMS, job_name, overrides, parse, plan, render

    from fedpeft.resolve import load_config

    args = parse([*argv, "--runs-dir", str(tmp_path), "--results", str(tmp_path / "g.md"), "--notes",
                  str(tmp_path / "none.md")])
    jobs = plan(args)
    assert len({job_name(*j) for j in jobs}) == len(jobs) == 3 * (7 + 4)  # the superseded local-only too
    for task, arm, seed in jobs:
        cfg = load_config(None, overrides(args, task, arm, seed))
        assert (cfg.task.name, cfg.seed, cfg.model.name) == (task, seed, "smollm2")
        assert cfg.evaluation.round_zero == arm.startswith("fedit")  # the zero-shot row comes from fedit's round 0
        central = arm == "centralised LoRA"
        assert cfg.federation.num_clients == (1 if central else {"webnlg": 10, "dolly": 8}[task])
        assert cfg.method.trainer.max_steps == args.steps * (10 if central and task == "webnlg" else
                                                             8 if central else 1)
    assert set(ARMS) >= {a for _, a, _ in jobs}
    table = render(args).read_text()
    assert table.count("| 0/3 |") == 11 and "## webnlg" in table and "## dolly" in table


def test_the_flowertune_comparison_runs_fedit_on_both_runtimes():
    from benchmarks.flowertune import ARMS, fedpeft_overrides, parse

    from fedpeft.resolve import load_config

    args = parse([])
    for runtime, extra in [v for v in ARMS.values() if v[0] != "peer"]:
        cfg = load_config(None, fedpeft_overrides(args, runtime, extra))
        assert cfg.runtime.padding_free == ("runtime.padding_free=true" in extra)
        assert (cfg.method.name, cfg.runtime.name, cfg.federation.num_clients) == ("fedit", runtime, args.clients)
        assert (cfg.method.adapter.r, cfg.method.adapter.lora_alpha) == (args.r, args.alpha)  # the template's LoRA
        assert cfg.method.trainer.max_steps == args.steps and cfg.method.trainer.lr == args.lr


@pytest.mark.parametrize("argv", [[], ["--full", "--device", "cuda"]])
def test_every_lora_family_job_resolves_and_the_empty_table_renders(tmp_path, argv):
    from benchmarks.lora_family import GENERATION, HEADPRUNE, family_arms, job_name, overrides, parse, plan, render

    from fedpeft.resolve import load_config

    args = parse([*argv, "--runs-dir", str(tmp_path), "--results", str(tmp_path / "f.md"), "--notes",
                  str(tmp_path / "none.md"), "--generation-runs", str(tmp_path / "gen")])
    jobs = plan(args)
    family = len(args.family_partitions) * sum(len(family_arms(t)) for t in args.family_tasks)
    assert len({job_name(*j) for j in jobs}) == len(jobs) == 3 * (family + 2 * len(HEADPRUNE) + len(GENERATION))
    for part, task, partition, arm, seed in jobs:
        cfg = load_config(None, overrides(args, part, task, partition, arm, seed))
        assert (cfg.task.name, cfg.seed) == (task, seed)
        assert (cfg.runtime.device, cfg.runtime.threads) == (args.device, args.threads)  # the generation arms too
        tiered = "4/8/16" in arm
        assert [p.rank for p in cfg.federation.client_profiles] == ([4, 8, 16] if tiered else [])
        if part == "generation":
            assert cfg.model.name == "smollm2" and cfg.method.adapter.target_modules == ["all-linear"]
            continue
        assert cfg.model.name == "minilm" and cfg.federation.num_clients == args.clients
        if cfg.method.adapter.name == "lora":  # one LoRA scaling alpha / r = 2 in every arm
            assert cfg.method.adapter.lora_alpha / cfg.method.adapter.r == 2
        if part == "headprune":
            assert cfg.method.sharing.name == "head_pruning" and cfg.federation.partition.scheme == "iid"
    (tmp_path / "gen").mkdir()  # the generation benchmark's runs folder, empty
    table = render(args).read_text()
    assert table.count("| 0/3 |") == len(jobs) // 3 + 3  # every arm unfinished, and the generation rows read back


def test_a_lora_family_row_reads_the_final_round_and_the_clients_mean(tmp_path):
    """The row of a finished run: the final round's global accuracy (not the best), the mean of the clients' own
    accuracies (the record holds them per client too), the codec's bytes and the device from its config."""
    import json

    from benchmarks.lora_family import _row

    from fedpeft.config import dump_config
    from fedpeft.resolve import load_config

    (tmp_path / "config.yaml").write_text(dump_config(load_config(None, ["runtime.device=cuda"])))
    recs = [{"round": 0, "accuracy": 0.1, "bytes_up": 0}, {"round": 1, "accuracy": 0.9, "bytes_up": 40},
            {"round": 2, "accuracy": 0.7, "bytes_up": 40, "local_accuracy": {"0": 0.5, "1": 0.75},
             "local_accuracy_mean": 0.625}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "summary.json").write_text(json.dumps({"bytes_up_per_client_round": 20.0,
                                                       "bytes_down_per_client_round": 30.0,
                                                       "label_histograms": {"train": [[1]], "test": [[1]]}}))
    row = _row(tmp_path)
    assert (row["final"], row["local"], row["up"], row["device"]) == (0.7, 0.625, 20.0, "cuda")
    assert row["curve"] == [(0.9, 40), (0.7, 80)]  # upload after each round beside the accuracy reached


def test_dolly_rows_read_the_grounded_categories_and_pair_the_arms_by_seed(tmp_path):
    """Local-only's grounded ROUGE-L is the mean of the grounded categories' clients on their own entries (not of
    every client), and so is its per-category test loss; the paired differences pair each seed's final rounds,
    zero-shot being fedit's round 0."""
    import json

    from benchmarks.generation import GROUNDED, job_name, parse, render

    from fedpeft.config import dump_config
    from fedpeft.resolve import load_config

    names = ["brainstorming", *GROUNDED, "creative_writing"]  # 6 clients, 4 of them grounded

    def write(arm, seed, recs):
        out = tmp_path / job_name("dolly", arm, seed)
        out.mkdir()
        (out / "config.yaml").write_text(dump_config(load_config(None, [])))
        (out / "metrics.jsonl").write_text("".join(json.dumps(r | {"bytes_up": 6, "num_ok": 6}) + "\n"
                                                   for r in recs))
        (out / "summary.json").write_text(json.dumps({"client_names": dict(enumerate(names))}))

    def global_rec(rnd, score):
        return {"round": rnd, "loss": 2.0, "generation": {"by_group": {g: {"rouge_l": score} for g in names}},
                "by_group": {g: {"loss": 2.5 if rnd == 0 else 1.5} for g in names}}

    for seed, (local, fed) in enumerate([(10.0, 30.0), (20.0, 34.0)]):
        own = {str(c): {"rouge_l": 90.0 if n not in GROUNDED else local + c} for c, n in enumerate(names)}
        losses = {str(c): 2.0 + seed + c / 10 for c in range(len(names))}  # each client its own loss
        write("local-only LoRA", seed, [{"round": 3, "local_generation": own, "local_loss": losses}])
        write("fedit (LoRA all-linear, FedAvg)", seed, [global_rec(0, 5.0), global_rec(3, fed)])
    args = parse(["--runs-dir", str(tmp_path), "--results", str(tmp_path / "g.md"), "--notes",
                  str(tmp_path / "none.md"), "--tasks", "dolly", "--seeds", "0", "1"])
    table = render(args).read_text()
    # clients 1-4 are grounded: seed 0 mean 10 + 2.5, seed 1 mean 20 + 2.5; closed_qa is client 1
    assert "| local-only LoRA | 17.5 ± 7.1 | 16.0 ± 7.1 |" in table
    fedit = "| fedit (LoRA all-linear, FedAvg) − "
    assert fedit + "local-only LoRA | grounded ROUGE-L | +14.5 [-23.6, +52.6] (n=2) |" in table
    assert fedit + "zero-shot | grounded ROUGE-L | +27.0 [+1.6, +52.4] (n=2) |" in table
    assert fedit + "centralised LoRA | grounded ROUGE-L | – |" in table
    # per-category test loss: local-only each category's client's own adapter (client c: 2.0 + c/10, then 3.0 +
    # c/10), e^mean beside; the last column is the mean of the 6 categories
    row = next(line for line in table.splitlines() if line.startswith("| local-only LoRA | 2."))
    assert row.startswith("| local-only LoRA | 2.50 ± 0.71 (12.2) | 2.60 ± 0.71 (13.5) | ")
    assert row.endswith(" | 3.00 ± 0.71 (20.1) | 2.75 ± 0.71 (15.6) |")
    assert "| zero-shot (round 0 of fedit) | 2.50 ± 0.00 (12.2) | " in table
    loss = " | test loss, mean over the clients' categories (×100) | "
    assert fedit + "local-only LoRA" + loss + "-125.0 [-760.3, +510.3] (n=2) |" in table
    assert fedit + "zero-shot" + loss + "-100.0 [-100.0, -100.0] (n=2) |" in table


def test_centralised_webnlg_own_categories_are_the_federations_training_categories(tmp_path):
    """A centralised run has one client and no category names: its "own category" cells average the global
    adapter's scores on the categories the federated runs' clients hold (not the unseen ones)."""
    import json

    from benchmarks.generation import job_name, parse, render

    from fedpeft.config import dump_config
    from fedpeft.resolve import load_config

    scores = {"Airport": 10.0, "Astronaut": 20.0, "Athlete": 90.0}  # Athlete: unseen

    def write(arm, names):
        out = tmp_path / job_name("webnlg", arm, 0)
        out.mkdir()
        (out / "config.yaml").write_text(dump_config(load_config(None, [])))
        rec = {"round": 3, "loss": 1.0, "generation": {"by_group": {g: {"bleu": s, "chrf": s} for g, s in
                                                                     scores.items()}}}
        (out / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
        (out / "summary.json").write_text(json.dumps({"bytes_up_per_client_round": 8.0} |
                                                     ({"client_names": names} if names else {})))

    write("fedit (LoRA all-linear, FedAvg)", {"0": "Airport", "1": "Astronaut"})
    write("centralised LoRA", None)
    args = parse(["--runs-dir", str(tmp_path), "--results", str(tmp_path / "g.md"), "--notes",
                  str(tmp_path / "none.md"), "--tasks", "webnlg", "--seeds", "0"])
    table = render(args).read_text()
    assert "| centralised LoRA | 15.0 | 15.0 |" in table
    assert "| fedit (LoRA all-linear, FedAvg) | 15.0 | 15.0 |" in table


def test_every_secagg_job_resolves_and_the_empty_table_renders(tmp_path):
    from benchmarks.secagg import MODES, SCOPE, job_name, overrides, parse, plan, render

    from fedpeft.resolve import load_config

    args = parse(["--runs-dir", str(tmp_path), "--results", str(tmp_path / "s.md"), "--notes", str(tmp_path / "n.md")])
    jobs = plan(args)
    scoped = 3 * 1 * len(SCOPE)  # each scoped mode: 10 clients, one method, 3 seeds
    assert len({job_name(*j) for j in jobs}) == len(jobs) == 3 * 2 * 3 * (len(MODES) - len(SCOPE)) + scoped
    for method, clients, mode, seed in jobs:
        cfg = load_config(None, overrides(args, method, clients, mode, seed))
        assert cfg.federation.num_clients == clients and cfg.seed == seed
        assert (cfg.federation.secure_aggregation is not None) == (mode != "plain")
    assert render(args).read_text().count("| 0/3 |") == len(jobs) // 3


def _arms(grid: dict) -> dict[str, list[str]]:
    """Every arm of a grid file: label -> overrides (group tables flattened)."""
    out = {}
    for key in ("arms", "methods", "family", "attack_arms", "sst2_arms"):
        table = grid.get(key, {})
        for label, value in table.items():
            out |= value if isinstance(value, dict) else {label: value}
    return out


@pytest.mark.parametrize("name", ["discrete_prompt", "fedpeptao", "fedprompt_security", "headprune"])
def test_every_arm_of_a_grid_file_resolves_to_a_valid_config(name):
    """The grid files the other tests do not plan: each arm's overrides, on the benchmark's model, are a valid
    config (a typo in benchmarks/grids/*.yaml fails here, not hours into a run)."""
    from benchmarks.grids import load_grid

    from fedpeft.resolve import load_config

    arms = _arms(load_grid(name))
    assert arms
    for label, overrides in arms.items():
        assert all(isinstance(o, str) and "=" in o for o in overrides), (label, overrides)
        load_config(None, ["model.name=minilm", "task.name=sst2", *overrides])


def test_every_grid_file_is_read_by_its_benchmark():
    from pathlib import Path

    here = Path(__file__).resolve().parents[2] / "benchmarks"
    for grid in (here / "grids").glob("*.yaml"):
        assert f'load_grid("{grid.stem}")' in (here / f"{grid.stem}.py").read_text(), grid.name


@pytest.mark.parametrize("name", ["discrete_prompt", "fedpeptao", "fedprompt_security", "headprune"])
def test_each_archived_benchmark_renders_its_committed_table(name, tmp_path):
    """The archived records (``benchmarks/results/<name>_runs.tgz``) render the table rows of the committed results
    file: the grid's labels, the job names and the rendering still fit the runs that were made."""
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with tarfile.open(root / "benchmarks" / "results" / f"{name}_runs.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    out = tmp_path / f"{name}.md"
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--render-only", "--runs-dir",
                           str(tmp_path / "runs" / name), "--results", str(out)], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    committed = set((root / "benchmarks" / "results" / f"{name}.md").read_text().splitlines())
    rows = [line for line in out.read_text().splitlines() if line.startswith("|") and not line.startswith("|---")]
    assert len(rows) > 10
    missing = [row for row in rows if row not in committed]
    assert not missing, f"{len(missing)} rendered rows differ from benchmarks/results/{name}.md, e.g. {missing[:3]}"


def test_render_only_without_the_runs_folder_is_refused_not_an_empty_table(tmp_path):
    """A fresh checkout has the runs only in the archives: rendering without them must not rewrite a results file
    with empty rows (lora_family.md lost its generation rows that way for three sessions)."""
    from benchmarks.lora_family import main

    out = tmp_path / "table.md"
    with pytest.raises(SystemExit, match="no such folder"):
        main(["--render-only", "--runs-dir", str(tmp_path / "absent"), "--results", str(out)])
    (tmp_path / "runs").mkdir()
    with pytest.raises(SystemExit, match="--generation-runs .*: no such folder"):
        main(["--render-only", "--runs-dir", str(tmp_path / "runs"), "--results", str(out),
              "--generation-runs", str(tmp_path / "absent")])
    assert not out.exists()


def test_a_finished_run_counts_on_any_device_but_not_with_another_config(tmp_path):
    """A grid's rows may come from a GPU machine and the CPU: a finished run is skipped whatever device and thread
    count it ran with, and whether it scored round 0, but a finished run of other numbers (here: rounds) is an
    error, never reused."""
    from benchmarks.runner import finished

    from fedpeft.config import dump_config
    from fedpeft.resolve import load_config

    sets = ["task.name=sst2", "model.name=tiny-bert", "federation.rounds=2"]
    (tmp_path / "config.yaml").write_text(dump_config(load_config(None, [*sets, "runtime.device=cuda"])))
    assert not finished(tmp_path, sets)  # no summary.json: not finished
    (tmp_path / "summary.json").write_text("{}")
    assert finished(tmp_path, [*sets, "runtime.device=cpu", "runtime.threads=3"])
    assert finished(tmp_path, [*sets, "evaluation.round_zero=false"])  # round 0 scored or not: no later number moves
    with pytest.raises(ValueError, match="finished with another config"):
        finished(tmp_path, [*sets[:2], "federation.rounds=3"])
