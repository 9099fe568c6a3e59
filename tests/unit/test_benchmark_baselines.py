"""The baselines and budgets the results tables add from finished runs: secure aggregation's starting-model row
(the runs whose rounds all halted) with its paired difference from the plain runs, and the budget column."""

import json


def _secagg_run(out, args, method, mode, seed, accuracy, halted):
    """A finished secagg run directory: two rounds (the first unscored), both halted or both completed."""
    from benchmarks.secagg import overrides

    from fedpeft.config import dump_config
    from fedpeft.resolve import load_config

    out.mkdir()
    (out / "config.yaml").write_text(dump_config(load_config(None, overrides(args, method, 100, mode, seed))))
    clients = [{"client": c, "status": "failed" if halted else "ok", "steps": None if halted else 1,
                "num_examples": 40} for c in range(2)]
    recs = [{"round": r, "accuracy": None if r == 1 else accuracy, "clients": clients, "bytes_up": 10,
             "bytes_down": 10, "wall_seconds": 2.0} | ({"round_failed": f"round {r}: halted"} if halted else {})
            for r in (1, 2)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (out / "summary.json").write_text(json.dumps({"label_histograms": {"train": [[20, 20]], "test": [[400, 472]]}}))


def test_secagg_reads_the_starting_model_from_the_runs_whose_rounds_all_halted(tmp_path):
    """Round 0 is not scored: a run that completed no round is scored on the starting model, paired with the plain
    run of its seed; an unresolved difference says the dropout rows' accuracy cannot tell halted rounds apart."""
    from benchmarks.secagg import job_name, parse, render

    args = parse(["--runs-dir", str(tmp_path), "--results", str(tmp_path / "s.md"), "--notes",
                  str(tmp_path / "none.md"), "--clients", "100", "--seeds", "0", "1"])
    lora = "LoRA all-linear (FedIT-style)"
    for seed, plain in enumerate([0.75, 0.76]):
        _secagg_run(tmp_path / job_name(lora, 100, "plain", seed), args, lora, "plain", seed, plain, False)
        _secagg_run(tmp_path / job_name(lora, 100, "SecAgg+, 30 % dropouts", seed), args, lora,
                    "SecAgg+, 30 % dropouts", seed, 0.744, True)
    table = render(args).read_text()
    # 74.4 − 75 and 74.4 − 76: −1.1 ± 0.71, half-width 12.71 × 0.71 / √2 = 6.35
    assert (f"| {lora} | no round completed (the starting model) | 2/2 | 74.4 ± 0.0 | -1.1 [-7.5, +5.3] (n=2) |"
            in table)
    assert f"resolved for {lora} (-1.1 [-7.5, +5.3] (n=2))" in table
    plain_row = next(line for line in table.splitlines() if line.startswith(f"| {lora} | plain |"))
    assert plain_row.endswith("| 1.0 steps · 16 ex. · lr 3e-4 · wd 0 · cpu |")  # 1 step of batch 16 at 100 clients
    halted_row = next(line for line in table.splitlines() if line.startswith(f"| {lora} | SecAgg+, 30 %"))
    assert halted_row.endswith("| 0/2, 0/2 | lr 3e-4 · wd 0 · cpu |")  # no accepted reply: no steps
