"""TensorBoard: event files in ``<run>/tensorboard``, one scalar series per metric with the round as the step
(``tensorboard --logdir runs/``). Written with ``torch.utils.tensorboard``; the config and summary go in as text."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.tracking.sinks.base import SINKS, SinkBase


class TensorBoardSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    log_dir: str = Field("tensorboard", description="the event files' folder, relative to the run directory (or "
                                                    "absolute)")


@SINKS.register("tensorboard", "TensorBoard event files in the run directory", TensorBoardSettings)
class TensorBoardSink(SinkBase):
    module = "tensorboard"

    def __init__(self, settings: TensorBoardSettings, root: Path, name: str, run_id: str | None) -> None:
        super().__init__(settings, root, name, run_id)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(root / settings.log_dir))
        self.run_id = self.run_id or name

    def log_params(self, params: dict[str, str]) -> None:
        text = "\n".join(f"    {k}: {v}" for k, v in params.items())  # indented: Markdown code block
        self.writer.add_text("config", text, 0)

    def log_round(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def finish(self, step: int, summary: dict[str, float], files: list[Path]) -> None:
        for key, value in summary.items():
            self.writer.add_scalar(f"summary/{key}", value, step)
        self.writer.add_text("summary", "    " + json.dumps(summary, indent=1).replace("\n", "\n    "), step)

    def close(self) -> None:
        self.writer.close()
