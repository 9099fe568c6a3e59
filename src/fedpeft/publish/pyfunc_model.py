"""The MLflow model of ``fedpeft export --to mlflow``, as MLflow's models-from-code file
(https://mlflow.org/docs/latest/ml/model/models-from-code/): MLflow copies this file into the logged model and runs
it when the model is loaded, so no Python object is pickled. It is never imported by fedpeft itself
(``set_model`` at the end is what MLflow reads); ``publish.mlflow_model`` logs it and holds what it calls.

``load_context`` opens the adapter with ``predict.open_model`` from the run files logged with it (the ``run``
artifact; ``client`` and ``best`` from the model's ``model_config``), and ``predict`` answers with
``publish.mlflow_model.predict_frame``: fedpeft's own ``predict`` and ``generate`` code. The ``pd.DataFrame`` type
hints are the ones MLflow's type-hint check accepts without inferring a second signature (the logged one holds).
"""

from __future__ import annotations

from typing import Any

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class FedpeftAdapter(PythonModel):
    """A fedpeft run's adapter: classes and probabilities, or completions, as ``fedpeft predict``/``generate``."""

    def load_context(self, context: Any) -> None:
        from fedpeft.predict import open_model

        config = context.model_config or {}
        self.model = open_model(context.artifacts["run"], config.get("client"), bool(config.get("best")))

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from fedpeft.publish.mlflow_model import predict_frame

        return predict_frame(self.model, model_input)


mlflow.models.set_model(FedpeftAdapter())
