"""Use a run's trained adapter afterwards: labels and class probabilities for new texts (``fedpeft predict``),
completions of new instructions (``fedpeft generate``) and the metrics of a labelled file (``fedpeft evaluate``).

A run directory is self-contained: ``open_model`` builds the classifier from the run's ``config.yaml`` and
``model.json`` (class names, label words, descriptions, templates, readout, the backbone's identity) and never
reads the data the run trained on, so it works from any folder and whatever became of the training files. The
backbone loaded now must be the one the run trained (``Backbone.fingerprint``), or it refuses. The tensors come
from the run's last checkpoint (or ``checkpoint-best/`` with ``evaluation.keep_best``); ``TrainedModel.describe``
says which round's they are, so an unfinished run is never mistaken for a finished one.

- without a client: the global adapter (``ServerState.glob``, what ``evaluate_global`` scores; under a download
  codec these are exactly the tensors the clients rebuild);
- with a client (its id, or its name with natural clients): its personalised adapter where the method keeps one,
  i.e. what its local evaluation scores: the shared global tensors merged with the private tensors the client
  state holds under ``u/`` (FedPepTAO: its own copy of the non-selected layers; a client that never trained starts
  from the seeded initial prompts, as on the device), or what the server sends that client alone (LoRA truncated to
  its tier's rank, sharing ``ranks``). Post-tuning is not stored in any state and is not applied.
  A run whose checkpoint holds no private tensors (sharing ``all``, or a Flower deployment whose client states
  stay on the SuperNodes) is refused: every client would use the global adapter.

A global adapter that was never trained is refused: where the sharing policy keeps on the clients every tensor
they train (``local``, the ``local-only`` preset; ``fixed_split`` with every layer private), the server's copy is
still the initialisation, whatever the round; the error asks for ``--client K``. Where it keeps only some of them
(FedSA-LoRA's B and task head, ``fixed_split``'s private layers), the shared part is trained and the rest is its
initial value: ``TrainedModel.warning`` says so (FedSA-LoRA: with every B = 0 the global adapter computes exactly
the frozen backbone) and ``describe`` repeats it, but the adapter is used. Which tensors are untrained is
``ComposedMethod.untrained_global``.

Texts are encoded with the run's template (``Classifier.encode``) and scored with ``Classifier.logits``; the
probabilities are the softmax over the class logits (for calibrated readouts: over the calibrated logits).
Instructions are formatted as the run trained (``LanguageModel.encode_prompts``) and decoded greedily; a labelled
file of a generation run is scored as the run scores its test set (``generation_eval.file_scores``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedpeft.adapters.deep_prompt import layer_of
from fedpeft.build import build
from fedpeft.clients import sub_state
from fedpeft.comm.codec import Message
from fedpeft.comm.lora_pairs import A, B
from fedpeft.comm.update import Params
from fedpeft.config import ExperimentConfig
from fedpeft.data.types import Example
from fedpeft.experiment import TaskOnly, build_experiment
from fedpeft.generation_eval import file_scores, generations
from fedpeft.methods.composed import ComposedMethod
from fedpeft.methods.state import PRIVATE
from fedpeft.resolve import load_config
from fedpeft.tracking.rundir import RunDir

log = logging.getLogger(__name__)


@dataclass
class TrainedModel:
    """A run's trained adapter, ready to classify or write: the objective as the run built it and the tensors of one
    checkpoint (the global adapter, or one client's personalised adapter)."""

    run_dir: Path
    cfg: ExperimentConfig
    method: ComposedMethod
    params: Params
    round: int                      # the round whose adapter this is
    best: bool                      # from checkpoint-best/ (evaluation.keep_best)
    client: int | None = None
    client_names: list[str] | None = None
    untrained: tuple[str, ...] = ()  # global tensors the sharing keeps on the clients, still their initial values
    num_clients: int = 0

    @property
    def objective(self) -> Any:
        """What the run's forward pass is scored by: a ``Classifier``, ``LanguageModel`` or ``PreferenceModel``."""
        return self.method.clf

    @property
    def classifier(self) -> Any:
        """``objective``, by the name it had when every run trained a classifier (kept for scripts using it)."""
        return self.objective

    @property
    def class_names(self) -> list[str]:
        return list(self.objective.task.class_names)

    @property
    def rounds(self) -> int:
        return self.cfg.federation.rounds

    @property
    def warning(self) -> str | None:
        """Why the global adapter is not what the clients trained, where the sharing kept part of it on them
        (see the module doc); None otherwise."""
        if not self.untrained:
            return None
        total = sum(1 for v in self.params.values() if v.is_floating_point())
        kinds = sorted({_kind(k) for k in self.untrained})
        b_keys = [k for k in self.params if k.endswith(B)]
        frozen = bool(b_keys) and all(k in self.untrained and not self.params[k].any() for k in b_keys)
        effect = (": with every LoRA B = 0 the global adapter adds nothing, so this is the frozen backbone" if frozen
                  else ", so it is not the model any client trained")
        return (f"method.sharing '{self.cfg.method.sharing.name}' keeps {len(self.untrained)} of the global "
                f"adapter's {total} tensors ({', '.join(kinds)}) on the clients; the server's copies were never "
                f"trained and hold their initial values{effect}; give --client K ({_ids(self)}) for client K's "
                "personalised adapter")

    def describe(self, with_warning: bool = True) -> str:
        """Which adapter this is: whose, and after which round (an unfinished run says so); ``with_warning``: and
        the ``warning`` where there is one."""
        who = "the global adapter" if self.client is None else (
            f"client {self.client}" + (f" ({self.client_names[self.client]})" if self.client_names else "")
            + "'s personalised adapter")
        note = f" (warning: {self.warning})" if with_warning and self.warning else ""
        if self.best:
            return (f"{who} of round {self.round} of {self.rounds}: the best round on the validation split "
                    f"(evaluation.keep_best){note}")
        unfinished = "" if self.round >= self.rounds else " (the run is unfinished: --resume it to train the rest)"
        return f"{who} after round {self.round} of {self.rounds}{unfinished}{note}"

    @torch.no_grad()
    def probabilities(self, examples: Sequence[Example], batch_size: int | None = None) -> torch.Tensor:
        """Softmax over the class logits, [len(examples), num_classes] (float32, CPU)."""
        clf, bs = self.objective, batch_size or self.cfg.evaluation.batch_size
        if clf.kind != "classification":
            raise ValueError(f"{self.run_dir}: the run tuned a model to generate (task '{clf.task.name}'); it has no "
                             "classes to predict: use fedpeft generate")
        params = {k: v.float() if v.is_floating_point() else v for k, v in self.params.items()}
        enc = clf.encode(list(examples))
        out = []
        for start in range(0, len(enc), bs):
            batch = clf.batch(enc, list(range(start, min(start + bs, len(enc)))))
            out.append(torch.softmax(clf.logits(params, batch).float(), dim=-1).cpu())
        return torch.cat(out) if out else torch.empty(0, clf.task.num_classes)


    def language_model(self) -> Any:
        """The run's language model; ValueError naming ``predict`` for a classifier's run."""
        lm = self.objective
        if not lm.generates:
            raise ValueError(f"{self.run_dir}: the run trained a classifier (task '{lm.task.name}'); generate needs a "
                             "generation or preference task's run (use predict)")
        return lm

    def generate(self, prompts: Sequence[str | Example], max_new_tokens: int | None = None,
                 batch_size: int | None = None) -> list[str]:
        """Greedy completions of ``prompts`` (instructions, or examples with an input) with this adapter, as the
        run's evaluation writes them (``LanguageModel.generate``)."""
        return self.generate_and_cuts(prompts, max_new_tokens, batch_size)[0]

    def generate_and_cuts(self, prompts: Sequence[str | Example], max_new_tokens: int | None = None,
                          batch_size: int | None = None) -> tuple[list[str], list[bool]]:
        """``generate``'s completions, and whether each prompt lost tokens to ``task.max_length`` (cut as
        ``task.truncation`` says) before the model read it."""
        lm = self.language_model()
        examples = [p if isinstance(p, Example) else Example(p, 0) for p in prompts]
        params = {k: v.float() if v.is_floating_point() else v for k, v in self.params.items()}
        encoded = lm.encode_prompts(examples)
        texts = generations(lm, params, examples, max_new_tokens or self.cfg.evaluation.max_new_tokens,
                            batch_size or self.cfg.evaluation.batch_size, encoded)
        return texts, [bool(c) for c in encoded.prompt_cut]

    def prompt_texts(self, prompts: Sequence[str | Example]) -> list[str]:
        """Each prompt as the model sees it: the run's chat template or ``task.prompt_template`` filled in with the
        instruction and input (before any cut to ``task.max_length``: ``generate_and_cuts`` says which are cut)."""
        fmt = self.language_model().format
        return [fmt.prompt_text(p if isinstance(p, Example) else Example(p, 0)) for p in prompts]

    def score_generation(self, examples: Sequence[Example], max_new_tokens: int | None = None) -> dict[str, Any]:
        """A labelled file's metrics as the run scores its test set (``generation_eval.file_scores``): the
        teacher-forced loss and perplexity per response token (through the run's trainer, as ``evaluate_global``),
        and BLEU, chrF, ROUGE-L and exact match of the greedy completions, overall and per example."""
        lm = self.language_model()
        examples = list(examples)
        stats = self.method.trainer.evaluate(self.params, lm.encode(examples), predictions=True)["predictions"]
        hyps = self.generate(examples, max_new_tokens)
        return file_scores(lm, stats, examples, hyps, self.cfg.evaluation.bootstrap)


def open_model(run_dir: str | Path, client: int | str | None = None, best: bool = False,
               untrained_ok: bool = False) -> TrainedModel:
    """The trained adapter of ``run_dir`` (the last checkpoint, or with ``best`` the one ``evaluation.keep_best``
    kept), for client ``client`` (an id, or a natural client's name) or the global one; no training data is read.
    A global adapter that was never trained (the sharing keeps every trained tensor on the clients) raises
    ValueError, unless ``untrained_ok``; one trained in part carries its ``warning``."""
    run = RunDir(run_dir)
    config = run.root / "config.yaml"
    if not config.exists():
        raise FileNotFoundError(f"{config}: not a fedpeft run directory")
    ckpt = run.load_checkpoint(best=best)
    if ckpt is None:
        raise FileNotFoundError(f"{run.best_ckpt}: the run kept no best checkpoint (it needs evaluation.keep_best)"
                                if best else f"{run.ckpt}: the run has no checkpoint yet")
    round, server, client_states, _ = ckpt
    cfg = load_config(config)
    record = run.read_record()
    if record is None:
        log.warning("%s has no model.json (a run from before fedpeft kept one): its task is read from the data "
                    "config.yaml names, which may have changed since", run.root)
        exp = build_experiment(cfg)
    else:
        exp = build_experiment(cfg, TaskOnly.from_record(record))
        exp.backbone.check_recorded(record["backbone"])
    method = build(cfg, exp).method
    names = exp.client_names()
    cid = client_id(client, names, exp.num_clients)
    untrained = () if cid is not None else tuple(method.untrained_global(server))
    model = TrainedModel(run.root, cfg, method, adapter_params(method, server, client_states, cid), round, best, cid,
                         names, untrained, exp.num_clients)
    if not untrained_ok:
        check_trained(model)
    return model


def check_trained(model: TrainedModel) -> None:
    """ValueError when ``model`` is a global adapter of which no tensor was ever trained, because the sharing
    policy keeps every tensor the clients train on them (``local``): it asks for ``--client K``."""
    floating = {k for k, v in model.params.items() if v.is_floating_point()}
    if model.client is not None or not model.untrained or not floating <= set(model.untrained):
        return
    raise ValueError(f"{model.run_dir}: method.sharing '{model.cfg.method.sharing.name}' keeps every tensor the "
                     f"clients train on the clients, so the global adapter was never trained: after round "
                     f"{model.round} of {model.rounds} it is still the initialisation (the untrained model); give "
                     f"--client K ({_ids(model)}) for client K's own adapter")


def _kind(key: str) -> str:
    """What an adapter tensor is, for a message."""
    if key.endswith((A, B)):
        return f"LoRA {'A' if key.endswith(A) else 'B'} factors"
    if key.startswith("head."):
        return "task head"
    return "prompt layers" if layer_of(key) is not None else "other tensors"


def _ids(model: TrainedModel) -> str:
    """The ``--client`` values of the run, for a message: its ids, and its clients' names where they have them."""
    ids = f"ids 0..{model.num_clients - 1}"
    names = model.client_names or []
    return ids + (f", or names {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}" if names else "")


def client_id(client: int | str | None, names: list[str] | None, num_clients: int) -> int | None:
    """``--client``: a client id, or with natural clients (``by_column``) the value that names it."""
    if client is None:
        return None
    if names is not None and str(client) in names:
        return names.index(str(client))
    try:
        cid = int(client)
    except ValueError:
        known = f"; names: {', '.join(names)}" if names else ""
        raise ValueError(f"--client: '{client}' is neither a client id (0..{num_clients - 1}) nor a client's "
                         f"name{known}") from None
    if not 0 <= cid < num_clients:
        raise ValueError(f"--client: {cid} is not a client of this run (ids 0..{num_clients - 1})")
    return cid


def adapter_params(method: ComposedMethod, server: Message, client_states: dict[int, Message],
                   client: int | None = None) -> Params:
    """The tensors to score with: the global adapter, or client ``client``'s personalised one (see module doc)."""
    if client is None:
        return method.global_view(server)
    if not method.sharing.per_client and not any(sub_state(m, PRIVATE) for m in client_states.values()):
        raise ValueError(f"--client: the checkpoint holds no client's private tensors (the method "
                         f"'{method.name}' keeps none, or a Flower deployment kept the client "
                         "states on the SuperNodes); every client uses the global adapter: drop --client")
    return method.client_view(server, client_states.get(client, Message()), client)


def predict(run_dir: str | Path, texts: Sequence[str], client: int | str | None = None,
            best: bool = False) -> list[dict[str, Any]]:
    """Each text with its predicted class name and class probabilities, from the run's global adapter (or client
    ``client``'s personalised one): ``[{"text": ..., "prediction": name, "p(<class>)": probability, ...}, ...]``."""
    from fedpeft.prediction_files import prediction_rows, texts_only

    if not texts:
        raise ValueError("no texts to classify (--text or --file)")
    model = open_model(run_dir, client, best)
    inputs = texts_only(list(texts))
    probs = model.probabilities(inputs.examples(model.objective.task.is_pair))
    return prediction_rows(inputs, model.class_names, probs.argmax(-1).tolist(), probs.tolist())


@dataclass
class BareModel:
    """A backbone with no adapter, as a language model (the zero-shot row of a standard evaluation)."""

    name: str
    objective: Any  # a ``LanguageModel`` with the ``template_only`` adapter
    params: Params

    def describe(self, with_warning: bool = True) -> str:
        return f"the bare backbone '{self.name}' (no adapter)"


def bare_model(name: str, device: str = "auto") -> BareModel:
    """The registered backbone ``name`` alone, on ``device``: a causal LM scored and decoded as a run's would be."""
    from fedpeft.adapters import ADAPTERS
    from fedpeft.adapters.base import AdapterContext
    from fedpeft.backbones.loading import load_backbone, resolve_device
    from fedpeft.data.types import TaskData
    from fedpeft.model.language_model import LanguageModel

    backbone = load_backbone(name).to(resolve_device(device))
    task = TaskData(name="bare", class_names=[], train=[], test=[], label_words=[], label_descriptions=[],
                    kind="generation")
    adapter = ADAPTERS.get("template_only")(None)  # it has no settings
    lm = LanguageModel(backbone, adapter, task)
    adapter.bind(AdapterContext(0, task, lm.readout, backbone))
    return BareModel(name, lm, {})
