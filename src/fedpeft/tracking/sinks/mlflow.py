"""MLflow: one MLflow run per fedpeft run, in a local store in the run directory by default (``mlflow.db``, SQLite,
artifacts in ``mlartifacts/``: MLflow 3 refuses its older ``./mlruns`` file store unless told to) or at any
tracking URI (``mlflow ui --backend-store-uri sqlite:///<run>/mlflow.db`` shows the default one). The resolved
config as parameters, every round's scalars as metrics with the round as the step, ``summary.json``'s scalars as
``summary/...`` metrics, and ``summary.json`` and ``report.html`` as artifacts. ``fedpeft export --to mlflow`` logs
the run's adapter as a model into the same store and MLflow run (``publish.mlflow_model``).

Written through ``MlflowClient`` with an explicit run id (no active-run global), so a resumed run appends to the same
MLflow run."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.tracking.sinks.base import SINKS, SinkBase

BATCH = 1000  # MLflow's log_batch limit on metrics per call (and 100 parameters)


def safe_key(name: str) -> str:
    """MLflow accepts letters, digits, ``_-./`` and spaces in keys; anything else becomes ``_``."""
    return re.sub(r"[^\w\-./ ]", "_", name)


def local_store(root: Path) -> str:
    """The default tracking URI: a SQLite database in the run directory."""
    return f"sqlite:///{(root / 'mlflow.db').absolute()}"


def experiment_id(client: Any, name: str, root: Path, tracking_uri: str | None) -> str:
    """The id of the MLflow experiment ``name`` (created if missing: on the default local store of ``root`` with
    its artifacts in ``<run>/mlartifacts``, elsewhere where the tracking server puts them). The sink and
    ``fedpeft export --to mlflow`` (``publish.mlflow_model``) both open it here."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    artifacts = None if tracking_uri else (root / "mlartifacts").absolute().as_uri()
    return client.create_experiment(name, artifacts)


class MlflowSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tracking_uri: str | None = Field(None, description="where runs are recorded (an MLflow server's URL, a "
                                                       "database URI); default: sqlite:///<run>/mlflow.db, "
                                                       "artifacts in <run>/mlartifacts")
    experiment: str = Field("fedpeft", description="the MLflow experiment the run is recorded under (created if "
                                                   "missing)")


@SINKS.register("mlflow", "MLflow run: config as params, rounds as metrics, summary and report as artifacts",
                MlflowSettings)
class MlflowSink(SinkBase):
    module = "mlflow"

    def __init__(self, settings: MlflowSettings, root: Path, name: str, run_id: str | None) -> None:
        super().__init__(settings, root, name, run_id)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=settings.tracking_uri or local_store(root))
        if self.run_id is None:
            experiment = experiment_id(self.client, settings.experiment, root, settings.tracking_uri)
            self.run_id = self.client.create_run(experiment, run_name=name).info.run_id

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(safe_key(k), v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def _metrics(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(safe_key(k), v, now, step) for k, v in scalars.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + BATCH])

    def log_round(self, step: int, scalars: dict[str, float]) -> None:
        self._metrics(step, scalars)

    def finish(self, step: int, summary: dict[str, float], files: list[Path]) -> None:
        self._metrics(step, {f"summary/{k}": v for k, v in summary.items()})
        for path in files:
            self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id)
