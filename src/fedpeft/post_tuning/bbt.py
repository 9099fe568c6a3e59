"""Post-tuning by Black-Box Tuning (Alg. 5, Eq. 12): CMA-ES over z in R^d with the client's tensors = global + A z,
forward passes only, on k shots per class of the client's own data; small step size sigma = 0.1 so that the
global knowledge is kept. A prompt [T, D] gets a fixed random A in R^{TD x d} drawn like BBT's (std
sigma_emb / sqrt(d)); a projected prompt's z is searched directly in its own subspace (BBT(Fed) + post-tuning).
The z kept is the best on an equally sized dev set (the initial z = 0 included), or the last mean.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.projected_prompt import build_projection, projection_std
from fedpeft.model.blackbox import BlackBox
from fedpeft.backbones.encoding import Encoded
from fedpeft.comm.update import Params
from fedpeft.lazy import lazy
from fedpeft.post_tuning.base import POST_TUNING, PostTuningBase, few_shot_split
from fedpeft.trainers.cmaes import CMAState, cma_constants, parent_weights, sample, tell

torch = lazy("torch")


class BBTSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shots: int = Field(16, ge=1, description="examples per class to tune on (paper: 16)")
    intrinsic_dim: int = Field(500, ge=1, description="d of the random subspace (BBT: 500)")
    popsize: int = Field(20, ge=2, description="CMA-ES population = model queries per iteration (paper: 20)")
    iterations: int = Field(20, ge=1, description="CMA-ES iterations (BBT's 8,000-query budget is 400; "
                                                  "scaled down for CPUs)")
    sigma: float = Field(0.1, gt=0, description="CMA-ES step size (paper: 0.1 in post-tuning, 1 for BBT)")
    select: Literal["dev", "last"] = Field("dev", description="keep the z best on a dev set of the same size, "
                                                              "or the last mean")
    max_rows: int = Field(256, ge=1, description="rows per forward pass (candidates x examples)")


@POST_TUNING.register("bbt", "BBT post-tuning: CMA-ES in a random subspace around the global tensors on k shots "
                      "per class, forward passes only", BBTSettings)
class BBTPostTuning(PostTuningBase):
    active = True
    adapters = frozenset({"token_prompt", "soft_prompt", "projected_prompt"})

    def tune(self, params: Params, data: Encoded, rng: np.random.Generator) -> tuple[Params, dict[str, float]]:
        s = self.settings
        key = "z" if "z" in params else "prompt"
        base = params[key].float()
        train, dev = few_shot_split(data, s.shots, s.select == "dev", rng)
        box = BlackBox(self.ctx.objective, max_rows=s.max_rows, param_name=key, param_dims=base.dim())
        d = base.numel() if key == "z" else s.intrinsic_dim
        proj = None
        if key != "z":
            std = projection_std(float(box.embedding_table().std()), d, 1.0)
            proj = build_projection(base.numel(), d, std, int(rng.integers(2**62)))

        def candidates(z: np.ndarray) -> torch.Tensor:
            y = torch.from_numpy(np.atleast_2d(z)).float()
            step = y if proj is None else y @ proj.T
            return base.unsqueeze(0) + step.view(-1, *base.shape)

        state = CMAState(np.zeros(d), s.sigma, np.eye(d))
        consts = cma_constants(d, parent_weights(s.popsize, kind="log"))
        best_z, best_acc = np.zeros(d), (box.accuracy(base, dev)[0] if dev is not None else None)
        for _ in range(s.iterations):
            x = sample(state, s.popsize, rng)
            state = tell(state, consts, x, box.losses(candidates(x), train).double().numpy())
            if dev is not None:
                acc = box.accuracy(candidates(state.mean)[0], dev)[0]
                if acc > best_acc:
                    best_z, best_acc = state.mean.copy(), acc
        z = best_z if dev is not None else state.mean
        return params | {key: candidates(z)[0]}, {"post_queries": box.usage.candidates, "post_shots": len(train)}
