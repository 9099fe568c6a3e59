"""Runtimes that drive the pure method contract: embedded (in-process) now, Flower later."""
