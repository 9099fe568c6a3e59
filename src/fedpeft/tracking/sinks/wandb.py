"""Weights & Biases: offline by default (the run is written under ``<run>/wandb`` and can be uploaded later with
``wandb sync``), online when ``mode: online`` and the user is logged in. The config as the run's config, every
round's scalars with the round as the step, ``summary.json``'s scalars in the run summary, ``report.html`` and
``summary.json`` saved with the run."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.tracking.sinks.base import SINKS, SinkBase


class WandbSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["offline", "online"] = Field("offline", description="offline: write locally, upload later with "
                                                                      "`wandb sync`; online: stream to the server")
    project: str = Field("fedpeft", description="the W&B project")
    entity: str | None = Field(None, description="the W&B team or user (default: the logged-in user's)")


@SINKS.register("wandb", "Weights & Biases run (offline by default)", WandbSettings)
class WandbSink(SinkBase):
    module = "wandb"

    def __init__(self, settings: WandbSettings, root: Path, name: str, run_id: str | None) -> None:
        super().__init__(settings, root, name, run_id)
        import wandb

        self.run = wandb.init(dir=str(root), mode=settings.mode, project=settings.project, entity=settings.entity,
                              name=name, id=run_id, resume="allow" if run_id else None, reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off"))
        self.run_id = self.run.id

    def log_params(self, params: dict[str, str]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_round(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def finish(self, step: int, summary: dict[str, float], files: list[Path]) -> None:
        self.run.summary.update({f"summary/{k}": v for k, v in summary.items()})
        for path in files:
            self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self) -> None:
        self.run.finish()
