"""Seeded zeroth-order SGD (SPSA / MeZO): perturbations regenerated from a seed, never stored.

MeZO (Malladi et al. 2023, Alg. 1), with DeComFL's estimator (Li et al. 2025, Alg. 1-2; the authors'
``cezo_fl/gradient_estimators/random_gradient_estimator.py``): per step, P perturbations z_i ~ N(0, I) of the
trained tensors, the projected gradient of each

    g_i = (L(θ + μ z_i) - L(θ)) / μ          (forward difference, ``rge-forward``)
    g_i = (L(θ + μ z_i) - L(θ - μ z_i)) / 2μ  (central difference, MeZO and FedKSeed)

and the update θ <- θ - η Σ_i (g_i / P) z_i, each z_i regenerated from its seed. Anyone holding θ, the seeds and
the scalars rebuilds the step exactly (``replay_``): that is what travels instead of the tensors.

z_i is drawn tensor by tensor in sorted name order from one ``torch.Generator`` per perturbation, seeded
``s·(i + 17) + i`` for step seed s (DeComFL's ``get_rng``; its ``paramwise_perturb`` mode draws per parameter in the
model's order, here in sorted name order, so that every side draws the same z whatever order its dict holds).
Perturbation and restoration run in place (θ + μz - μz is θ up to float rounding, as in MeZO and the authors' code);
the update itself is exactly the replay's arithmetic, so a client's replay of the server's history reproduces the
server's tensors bit for bit on the same kind of device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fedpeft.comm.update import Params
from fedpeft.lazy import lazy

torch = lazy("torch")


def generator_seed(step_seed: int, i: int) -> int:
    """The seed of perturbation ``i`` of a step seeded ``step_seed`` (DeComFL: ``seed * (i + 17) + i``)."""
    return int(step_seed) * (i + 17) + i


def add_perturbation_(params: Params, names: Sequence[str], seed: int, alpha: float) -> None:
    """θ <- θ + alpha · z in place, z ~ N(0, I) regenerated from ``seed`` over ``names`` in the given order."""
    if alpha == 0.0:
        return
    device = params[names[0]].device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    for k in names:
        p = params[k]
        p.add_(torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype), alpha=alpha)


def projected_gradients(params: Params, names: Sequence[str], loss: Callable[[], float], seeds: Sequence[int],
                        mu: float, central: bool) -> tuple[list[float], float]:
    """(g_i for each perturbation seed, the loss of θ) at the current θ (the module docstring's estimator); θ is
    restored after each perturbation. For the central difference the loss reported is the mean of L(θ ± μz)."""
    base = None if central else loss()
    grads, seen = [], []
    for seed in seeds:
        add_perturbation_(params, names, seed, mu)
        plus = loss()
        if central:
            add_perturbation_(params, names, seed, -2 * mu)
            minus = loss()
            add_perturbation_(params, names, seed, mu)
            grads.append((plus - minus) / (2 * mu))
            seen.append((plus + minus) / 2)
        else:
            add_perturbation_(params, names, seed, -mu)
            grads.append((plus - base) / mu)
    return grads, (sum(seen) / len(seen) if central else base)


def forward_passes(perturbations: int, central: bool) -> int:
    """Forward passes of one step: 2P (central) or P + 1 (forward, one shared L(θ))."""
    return 2 * perturbations if central else perturbations + 1


def replay_(params: Params, names: Sequence[str], step_seeds: Sequence[int], grads: "torch.Tensor",
            lr: float) -> None:
    """Apply zeroth-order steps in place: for step t and perturbation i, θ <- θ - lr · (g[t, i] / P) z_{t,i}
    (``grads``: [steps, P] float32, the scalars as sent; a zero scalar is skipped, it moves nothing)."""
    perturbations = grads.shape[1]
    for t, s in enumerate(step_seeds):
        for i in range(perturbations):
            g = float(grads[t, i])
            if g != 0.0:
                add_perturbation_(params, names, generator_seed(s, i), -lr * g / perturbations)
