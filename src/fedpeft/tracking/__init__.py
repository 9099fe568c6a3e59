"""Run directories: resolved config, metrics.jsonl, checkpoints, summary.json."""
