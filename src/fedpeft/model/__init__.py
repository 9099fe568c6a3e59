"""The adapted frozen model and what its forward pass is scored by (the objective axis).

``OBJECTIVES`` maps a task kind to its objective: ``classification`` (class logits through a readout:
similarity, verbalizer or linear head, optionally calibrated; ``model.classifier``) and ``generation`` (token
cross-entropy on the response tokens of a causal LM, and greedy decoding; ``model.language_model``). Every
objective shares the forward pass of ``model.forward.AdaptedModel`` and offers trainers one contract:
``encode``, ``batch``, ``outputs`` then ``loss`` (gradient trainers), ``evaluate``, ``init_params``.
"""

from __future__ import annotations

from typing import Any

from fedpeft.model.classifier import Classifier
from fedpeft.model.language_model import LanguageModel
from fedpeft.registry import Registry

OBJECTIVES: Registry[Any] = Registry("objective")  # task kind -> builder(backbone, adapter, task, cfg)


@OBJECTIVES.register("classification", "class logits through a readout (similarity, verbalizer, linear); "
                                       "cross-entropy over the classes")
def build_classifier(backbone, adapter, task, cfg) -> Classifier:
    return Classifier(backbone, adapter, task, cfg.model.readout, cfg.model.similarity_scale, cfg.task.max_length,
                      cfg.runtime.autocast, calibration=cfg.model.calibration, pooling=cfg.model.pooling)


@OBJECTIVES.register("generation", "causal-LM token cross-entropy on the response tokens; greedy decoding")
def build_language_model(backbone, adapter, task, cfg) -> LanguageModel:
    return LanguageModel(backbone, adapter, task, cfg.task.max_length, cfg.task.max_response_length,
                         cfg.runtime.autocast, padding_free=cfg.runtime.padding_free)


__all__ = ["OBJECTIVES", "Classifier", "LanguageModel"]
