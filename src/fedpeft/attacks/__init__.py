"""Attacks on the federation that act on client data (backdoor poisoning) and the metrics that measure them."""
