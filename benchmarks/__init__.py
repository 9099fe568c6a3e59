"""fedpeft's benchmarks: each module reproduces a paper's table or measures the runtime, resumably, and renders its
results file in ``benchmarks/results/``. Run one from the repository root: ``python -m benchmarks.<name> --help``.
What they share: ``runner`` (running a config as a resumable job, the common options), ``stats`` (the one statistics
module: mean ± std, paired 95 % intervals with CPU–GPU pairs counted, standard errors, the bootstrap), ``budget``
(each arm's training budget, planned from its config and measured from its runs, for every table's budget column)
and ``grids`` (the arms as data; a grid's ``budget_differences`` declares what its paired arms may differ in)."""
