"""``fedpeft export RUN_DIR --to mlflow``: the run's adapter logged to MLflow as a model, with its card and final
metrics, and registered as a model version.

The flavour is ``mlflow.pyfunc`` with a small ``PythonModel`` (``publish.pyfunc_model``, logged as a
models-from-code file), not ``mlflow.transformers``, because:

- fedpeft's readouts are no transformers pipeline: a classifier scores the similarity to label descriptions, a
  verbalizer's label words or a linear head beside the adapter, through the run's templates and calibration, and a
  soft or deep prompt sits where fedpeft places it. A pipeline of the PEFT model would score another way.
- ``mlflow.transformers`` stores the base model's weights in the MLflow model (gigabytes for a LoRA of a few
  megabytes), or with ``save_pretrained=False`` a Hub id and commit, which needs the Hub; offline, a local folder or
  a model built in code (the tiny test models) has no such reference.
- the pyfunc's ``predict`` is fedpeft's own (``predict_frame``): ``TrainedModel.probabilities``, what
  ``fedpeft predict`` prints, and ``TrainedModel.generate``, what ``fedpeft generate`` writes. So the registered
  version answers what the command line answers, bit for bit on the same inputs, not PEFT's modules' numbers up to
  float rounding.

The model's artifacts: ``hub/``, the ``--format hub`` folder (PEFT adapter, card, training curve, config.yaml), and
``run/``, what ``predict.open_model`` reads of the run directory: ``config.yaml``, ``model.json`` and the checkpoint
exported (``checkpoint/``, or ``checkpoint-best/`` with ``--best``). The frozen base model is not copied: loading
the MLflow model loads it as the run did (``model.name``: a registered fedpeft model, a Hub id or the same local
folder) and checks it against the fingerprint ``model.json`` recorded.

Its signature: a classification run takes a DataFrame with a ``text`` column (and ``text_pair`` for a pair task)
and returns ``prediction`` and one ``p(<class>)`` per class; a generation run takes ``instruction`` (and an optional
``input``) and returns ``generation``.

Where it goes: ``--tracking-uri``; else the run's ``mlflow`` tracking sink's ``tracking_uri``; else the store that
sink uses by default, ``sqlite:///<run>/mlflow.db`` with artifacts in ``<run>/mlartifacts``
(``tracking.sinks.mlflow.local_store``): MLflow 3's model registry needs a database-backed store, and MLflow 3
refuses the older ``./mlruns`` file store unless told to. The experiment is the sink's (default ``fedpeft``). A run
whose sink recorded its MLflow run (``tracking.json``) gets the model logged into that same MLflow run, beside its
rounds; any other gets a new MLflow run named after the run. ``summary.json``'s numbers
(``tracking.sinks.summary_scalars``) are logged as metrics of the logged model. The version is registered under
``--registered-name``, by default the run's name (``name:``, else its folder's name).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeft.predict import TrainedModel
from fedpeft.publish.hub import export_hub
from fedpeft.tracking.rundir import RECORD, RunDir
from fedpeft.tracking.sinks import SINKS, summary_scalars
from fedpeft.tracking.sinks.mlflow import MlflowSettings, experiment_id, local_store, safe_key

MODEL_CODE = Path(__file__).with_name("pyfunc_model.py")
# what the logged model needs installed to load (MLflow's own requirement inference would load the model)
REQUIREMENTS = ("fedpeft", "torch", "transformers", "peft", "safetensors", "pandas", "mlflow-skinny")


@dataclass
class MlflowExport:
    """Where the model went: the tracking URI, the MLflow run, the model's URI and the registered version."""

    tracking_uri: str
    run_id: str
    model_uri: str
    name: str
    version: str
    note: str
    warnings: list[str] = field(default_factory=list)


def predict_frame(model: TrainedModel, frame: Any) -> Any:
    """The pyfunc's answer to a DataFrame (see the module doc for the columns)."""
    import pandas as pd

    from fedpeft.data.types import Example

    frame = pd.DataFrame(frame)
    if model.objective.generates:
        inputs = frame["input"].tolist() if "input" in frame.columns else [None] * len(frame)
        examples = [Example(str(i), 0, None if x is None or x != x or not str(x) else str(x))
                    for i, x in zip(frame["instruction"].tolist(), inputs)]
        return pd.DataFrame({"generation": model.generate(examples)})
    pair = model.objective.task.is_pair
    texts = [str(t) for t in frame["text"].tolist()]
    pairs = [str(t) for t in frame["text_pair"].tolist()] if pair else [None] * len(texts)
    probs = model.probabilities([Example(t, 0, p) for t, p in zip(texts, pairs)])
    names = model.class_names
    return pd.DataFrame({"prediction": [names[k] for k in probs.argmax(-1).tolist()]}
                        | {f"p({c})": [row[k] for row in probs.tolist()] for k, c in enumerate(names)})


