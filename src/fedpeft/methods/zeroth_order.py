"""Seeded zeroth-order federated tuning as presets: every parameter trained from forward passes, kilobytes a round.

- ``decomfl`` (Li et al., ICLR 2025): the server draws one seed per local step; each client runs zeroth-order SGD
  (``trainers.zo_sgd``, forward difference, P = 5 perturbations, μ = 1e-3, η = 1e-5, one step of 32 examples a round:
  the authors' OPT-125M SST-2 recipe) and uploads its P scalars per step; the server averages them uniformly and
  replays the steps (``aggregators.seed_replay``).
- ``fedkseed`` (Qin et al., ICML 2024): K = 4096 candidate seeds fixed by the run seed; each step samples one
  (central difference, μ = 5e-4, η = 3e-7, 200 steps of one example: the authors' README recipe), the client uploads
  one summed scalar per candidate and the server takes their example-weighted mean per seed.
- ``fedkseed-pro`` (the same paper, §4.2): FedKSeed with probability-differentiated sampling: a candidate is drawn
  with the probability the server sends, a softmax of its mean scalar amplitude so far; the clients also upload
  per-candidate amplitude sums and draw counts.

Both tune the ``full`` adapter (every backbone weight, as ``fedavg-full``); any float adapter (LoRA, a soft prompt)
can take its place with ``--set method.adapter.name=...``. Downloads are the seeds and mean scalars of the rounds a
client missed (``downlink.seed_history``), replayed on the copy it holds; ``--set method.downlink.name=dense`` sends
the tensors instead.
"""

from fedpeft.methods.base import preset

preset("decomfl", "DeComFL (Li et al. 2025): zeroth-order SGD on every weight from server-drawn seeds, P scalars per "
       "step up, uniform mean replayed",
       adapter={"name": "full"},
       trainer={"name": "zo_sgd", "seeds": "server", "difference": "forward", "perturbations": 5, "mu": 1e-3,
                "lr": 1e-5, "local_steps": 1, "batch_size": 32},
       aggregator={"name": "seed_replay", "weighting": "uniform"}, downlink={"name": "seed_history"})

FEDKSEED_TRAINER = {"name": "zo_sgd", "seeds": "pool", "pool_size": 4096, "difference": "central", "perturbations": 1,
                    "mu": 5e-4, "lr": 3e-7, "local_steps": 200, "batch_size": 1}

preset("fedkseed", "FedKSeed (Qin et al. 2024): zeroth-order SGD on every weight from K candidate seeds, one summed "
       "scalar per seed up, example-weighted mean replayed",
       adapter={"name": "full"}, trainer=FEDKSEED_TRAINER,
       aggregator={"name": "seed_replay", "weighting": "examples"}, downlink={"name": "seed_history"})

preset("fedkseed-pro", "FedKSeed-Pro (Qin et al. 2024, §4.2): FedKSeed whose clients draw candidate seeds by the "
       "importance the server sends (mean scalar amplitude), not uniformly",
       adapter={"name": "full"}, trainer=FEDKSEED_TRAINER | {"sampling": "importance"},
       aggregator={"name": "seed_replay", "weighting": "examples"}, downlink={"name": "seed_history"})
