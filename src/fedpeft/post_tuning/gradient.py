"""Post-tuning by gradient descent (the gradient baselines of the personalized gradient-free paper: Prompt Tuning
(Fed) fine-tuned on each testing client): a few Adam steps on k shots per class of the client's own data; the
result is kept only if it is at least as good on an equally sized dev set (when ``select`` is dev). With
``shots: null`` the client fine-tunes on its whole training shard and keeps the result (FedAvg + FT, the
fine-tuned-global-model baseline of personalised FL)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedpeft.model.classifier import evaluate
from fedpeft.backbones.encoding import Encoded
from fedpeft.comm.update import Params
from fedpeft.post_tuning.base import POST_TUNING, PostTuningBase, few_shot_split
from fedpeft.rng import torch_rng
from fedpeft.trainers.gradient import GradientSettings, train_local


class GradientPostTuningSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shots: int | None = Field(16, ge=1, description="examples per class to tune on (paper: 16); null: the "
                                                    "client's whole training shard (needs select: last)")
    lr: float = Field(1e-2, gt=0, description="Adam learning rate (paper's Prompt Tuning: 1e-2)")
    batch_size: int = Field(16, ge=1, description="paper: 16")
    steps: int = Field(20, ge=1, description="optimizer steps")
    select: Literal["dev", "last"] = Field("dev", description="keep the tuned tensors only if not worse on dev")

    @model_validator(mode="after")
    def _dev_needs_shots(self) -> GradientPostTuningSettings:
        if self.shots is None and self.select == "dev":
            raise ValueError("post_tuning.shots: null tunes on every local example and leaves none for a dev set; "
                             "set select: last")
        return self


@POST_TUNING.register("gradient", "gradient post-tuning: Adam steps on k shots per class (back-propagation)",
                      GradientPostTuningSettings)
class GradientPostTuning(PostTuningBase):
    active = True

    def tune(self, params: Params, data: Encoded, rng: np.random.Generator) -> tuple[Params, dict[str, float]]:
        s = self.settings
        clf = self.ctx.objective
        train, dev = (data, None) if s.shots is None else few_shot_split(data, s.shots, s.select == "dev", rng)
        cfg = GradientSettings(lr=s.lr, batch_size=s.batch_size, local_epochs=1e6, max_steps=s.steps)
        seed = int(rng.integers(2**62))
        tuned = train_local(clf, params, train, "adam", cfg, torch_rng(seed, 0, 0, "post-tuning")).params
        tuned = {k: tuned.get(k, v) for k, v in params.items()}
        report = {"post_steps": s.steps, "post_shots": len(train)}
        if dev is not None and evaluate(clf, tuned, dev, self.ctx.eval_batch)["accuracy"] < \
                evaluate(clf, params, dev, self.ctx.eval_batch)["accuracy"]:
            return params, report
        return tuned, report
