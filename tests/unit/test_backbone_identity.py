"""A backbone's identity (its parameter count and fingerprint) is that of its pretrained weights, whatever adapter
layers peft injected into it, LoRA or any other tuner (IA³ here), and whatever values those layers hold."""

from __future__ import annotations

import torch

from fedpeft.backbones.loading import BACKBONES


def test_injected_peft_layers_change_neither_the_parameter_count_nor_the_fingerprint():
    from peft import IA3Config, LoraConfig, inject_adapter_in_model

    bb = BACKBONES.get("tiny-bert")()  # a private copy, not the process's shared backbone
    count, fingerprint, checksum = bb.num_parameters, bb.fingerprint(), bb.checksum()
    assert bb.injected() == frozenset()
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["query", "value"]), bb.model, adapter_name="lora")
    inject_adapter_in_model(IA3Config(target_modules=["key", "output.dense"], feedforward_modules=["output.dense"]),
                            bb.model, adapter_name="ia3")
    injected = bb.injected()
    assert any(".lora_A." in n for n in injected) and any(".ia3_l." in n for n in injected)
    assert not any("base_layer" in n for n in injected)
    with torch.no_grad():  # what an adapter writes into its layers is not the backbone's
        for name, p in bb.model.named_parameters():
            if name in injected:
                p.fill_(2.0)
    bb.cache.clear()
    assert bb.num_parameters == count
    assert bb.fingerprint() == fingerprint
    assert bb.checksum() != checksum  # the checksum sees every weight: the run's frozen-backbone check
