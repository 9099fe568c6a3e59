"""Secure aggregation (SecAgg+): Flower's workflow and client mod around a fedpeft round, in every runtime."""
