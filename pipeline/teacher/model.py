"""A teacher: a Hugging Face encoder (optionally with a classification head) and its pooled outputs.

Outputs, each per text (or per pair for cross-encoders):
- `cls`      last hidden state of the first token;
- `mean`     masked mean of the last hidden state;
- `layers`   masked mean of every hidden state, embeddings layer first: [L+1, dim] (CoDIR);
- `sentence` the sentence-transformers pooling of a sentence-transformers directory, with its
             normalisation (what `SentenceTransformer.encode` returns);
- `logits`   the sequence-classification / cross-encoder head; label names go to the manifest.
Pooling runs in fp32 whatever the forward precision, so autocast only touches the matmuls: in torch after a torch
forward pass (on its device), in numpy after an exported backend's (`pool_numpy`, the same formulas).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from kd.common.attention import varying_shape_attention
from kd.common.errors import KdError
from kd.common.fast_tokenizer import FastTokenizer
from kd.common.hardware import native_bf16
from kd.common.parsing import read_config
from kd.common.quiet import hush_libraries
from kd.pipeline.teacher.batches import encode_all
from kd.pipeline.teacher.resolve import TeacherRef, recorded_source
from kd.storage.tokenizer_files import load_tokenizer

if TYPE_CHECKING:  # torch is imported where a torch model runs: a warm exported backend never loads it
    import torch


class Output(str, Enum):
    cls = "cls"
    mean = "mean"
    layers = "layers"
    sentence = "sentence"
    logits = "logits"


class Precision(str, Enum):
    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


ST_MODULES = {"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
              "sentence_transformers.models.Normalize"}


@dataclass
class STPooling:
    """The pooling a sentence-transformers directory declares (modules.json + Pooling config)."""

    mode: str  # mean | cls | max
    normalize: bool
    max_seq_length: int | None


ST_FIX = "point --teacher at the sentence-transformers folder as it was saved (copy or download it again)"


def read_st_pooling(path: str) -> STPooling | None:
    """The pooling a sentence-transformers folder declares, None for a plain checkpoint or modules kd does not
    reimplement. Its configs go through the bounded reader (common.parsing.read_config) and their fields are
    checked here: they come with a folder kd was handed."""
    mpath = os.path.join(path, "modules.json")
    if not os.path.lexists(mpath):  # lexists: a pipe or a device in its place is refused, not taken as absent
        return None
    modules = read_config(mpath, ST_FIX, KdError)
    if not isinstance(modules, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str)
                                                and isinstance(m.get("path", ""), str) for m in modules):
        raise KdError("modules.json is not a list of modules, each with a type and a path", mpath, ST_FIX)
    if any(m["type"] not in ST_MODULES for m in modules):
        return None  # e.g. a Dense layer: we do not reimplement it, so no `sentence` output
    pool = next((m for m in modules if m["type"].endswith("Pooling")), None)
    mode = "mean"
    if pool is not None:
        cfg = _st_config(os.path.join(path, pool.get("path", ""), "config.json"))
        mode = "cls" if cfg.get("pooling_mode_cls_token") else "max" if cfg.get("pooling_mode_max_tokens") else "mean"
    max_len = None
    sbc = os.path.join(path, "sentence_bert_config.json")
    if os.path.lexists(sbc):
        max_len = _st_config(sbc).get("max_seq_length")
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
            raise KdError(f"sentence_bert_config.json says max_seq_length = {max_len!r}, not a positive whole number",
                          sbc, ST_FIX)
    return STPooling(mode, any(m["type"].endswith("Normalize") for m in modules), max_len)


def _st_config(path: str) -> dict:
    cfg = read_config(path, ST_FIX, KdError)
    if not isinstance(cfg, dict):
        raise KdError(f"{os.path.basename(path)} is not a JSON object", path, ST_FIX)
    return cfg


# One digest per weights per process: a kd distill run checked its teacher against the store, loaded it, keyed its
# export cache and its eval cache, each hashing mpnet's 420 MB again (about a second each). Keyed by the files' stat:
# weights written since (another ctime: a copy that keeps the old mtime still changes it) are hashed again.
_DIGESTS: dict[tuple, str] = {}


def weights_sha256(path: str) -> str:
    """sha256 of the checkpoint's top-level weights files (.safetensors, .bin), in name order."""
    files = sorted(f for f in os.listdir(path) if f.endswith((".safetensors", ".bin")))
    stats = tuple((f, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) for f in files
                  for st in [os.stat(os.path.join(path, f))])
    key = (os.path.realpath(path), stats)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        for f in files:
            with open(os.path.join(path, f), "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


# config.json keys that say who saved a checkpoint, not what it computes (kd loads in its own precision)
SAVED_BY = ("transformers_version", "_name_or_path", "dtype", "torch_dtype")
# Keys every transformers config has, at their default: transformers 4 writes only those that differ from it, 5 writes
# all, so the same config saved by each reads the same only without them (a probe: the re-save was "another teacher")
CONFIG_DEFAULTS = {"is_decoder": False, "add_cross_attention": False, "is_encoder_decoder": False,
                   "tie_encoder_decoder": False, "bos_token_id": None, "eos_token_id": None, "sep_token_id": None,
                   "decoder_start_token_id": None, "use_cache": True, "classifier_dropout": None,
                   "position_embedding_type": "absolute", "tie_word_embeddings": True, "chunk_size_feed_forward": 0,
                   "output_hidden_states": False, "output_attentions": False, "return_dict": True,
                   "torchscript": False, "pruned_heads": {}, "problem_type": None, "tokenizer_class": None,
                   "prefix": None, "task_specific_params": None, "finetuning_task": None,
                   "cross_attention_hidden_size": None}


def config_sha256(path: str) -> str:
    """sha256 of the checkpoint's config.json settings (sorted JSON; `SAVED_BY` keys, `_` keys and `CONFIG_DEFAULTS`
    values aside): with the weights and the tokenizer (`check_same_tokenizers`), what decides the vectors. `hidden_act`
    edited between a killed precompute and its resume wrote another function's vectors into the same table (a probe)."""
    cfg = read_config(os.path.join(path, "config.json"), "point --teacher at the checkpoint folder as it was saved",
                      KdError)
    missing = object()
    settings = {k: v for k, v in cfg.items() if k not in SAVED_BY and not k.startswith("_")  # (transformers' own
                and CONFIG_DEFAULTS.get(k, missing) != v} if isinstance(cfg, dict) else cfg  # bookkeeping: a probe)
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def changed_since(path: str, meta: dict) -> str | None:
    """What of the checkpoint at `path` is not what a teacher table's `meta` records ("weights", "config.json
    settings"), or None; a digest the meta lacks (a store of an older kd) is not compared."""
    if meta.get("weights_sha256") and weights_sha256(path) != meta["weights_sha256"]:
        return "weights"
    if meta.get("config_sha256") and config_sha256(path) != meta["config_sha256"]:
        return "config.json settings"
    return None


def resolve_precision(p: Precision, device: torch.device) -> torch.dtype | None:
    """Compute dtype, or None for plain fp32. `auto`: fp16 on CUDA; on CPU bf16 where the CPU has native
    bf16 (`native_bf16`), fp32 elsewhere."""
    import torch

    if p is Precision.auto:
        if device.type == "cuda":
            return torch.float16
        return torch.bfloat16 if device.type == "cpu" and native_bf16() else None
    return {Precision.fp32: None, Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}[p]


def cast_weights(device: torch.device, dtype: torch.dtype | None) -> bool:
    """bf16 on CPU: store the weights in bf16 instead of autocasting. CPU autocast re-casts every fp32
    weight at every call (measured 12 % slower); CUDA keeps fp16 autocast, whose fp32 LayerNorm and
    softmax guard against fp16 overflow."""
    import torch

    return device.type == "cpu" and dtype is torch.bfloat16


@dataclass
class Teacher:
    ref: TeacherRef
    model: torch.nn.Module | None  # None: not loaded (an exported backend with a cached fidelity runs it)
    tokenizer: object  # the transformers tokenizer; None until `hf_tokenizer()` when loaded from the cache record
    has_head: bool
    st: STPooling | None
    max_length: int
    device: torch.device
    autocast: torch.dtype | None
    label_names: list[str] | None = None
    num_layers: int = 0
    dim: int = 0
    weights_cast: bool = False  # the model's weights are in `autocast`'s dtype: no autocast context needed
    backend: Any = None  # a pipeline.backends.runtime.Runner: the forward pass on ONNX Runtime / OpenVINO (None: torch)
    config: Any = None  # the checkpoint's transformers config
    architecture: str = ""  # the model class the checkpoint loads as (recorded in the manifest)
    embedding: dict | None = None  # {file, key}: the input embeddings in a .safetensors file (model not loaded)
    choice: dict | None = None  # --backend auto: what it chose and why (pipeline/backends/choice.py)
    model_type: str = ""  # config.model_type (recorded in the manifest)
    fast: FastTokenizer | None = None  # what precompute tokenizes with (common/fast_tokenizer.py)
    tokenizer_folder: str | None = None  # the tokenizer's saved files, when loaded from the cache record
    _sha: str | None = field(default=None, repr=False)
    _config_sha: str | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.ref.name

    def reference_model(self) -> torch.nn.Module:
        """The model with the checkpoint's own fp32 weights, for what copies weights (input embeddings, kept
        layers): a bf16-cast teacher reloads them rather than hand out rounded weights."""
        if self.model is not None and not self.weights_cast:
            return self.model
        return from_checkpoint(self.has_head, self.ref.path)

    def hf_tokenizer(self) -> Any:
        """The transformers tokenizer (loaded from `tokenizer_folder` on first use when the teacher came from the
        cache record: vocab and init outputs need it, rows do not)."""
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.tokenizer_folder, "delete the export cache folder holding it (the "
                                            "next run measures the backend again), or point KD_CACHE elsewhere")
        return self.tokenizer

    def description(self) -> dict:
        """What the teacher derives from its config and tokenizer (pipeline/backends/loading.py's `_teacher`), which
        `loading.described` makes it from again without either (the export cache's record:
        pipeline/backends/fidelity_cache.py)."""
        return {"model_type": self.model_type, "num_layers": self.num_layers, "dim": self.dim,
                "has_head": self.has_head, "label_names": self.label_names, "max_length": self.max_length}

    def available(self) -> list[Output]:
        outs = [Output.cls, Output.mean, Output.layers]
        if self.st is not None:
            outs.append(Output.sentence)
        if self.has_head:
            outs.append(Output.logits)
        return outs

    def default_outputs(self) -> list[Output]:
        return self.available()

    def meta(self, outputs: list[Output], dtype: str) -> dict:
        """Everything that determines the stored values; two writers must agree on it exactly."""
        if self._sha is None:
            self._sha = weights_sha256(self.ref.path)
        if self._config_sha is None:
            self._config_sha = config_sha256(self.ref.path)
        return {
            "source": recorded_source(self.ref.source),
            "weights_sha256": self._sha,
            "config_sha256": self._config_sha,
            "architecture": self.architecture,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "dim": self.dim,
            "max_length": self.max_length,
            "outputs": [o.value for o in outputs],
            "pooling": {
                "cls": "last_hidden_state[:, 0]",
                "mean": "masked mean of last_hidden_state",
                "layers": "masked mean of each hidden state, embeddings first",
                "sentence": None if self.st is None else {"mode": self.st.mode, "normalize": self.st.normalize},
            },
            "precision": str(self.autocast).replace("torch.", "") if self.autocast else "float32",
            **({"cast": "weights" if self.weights_cast else "autocast"} if self.autocast else {}),
            # torch | onnx | openvino, none | int8, and the fidelity to torch fp32 (measured, not compared)
            **(self.backend.meta() if self.backend is not None else {"backend": "torch", "quantize": "none"}),
            **({"backend_choice": self.choice} if self.choice else {}),
            "dtype": dtype,
            "label_names": self.label_names,
            "default_target": "sentence" if self.st is not None else "mean",
            "tokenizer": f"tokenizers/{self.name}",
            "input_embeddings": f"teachers/{self.name}/input_embeddings.safetensors",
        }

    def forward(self, enc: dict[str, Any], outputs: list[Output]) -> dict[str, np.ndarray]:
        """One padded batch (numpy arrays or tensors) -> pooled outputs as float32 numpy arrays."""
        return self.launch(enc, outputs)()

    def launch(self, enc: dict[str, Any], outputs: list[Output]) -> Callable[[], dict[str, np.ndarray]]:
        """Start `forward` of one batch; the returned call gives its outputs. On a GPU it returns once the work is
        queued (the vectors come back by an asynchronous copy into pinned memory), so the caller can prepare
        and launch the next batch while this one runs; elsewhere the work is done before it returns."""
        if self.backend is not None:  # ONNX Runtime / OpenVINO run the encoder; pooling stays here, in fp32
            states, logits = self.backend.run(enc, Output.layers in outputs, Output.logits in outputs)
            done = pool_numpy(states, logits, np.asarray(enc["attention_mask"]), outputs, self.st)
            return lambda: done
        return self._launch_torch(enc, outputs)

    def _launch_torch(self, enc: dict[str, Any], outputs: list[Output]) -> Callable[[], dict[str, np.ndarray]]:
        import torch

        states, logits, mask = self._hidden({k: torch.as_tensor(v) for k, v in enc.items()}, outputs)
        last = states[-1].float()
        res: dict[str, torch.Tensor] = {}
        if Output.cls in outputs:
            res["cls"] = last[:, 0]
        if Output.mean in outputs or (Output.sentence in outputs and self.st.mode == "mean"):
            res["mean"] = (last * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        if Output.layers in outputs:
            res["layers"] = torch.stack([(h.float() * mask).sum(1) / mask.sum(1).clamp(min=1e-9) for h in states], 1)
        if Output.sentence in outputs:
            res["sentence"] = self._st_pool(last, mask, res)
        if Output.logits in outputs:
            res["logits"] = logits.float()
        wanted = {k: v for k, v in res.items() if k in {o.value for o in outputs}}
        if self.device.type != "cuda":
            done = {k: v.cpu().numpy() for k, v in wanted.items()}
            return lambda: done
        # Copy back without waiting: into pinned host memory (only such copies are asynchronous), with an event
        # marking when they are done; the caller waits on it only when it needs the vectors.
        host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in wanted.items()}
        for k, v in wanted.items():
            host[k].copy_(v, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()

        def fetch() -> dict[str, np.ndarray]:
            copied.synchronize()
            return {k: v.numpy() for k, v in host.items()}
        return fetch

    def _hidden(self, enc: dict[str, torch.Tensor], outputs: list[Output]) -> tuple:
        """(hidden states: all of them when `layers` is asked, else at least the last; logits or None; mask)."""
        import torch

        pin = self.device.type == "cuda"
        enc = {k: (v.pin_memory() if pin else v).to(self.device, non_blocking=True) for k, v in enc.items()}
        need_states = Output.layers in outputs or self.has_head
        use_autocast = self.autocast is not None and not self.weights_cast
        ctx = torch.autocast(self.device.type, dtype=self.autocast) if use_autocast else nullcontext()
        with torch.inference_mode(), ctx, varying_shape_attention(self.device.type):
            out = self.model(**enc, output_hidden_states=need_states, return_dict=True)
        states = out.hidden_states if need_states else (out.last_hidden_state,)
        return states, getattr(out, "logits", None), enc["attention_mask"].unsqueeze(-1).float()

    def _st_pool(self, last: torch.Tensor, mask: torch.Tensor, res: dict) -> torch.Tensor:
        import torch

        if self.st.mode == "cls":
            v = last[:, 0]
        elif self.st.mode == "max":
            v = last.masked_fill(mask == 0, -1e9).max(1).values
        else:
            v = res["mean"]
        return torch.nn.functional.normalize(v, dim=-1) if self.st.normalize else v

    def encode(
        self, texts: list, outputs: list[Output] | None = None, batch_tokens: int | None = None
    ) -> dict[str, np.ndarray]:
        """Convenience for evaluation and search: encode texts (or (a, b) pairs) in input order."""

        return encode_all(self, texts, outputs or self.default_outputs(), batch_tokens)[0]


def pool_numpy(states: list[np.ndarray], logits: np.ndarray | None, attention_mask: np.ndarray,
               outputs: list[Output], st: STPooling | None) -> dict[str, np.ndarray]:
    """`Teacher._forward_torch`'s pooling on an exported backend's numpy outputs, in fp32: cls, masked means (one
    batched matmul per state instead of a [batch, tokens, dim] product), the sentence-transformers pooling."""
    mask = attention_mask.astype(np.float32)
    weights = (mask / np.maximum(mask.sum(1, keepdims=True), 1e-9))[:, None, :]  # [batch, 1, tokens]

    def mean(h: np.ndarray) -> np.ndarray:
        return np.matmul(weights, h.astype(np.float32, copy=False))[:, 0]

    last = states[-1].astype(np.float32, copy=False)
    want = {o.value for o in outputs}
    res: dict[str, np.ndarray] = {}
    if "cls" in want:
        res["cls"] = last[:, 0]
    if "mean" in want or ("sentence" in want and st.mode == "mean"):
        res["mean"] = mean(last)
    if "layers" in want:
        res["layers"] = np.stack([mean(h) for h in states], 1)
    if "sentence" in want:
        v = res["mean"] if st.mode == "mean" else last[:, 0] if st.mode == "cls" else \
            np.where(mask[:, :, None] > 0, last, np.float32(-1e9)).max(1)
        res["sentence"] = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12) if st.normalize else v
    if "logits" in want:
        res["logits"] = logits.astype(np.float32, copy=False)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in res.items() if k in want}


def model_class(has_head: bool) -> type:
    from transformers import AutoModel, AutoModelForSequenceClassification

    hush_libraries()  # load reports and weight-loading bars would drown our own progress (not with KD_VERBOSE=1)
    return AutoModelForSequenceClassification if has_head else AutoModel


def from_checkpoint(has_head: bool, path: str) -> torch.nn.Module:
    """The checkpoint's model, refused when its weights lack a tensor the model has: transformers fills it with
    random values and says so only in the load report kd hushes, so a teacher with a layer left out computed every
    vector from noise with exit 0 (the sixth probe). The pooler is exempt: kd never reads it, and many encoders are
    saved without one."""
    model, info = model_class(has_head).from_pretrained(path, output_loading_info=True)
    missing = sorted(k for k in info.get("missing_keys", ()) if "pooler." not in k)
    if missing:
        raise KdError(f"the teacher's weights lack {len(missing)} tensor(s) its config.json asks for (first: "
                      f"{', '.join(missing[:3])}); transformers would fill them with random values", path,
                      "point --teacher at the whole checkpoint as it was saved (copy or download it again)")
    return model.eval()
