"""Running the benchmark grids on a GPU machine that has no network and a transfer limit per call (README.md)."""
