"""``fedpeft export RUN_DIR OUT --format hub``: a folder ready for the Hugging Face Hub, and ``--push REPO_ID``.

The folder holds the PEFT adapter exactly as ``--format peft`` writes it (``export.write_peft``:
``adapter_config.json``, ``adapter_model.safetensors``, ``fedpeft_task.json``, and ``task_head.safetensors`` for a
linear readout), the model card ``README.md`` (``publish.card``), ``training_curve.png`` (``publish.curve``) and the
run's resolved ``config.yaml``, copied. Nothing is written before the run directory is known to have what the card
needs (a checkpoint, ``summary.json``), so a refused export leaves nothing half-written.

``--push`` uploads the folder with huggingface_hub's ``HfApi.create_repo`` (a model repository, ``exist_ok``) and
``HfApi.upload_folder`` (https://huggingface.co/docs/huggingface_hub/guides/upload). Before either, it checks the two
things a push needs, so that each missing one is one line naming it, and the folder stays written: a token
(``huggingface_hub.get_token``: ``HF_TOKEN``, or the login ``hf auth login`` stored) and the network
(``backbones.loading.hub_reachable``: one TCP connection to the Hub's endpoint, as model loading checks it).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fedpeft.export import write_peft
from fedpeft.predict import TrainedModel, open_model
from fedpeft.publish.card import base_license, base_model_id, read_summary, write_card
from fedpeft.publish.curve import CURVE_FILE, require_matplotlib, write_curve
from fedpeft.tracking.rundir import RunDir


class PushError(RuntimeError):
    """A push that could not happen, in one line naming what is missing and where the folder is."""


@dataclass
class HubExport:
    """The folder written, which adapter it holds (``note``; ``model``: the adapter opened), and what the card could
    not say (``warnings``)."""

    path: Path
    note: str
    model: TrainedModel
    warnings: list[str] = field(default_factory=list)


def check_repo_id(repo_id: str) -> None:
    """ValueError naming ``--push`` for a repository id the Hub would refuse (checked before anything is written)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise ValueError(f"--push: '{repo_id}' is not a Hugging Face Hub repository id, e.g. user/my-adapter "
                         f"({e})") from None


def export_hub(run_dir: str | Path, out: str | Path, best: bool = False, client: int | str | None = None,
               base_model: str | None = None, license: str | None = None,
               repo_id: str | None = None) -> HubExport:
    """Write the hub folder of ``run_dir``'s adapter (the global one after its last round, ``best``'s, or client
    ``client``'s) into ``out``. ``base_model`` and ``license`` fill the card's fields where the run cannot
    (``publish.card``); ``repo_id`` is where the card's snippet loads the adapter from (default: ``out``)."""
    require_matplotlib()
    model = open_model(run_dir, client=client, best=best)
    run = RunDir(run_dir)
    summary = read_summary(run)
    hub_id = base_model_id(model, base_model)
    out = Path(out)
    write_peft(model, out)
    base = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    shutil.copyfile(run.root / "config.yaml", out / "config.yaml")
    name = model.cfg.name or run.root.name
    write_curve(run.read_metrics(), out / CURVE_FILE, model.objective.generates,
                f"{name}: {summary.get('method', model.cfg.method.name)} on {summary.get('task', model.cfg.task.name)}")
    license = license or base_license(model.objective.backbone.source, hub_id)
    warnings = []
    if hub_id is None:
        warnings.append(f"the card names no base_model: model.name '{model.cfg.model.name}' is no Hugging Face Hub id "
                        "(a local folder, or a model built in fedpeft); give --base-model ID, the Hub id of the same "
                        "weights, for the Hub to link the adapter to its base model")
    if license is None:
        warnings.append("the card names no license: the base model's card is not here to read one from; give "
                        "--license (e.g. the base model's, apache-2.0)")
    write_card(model, out, hub_id, license, repo_id or str(out), base)
    return HubExport(out, f"exported {model.describe()}", model, warnings)


def push(folder: str | Path, repo_id: str) -> str:
    """Upload ``folder`` to the model repository ``repo_id`` (created if missing); returns the commit's URL.
    PushError, in one line, when there is no token, the Hub is unreachable, or the Hub refuses."""
    from huggingface_hub import HfApi, constants, get_token

    from fedpeft.backbones.loading import hub_reachable

    folder = Path(folder)
    token = get_token()
    if token is None:
        raise PushError(f"--push {repo_id}: no Hugging Face token: set HF_TOKEN or run `hf auth login`, then push "
                        f"again; the folder is at {folder}")
    if not hub_reachable():
        raise PushError(f"--push {repo_id}: the Hugging Face Hub ({constants.ENDPOINT}) is unreachable from here; "
                        f"the folder is at {folder}: upload it from a machine with a network "
                        f"(`hf upload {repo_id} {folder}`)")
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=folder,
                                 commit_message="fedpeft export --format hub")
    except Exception as e:  # noqa: BLE001 - whatever the Hub or the connection says, in one line; the folder stays
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise PushError(f"--push {repo_id}: the upload failed ({type(e).__name__}: {reason}); the folder is at "
                        f"{folder}") from None
    return str(getattr(info, "commit_url", info))
