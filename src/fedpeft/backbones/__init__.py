"""Frozen pretrained models, loaded once per process, and the readouts that turn them into classifiers."""

from fedpeft.backbones.loading import BACKBONES, Backbone, BackboneCache, PROCESS_CACHE, load_backbone

__all__ = ["BACKBONES", "Backbone", "BackboneCache", "PROCESS_CACHE", "load_backbone"]
