"""Flower runtimes: the same fedpeft methods driven by Flower 1.41's Message API.

``flower-sim`` (``simulation.run_flower_sim``) runs a ServerApp thread plus Ray-backed ClientApps in
one command; ``flower`` (``deployment.run_flower``) submits the same ServerApp/ClientApp pair with
``flwr run`` to a SuperLink whose SuperNodes own the client partitions. Both share the round loop
of the embedded runtime (``runtime.session``) and carry fedpeft codec bytes inside Flower records.
Nothing here imports ``flwr`` at package import time.
"""