def signature(model: TrainedModel) -> Any:
    """The model's input and output columns (``predict_frame``)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    if model.objective.generates:
        return ModelSignature(inputs=Schema([ColSpec("string", "instruction"),
                                             ColSpec("string", "input", required=False)]),
                              outputs=Schema([ColSpec("string", "generation")]))
    inputs = [ColSpec("string", "text")] + ([ColSpec("string", "text_pair")] if model.objective.task.is_pair else [])
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(
        [ColSpec("string", "prediction"), *(ColSpec("double", f"p({c})") for c in model.class_names)]))


def requirements() -> list[str]:
    """``REQUIREMENTS`` at the versions installed here."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in REQUIREMENTS:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(name)
    return out


def tracking_target(cfg: Any, root: Path, tracking_uri: str | None) -> tuple[str, str, bool]:
    """(tracking URI, experiment, whether that is the run's own mlflow sink's store) for ``cfg``'s run in ``root``
    (see the module doc)."""
    sink = next((t for t in cfg.tracking if t.name == "mlflow"), None)
    settings = SINKS.settings_of(sink) if sink is not None else MlflowSettings()
    own = settings.tracking_uri or local_store(root)
    uri = tracking_uri or own
    return uri, settings.experiment, sink is not None and uri == own


def sink_run(client: Any, root: Path) -> str | None:
    """The MLflow run the run's sink wrote (``tracking.json``), where the store still has it."""
    from mlflow.exceptions import MlflowException

    state = root / "tracking.json"
    run_id = (json.loads(state.read_text()).get("mlflow") or {}).get("id") if state.exists() else None
    if run_id is None:
        return None
    try:
        client.get_run(run_id)
    except MlflowException:
        return None
    return run_id


def copy_run(run: RunDir, best: bool, dest: Path) -> Path:
    """What ``open_model`` reads of ``run`` (config.yaml, model.json, the checkpoint exported) copied into ``dest``."""
    dest.mkdir(parents=True)
    for name in ("config.yaml", RECORD):
        if (run.root / name).exists():
            shutil.copyfile(run.root / name, dest / name)
    ckpt = run.best_ckpt if best else run.ckpt
    shutil.copytree(ckpt, dest / ckpt.name)
    return dest


def require_mlflow() -> None:
    if importlib.util.find_spec("mlflow") is None:
        raise ImportError("--to mlflow needs the 'mlflow' package, which is not installed: pip install "
                          "'fedpeft[tracking]'")


def export_mlflow(run_dir: str | Path, out: str | Path | None = None, best: bool = False,
                  client: int | str | None = None, registered_name: str | None = None,
                  tracking_uri: str | None = None, base_model: str | None = None,
                  license: str | None = None) -> MlflowExport:
    """Log ``run_dir``'s adapter to MLflow as a pyfunc model and register a version of ``registered_name``; the
    hub folder is written to ``out`` too where given (else only into the model). MLflow's own errors (a tracking
    server that does not answer, a refused name) come back as one ValueError naming the tracking URI."""
    require_mlflow()
    import mlflow
    from mlflow.exceptions import MlflowException

    run = RunDir(run_dir)
    with tempfile.TemporaryDirectory(prefix="fedpeft-mlflow-") as tmp:
        hub = export_hub(run_dir, Path(out) if out is not None else Path(tmp) / "hub", best, client, base_model,
                         license)
        files = copy_run(run, best, Path(tmp) / "run")
        uri, experiment, own = tracking_target(hub.model.cfg, run.root, tracking_uri)
        previous = mlflow.get_tracking_uri() if mlflow.tracking.is_tracking_uri_set() else None
        mlflow.set_tracking_uri(uri)  # the fluent API logs models; put back as it was below
        try:
            run_id, info, name = _log(hub, files, run, registered_name, uri, experiment, own, client, best)
        except MlflowException as e:
            reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise ValueError(f"--to mlflow: {uri}: {reason}") from None
        finally:
            mlflow.set_tracking_uri(previous)
    return MlflowExport(uri, run_id, info.model_uri, name, str(info.registered_model_version), hub.note,
                        hub.warnings)


def _log(hub: Any, files: Path, run: RunDir, registered_name: str | None, uri: str, experiment: str, own: bool,
         client: int | str | None, best: bool) -> tuple[str, Any, str]:
    """Log and register the model at ``uri`` (MLflow's tracking URI now), in the sink's MLflow run or a new one;
    (MLflow run id, ``ModelInfo``, registered name)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    model = hub.model
    run_name = model.cfg.name or run.root.name
    tracking = MlflowClient(uri)
    run_id = sink_run(tracking, run.root) if own else None
    start = ({"run_id": run_id} if run_id else
             {"experiment_id": experiment_id(tracking, experiment, run.root,
                                             None if uri == local_store(run.root) else uri), "run_name": run_name})
    summary = json.loads((run.root / "summary.json").read_text())
    name = registered_name or run_name
    with mlflow.start_run(**start) as active, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*input example was not provided")  # the signature is given
        info = mlflow.pyfunc.log_model(
            name="model", python_model=str(MODEL_CODE), artifacts={"hub": str(hub.path), "run": str(files)},
            model_config={"client": client, "best": best}, signature=signature(model),
            pip_requirements=requirements(), registered_model_name=name)
        mlflow.log_metrics({safe_key(k): v for k, v in summary_scalars(summary).items()}, model_id=info.model_id)
        return active.info.run_id, info, name
