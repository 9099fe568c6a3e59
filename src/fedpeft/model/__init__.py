"""The adapted frozen model and what its forward pass is scored by (the objective axis).

``OBJECTIVES`` maps a task kind to its objective: ``classification`` (class logits through a readout:
similarity, verbalizer or linear head, optionally calibrated; ``model.classifier``) and ``generation`` (token
cross-entropy on the response tokens of a causal LM, and greedy decoding; ``model.language_model``) and
``preference`` (the log-likelihoods of a chosen and a rejected response under the adapted model and under the
frozen backbone as reference, for preference trainers; ``model.preference``). Every
objective shares the forward pass of ``model.forward.AdaptedModel`` and offers trainers one contract:
``encode``, ``batch``, ``outputs`` then ``loss`` (gradient trainers), ``evaluate``, ``init_params``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedpeft.config import ModelConfig
from fedpeft.model.classifier import Classifier
from fedpeft.model.language_model import LanguageModel
from fedpeft.model.preference import PreferenceModel
from fedpeft.registry import Registry

OBJECTIVES: Registry[Any] = Registry("objective")  # task kind -> builder(backbone, adapter, task, settings)


@dataclass(frozen=True)
class ObjectiveSettings:
    """What an objective reads of the run: the ``model`` section (readout, its scale, calibration, pooling), the
    task's length limits and the runtime's compute options."""

    model: ModelConfig
    max_length: int  # task.max_length: tokens of an input (a generation task: of the prompt and response)
    max_response_length: int  # task.max_response_length (generation)
    autocast: str  # runtime.autocast
    padding_free: bool  # runtime.padding_free (generation)


@OBJECTIVES.register("classification", "class logits through a readout (similarity, verbalizer, linear); "
                                       "cross-entropy over the classes")
def build_classifier(backbone, adapter, task, settings: ObjectiveSettings) -> Classifier:
    m = settings.model
    return Classifier(backbone, adapter, task, m.readout, m.similarity_scale, settings.max_length, settings.autocast,
                      calibration=m.calibration, pooling=m.pooling)


@OBJECTIVES.register("generation", "causal-LM token cross-entropy on the response tokens; greedy decoding")
def build_language_model(backbone, adapter, task, settings: ObjectiveSettings) -> LanguageModel:
    return LanguageModel(backbone, adapter, task, settings.max_length, settings.max_response_length,
                         settings.autocast, padding_free=settings.padding_free)


@OBJECTIVES.register("preference", "log-likelihoods of a chosen and a rejected response, the adapted model against "
                                   "the frozen backbone (reference); for preference trainers (dpo)")
def build_preference_model(backbone, adapter, task, settings: ObjectiveSettings) -> PreferenceModel:
    return PreferenceModel(backbone, adapter, task, settings.max_length, settings.max_response_length,
                           settings.autocast, padding_free=settings.padding_free)


__all__ = ["OBJECTIVES", "Classifier", "LanguageModel", "ObjectiveSettings", "PreferenceModel"]
