"""fedpeft's benchmarks: each module reproduces a paper's table or measures the runtime, resumably, and renders its
results file in ``benchmarks/results/``. Run one from the repository root: ``python -m benchmarks.<name> --help``.
``runner`` holds what they share (running a config as a resumable job, paired statistics)."""
