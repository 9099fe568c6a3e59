"""Runtimes that drive the pure method contract: embedded (in one process) and Flower (simulation, deployment)."""
