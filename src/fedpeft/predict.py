"""Use a run's trained adapter afterwards: class labels and probabilities for new texts (``fedpeft predict``).

The model is built exactly as the run built it (``RUN_DIR/config.yaml`` through ``fedpeft.build.build``: task,
backbone, adapter, readout and calibration), the tensors come from the run's last checkpoint, and the texts
are encoded with the run's template (``Classifier.encode``) and scored with ``Classifier.logits``; the
probabilities are the softmax over the class logits (for calibrated readouts: over the calibrated logits).

- without a client: the final global adapter (``ServerState.glob``, what ``evaluate_global`` scores; under a
  download codec these are exactly the tensors the clients rebuild);
- with ``client=K``: client K's personalised adapter where the method keeps one, i.e. what its local evaluation
  scores: the shared global tensors merged with the private tensors the client state holds under ``u/`` by
  the sharing policy (FedPepTAO: its own copy of the non-selected layers; a client that never trained starts
  from the seeded initial prompts, as on the device). Post-tuning is not stored in any state and is not
  applied. A run whose checkpoint holds no private tensors (sharing ``all``, or a Flower deployment whose
  client states stay on the SuperNodes) is refused: every client would predict with the global adapter.

Input files (``read_texts``): ``.csv`` (a header row with a ``text`` column), ``.jsonl`` (one object per line
with a ``text`` key), anything else one text per line (blank lines skipped). Sentence-pair tasks take both
sentences in one text separated by a tab. Output files (``write_predictions``): ``.csv`` or ``.jsonl`` with
the columns ``text``, ``label`` (the class name) and one probability column per class name.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fedpeft.backbones.classifier import Classifier
from fedpeft.clients import sub_state
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params
from fedpeft.config import ExperimentConfig
from fedpeft.data.types import Example
from fedpeft.methods.composed import PRIVATE, ComposedMethod, ServerState
from fedpeft.resolve import load_config
from fedpeft.tracking.rundir import RunDir

Checkpoint = tuple[int, Message, dict[int, Message], dict[str, Any]]
OUTPUT_SUFFIXES = (".csv", ".jsonl")


def load_run(run_dir: str | Path) -> tuple[ExperimentConfig, Checkpoint]:
    """The resolved config and the last checkpoint (round, server state, client states, meta) of ``run_dir``."""
    config = Path(run_dir) / "config.yaml"
    if not config.exists():
        raise FileNotFoundError(f"{config}: not a fedpeft run directory")
    ckpt = RunDir(run_dir).load_checkpoint()
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir}/checkpoint: the run has no checkpoint yet")
    return load_config(config), ckpt


def adapter_params(method: ComposedMethod, server: Message, client_states: dict[int, Message],
                   client: int | None = None) -> Params:
    """The tensors to score with: the global adapter, or client ``client``'s personalised one (see module doc)."""
    st = ServerState.from_message(server)
    init = method.initial_params()  # the adapter's (and linear head's) tensor names; glob holds exactly these
    if client is None:
        return {k: v for k, v in st.glob.items() if k in init}
    n = method.cfg.federation.num_clients
    if not 0 <= client < n:
        raise ValueError(f"--client: {client} is not a client of this run (ids 0..{n - 1})")
    if not any(sub_state(m, PRIVATE) for m in client_states.values()):
        raise ValueError(f"--client: the checkpoint holds no client's private tensors (method.sharing "
                         f"'{method.cfg.method.sharing.name}' keeps none, or a Flower deployment kept the client "
                         "states on the SuperNodes); every client predicts with the global adapter: drop --client")
    trainer = method.trainer
    received = trainer.params_of(trainer.eval_downlink(method._shared(st, st.round + 1)))
    private = sub_state(client_states.get(client, Message()), PRIVATE)
    return method.sharing.client_params(received, private)


def example_of(text: str, clf: Classifier) -> Example:
    """An unlabelled input (label 0 is a placeholder); a pair task's two sentences are separated by a tab."""
    if clf.task.is_pair:
        a, sep, b = text.partition("\t")
        if not sep:
            raise ValueError(f"task '{clf.task.name}' classifies sentence pairs: separate the two sentences "
                             f"with a tab (got {text[:60]!r})")
        return Example(a, 0, b)
    return Example(text, 0)


@torch.no_grad()
def class_probabilities(clf: Classifier, params: Params, texts: Sequence[str], batch_size: int = 64) -> torch.Tensor:
    """Softmax over the class logits, [len(texts), num_classes] (float32, CPU)."""
    params = {k: v.float() if v.is_floating_point() else v for k, v in params.items()}
    enc = clf.encode([example_of(t, clf) for t in texts])
    out = []
    for start in range(0, len(enc), batch_size):
        batch = clf.batch(enc, list(range(start, min(start + batch_size, len(enc)))))
        out.append(torch.softmax(clf.logits(params, batch).float(), dim=-1).cpu())
    return torch.cat(out) if out else torch.empty(0, clf.task.num_classes)


def prob_columns(class_names: Sequence[str]) -> list[str]:
    """One probability column per class name (``p:<name>`` where a name would clash with text/label)."""
    return [f"p:{c}" if c in ("text", "label") else c for c in class_names]


def predict(run_dir: str | Path, texts: Sequence[str], client: int | None = None) -> list[dict[str, Any]]:
    """Label and class probabilities of each text with the run's final global adapter (or client ``client``'s
    personalised one): ``[{"text": ..., "label": class name, <class name>: probability, ...}, ...]``."""
    from fedpeft.build import build

    texts = list(texts)
    if not texts:
        raise ValueError("no texts to classify (--text or --file)")
    cfg, (_, server, client_states, _) = load_run(run_dir)
    built = build(cfg)
    params = adapter_params(built.method, server, client_states, client)
    clf = built.exp.classifier
    probs = class_probabilities(clf, params, texts, cfg.evaluation.batch_size)
    names, columns = clf.task.class_names, prob_columns(clf.task.class_names)
    rows = []
    for text, p in zip(texts, probs.tolist()):
        best = max(range(len(p)), key=p.__getitem__)
        rows.append({"text": text, "label": names[best], **dict(zip(columns, p))})
    return rows


def read_texts(path: str | Path) -> list[str]:
    """Texts of ``path``: ``.csv`` / ``.jsonl`` with a ``text`` column, otherwise one text per line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--file: {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if "text" not in (reader.fieldnames or []):
                raise ValueError(f"{path}: a CSV needs a 'text' column (columns: {reader.fieldnames})")
            return [row["text"] for row in reader]
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if suffix == ".jsonl":
        out = []
        for i, line in enumerate(lines, 1):
            row = json.loads(line)
            if not isinstance(row, dict) or "text" not in row:
                raise ValueError(f"{path}:{i}: a JSONL line needs a 'text' key")
            out.append(str(row["text"]))
        return out
    return lines


def write_predictions(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """``rows`` as ``.csv`` (header text, label, one column per class) or ``.jsonl`` (one object per text)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise ValueError(f"--out: '{path.name}' must end in .csv or .jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["text", "label"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path
