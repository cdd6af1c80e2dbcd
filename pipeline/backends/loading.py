"""A teacher reference becomes a loaded `Teacher`, on the backend asked for: the one place that reads a checkpoint
folder (config, weights, tokenizer) and the export cache for a reference.

- `load`: torch (`load_teacher`), ONNX Runtime or OpenVINO (an exported graph from the cache, or exported and
  measured against torch now: pipeline/backends/runtime.py), or `auto` (pipeline/backends/choice.py).
- `load_decided`: the backend an auto decision taken elsewhere named (a Ray worker).
- `described`: the teacher an exported backend runs, from its recorded description, with no torch model.
The teacher itself (its outputs, pooling, digests) is pipeline/teacher/model.py; resolving the reference is
pipeline/teacher/resolve.py.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError

from kd.common.bert_config import SIZES, size_problem
from kd.common.errors import KdError
from kd.common.fast_tokenizer import FastTokenizer
from kd.common.hardware import device_kind, resolve_device
from kd.common.parsing import check_model_folder
from kd.common.progress import step
from kd.pipeline.backends import choice as backend_choice
from kd.pipeline.backends import fidelity_cache, runtime
from kd.pipeline.backends.calibration import FIDELITY_ROWS
from kd.pipeline.backends.runtime import Backend, Quantize
from kd.pipeline.teacher.model import (
    Precision,
    Teacher,
    cast_weights,
    from_checkpoint,
    read_st_pooling,
    resolve_precision,
    weights_sha256,
)
from kd.pipeline.teacher.resolve import TeacherRef, TeacherSpec, resolve_teacher
from kd.storage.tokenizer_files import load_tokenizer

if TYPE_CHECKING:  # torch is imported where a torch model runs: a warm exported backend never loads it
    import torch


def load(spec: str | TeacherSpec | TeacherRef, backend: str | Backend = Backend.torch,
         quantize: str | Quantize = Quantize.none, *,
         device: str | None = None, precision: str | Precision = Precision.auto, max_length: int | None = None,
         threads: int | None = None, allow_low_fidelity: bool = False, engine: str = "local",
         stored: str | None = None) -> Teacher:
    """A teacher whose forward pass runs on `backend`; the torch backend is `load_teacher`; `auto` is
    resolved by `backend_choice.choose` (`stored`: the backend the store holds this teacher with)."""
    b, q = runtime.check_options(backend, quantize, precision, device)
    ref = resolve_teacher(spec)  # once: the auto choice's retries and the torch fallback load this ref
    if b is Backend.auto:
        return _load_auto(ref, q, device, Precision(precision), max_length, threads, allow_low_fidelity, engine,
                          stored)
    if b is Backend.torch:
        return load_teacher(ref, device, Precision(precision), max_length)
    sha = weights_sha256(ref.path)
    compute = runtime.backend_precision(b, Precision(precision))
    teacher = _from_cache(ref, sha, b, q, compute, max_length, threads, device)
    if teacher is None:
        # The torch model stays on the CPU in fp32: the fidelity reference, the export source, and what copies
        # weights (input embeddings, init layers).
        teacher = load_teacher(ref, "cpu", Precision.fp32, max_length)
        teacher._sha = sha
        # padded, truncated calls leave their settings in a fast tokenizer, and the store saves its files: the
        # untouched copy is kept, so a measured and a cached run write the same tokenizer.json
        clean = copy.deepcopy(teacher.tokenizer)
        folder = runtime.exported(teacher, b, q)
        runner = runtime.open_runner(folder, b, q, compute, threads, device)
        teacher.backend = runner
        with step(f"checking {teacher.name} on {b.value} against torch ({FIDELITY_ROWS} sentences)"):
            runner.fidelity = runtime.measure_fidelity(teacher, folder)
        teacher.tokenizer = clean
        fidelity_cache.write(folder, _cache_key(folder, ref, sha, b, q, compute, max_length), teacher, runner.fidelity)
    runtime.check_fidelity(teacher, allow_low_fidelity)
    return teacher


def _load_auto(ref: TeacherRef, q: Quantize, device: str | None, p: Precision, max_length: int | None,
               threads: int | None, allow_low_fidelity: bool, engine: str, stored: str | None) -> Teacher:
    """The backend `backend_choice.choose` picks; torch instead when that one fails its fidelity check."""
    # --engine ray: the driver's copy runs on its CPU, and its choice is what CPU workers get (ray_engine.auto_choices)
    kind = "cuda" if engine == "local" and device_kind(device) == "cuda" else "cpu"
    choice = backend_choice.choose(kind, p.value, q.value, backend_choice.installed(), stored=stored)
    options = dict(device=device, precision=p, max_length=max_length, threads=threads)
    try:
        teacher = load(ref, choice.backend, choice.quantize, allow_low_fidelity=allow_low_fidelity, **options)
    except runtime.LowFidelity as e:
        if stored is not None:  # the store holds this backend: switching would mix two in one table
            raise
        choice = backend_choice.fallback(choice, e.what)
        teacher = load(ref, Backend.torch, Quantize.none, **options)
    teacher.choice = choice.record()
    return teacher


def load_decided(spec: TeacherSpec, record: dict, *, where: str, device: str | None = None,
                 precision: str | Precision = Precision.auto, max_length: int | None = None,
                 threads: int | None = None, allow_low_fidelity: bool = False) -> Teacher:
    """A teacher on the backend an auto decision taken elsewhere named (`record`: `Choice.record()`; the Ray
    driver decides once for every worker). Never another backend: one this process cannot run is an error
    naming `where` (this worker), so a node without OpenVINO cannot write a table with torch's vectors."""
    backend, quantize = record["backend"], record["quantize"]
    module = backend_choice.RUNTIMES.get(backend)
    if module is not None and importlib.util.find_spec(module) is None:
        extra = runtime.EXTRAS[Backend(backend)][1]
        raise KdError(f"--backend auto chose {backend} for every Ray worker ({record['reason']}), but {module} is "
                      f"not installed on {where}", "--engine ray --backend auto",
                      f"pip install 'kd[{extra}]' on every Ray node, or pass --backend torch")
    teacher = load(spec, backend, quantize, device=device, precision=precision, max_length=max_length,
                   threads=threads, allow_low_fidelity=allow_low_fidelity)
    teacher.choice = dict(record)
    return teacher


def _cache_key(folder: Path, ref: TeacherRef, sha: str, b: Backend, q: Quantize, compute: str,
               max_length: int | None) -> dict:
    spec = json.loads((folder / runtime.SPEC).read_text(encoding="utf-8"))
    return fidelity_cache.key(ref.path, sha, spec["files"][spec["file"]], b.value, q.value, compute, max_length)


def _from_cache(ref: TeacherRef, sha: str, b: Backend, q: Quantize, compute: str, max_length: int | None,
                threads: int | None, device: str | None) -> Teacher | None:
    """The teacher without its torch model, when the export cache holds a sound graph and a fidelity measured
    for exactly these weights, graph, precision and CPU (pipeline/backends/fidelity_cache.py); else None."""
    folder = runtime.sound_cache(sha, b, q)
    if folder is None:
        return None
    rec = fidelity_cache.read(folder, _cache_key(folder, ref, sha, b, q, compute, max_length))
    if rec is None:
        return None
    fast, tok_folder = fidelity_cache.fast_tokenizer(folder, rec)
    teacher = described(ref, rec["teacher"], architecture=rec["architecture"], embedding=rec.get("embedding"),
                        fast=fast, tokenizer_folder=str(tok_folder))
    teacher._sha = sha
    teacher.backend = runtime.open_runner(folder, b, q, compute, threads, device)
    teacher.backend.fidelity = rec["fidelity"]
    return teacher


# --- torch: the checkpoint itself ---------------------------------------------------------------------------


def load_teacher(spec: str | TeacherSpec | TeacherRef, device: str | None = None, precision: Precision = Precision.fp32,
                 max_length: int | None = None) -> Teacher:
    """Load a teacher from an alias, a directory, or a NAME=PATH spec. The library default is fp32 (eval,
    search and benchmarks measure the reference model); `kd precompute` defaults to `auto`."""
    ref = resolve_teacher(spec)
    dev = resolve_device(device)
    cfg = _config(ref)
    try:
        with step(f"loading teacher {ref.name}"):
            model = from_checkpoint(_has_head(cfg), ref.path).to(dev)
    # RuntimeError: weights of other shapes than config.json says; SafetensorError: a weights file that is not one;
    # KeyError: a config value transformers looks up in its own tables (`hidden_act = "os.system"`: the sixth probe)
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as e:
        raise KdError(f"cannot load the teacher checkpoint ({' '.join(str(e).split())[:300]})", ref.path,
                      "the directory must hold a Hugging Face model and its tokenizer files") from e
    dtype = resolve_precision(Precision(precision), dev)
    cast = cast_weights(dev, dtype)
    if cast:
        model.to(dtype)
    architecture = (cfg.architectures or [type(model).__name__])[0]
    return _teacher(ref, cfg, model, architecture, dev, dtype, max_length, weights_cast=cast)


def _config(ref: TeacherRef) -> Any:
    """The checkpoint's config (every backend reads it first): a junk or unknown one is kd's error, naming the file;
    so is a size out of `common.bert_config.SIZES`, before any layer is built ("num_hidden_layers": 1e9 never
    returned: issue 48's third probe)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    where = os.path.join(ref.path, "config.json")
    check_model_folder(ref.path, "point --teacher at the checkpoint folder as it was saved (copy or download it "
                       "again)")
    try:
        cfg = AutoConfig.from_pretrained(ref.path)
    # not JSON, a model_type this transformers does not know, a field of the wrong type (transformers' typed configs)
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as e:
        raise KdError(f"the teacher's config.json cannot be read ({' '.join(str(e).split())[:200]})", where,
                      "point --teacher at a Hugging Face checkpoint folder with a valid config.json") from e
    for key in SIZES:
        value = getattr(cfg, key, None)  # a size a model type does not have is no problem
        problem = size_problem(key, value) if value is not None else None
        if problem:
            raise KdError(f"the teacher's config.json's {problem}", where,
                          "point --teacher at the checkpoint as it was saved (its config.json is damaged)")
    return cfg


def _check_vocab(tok: Any, cfg: Any, where: str) -> None:
    """A tokenizer of far fewer tokens than the model's embedding table is not the model's: transformers builds one
    from the special tokens alone when the vocabulary files are missing or unreadable (5 tokens, every word [UNK]).
    Half leaves room for tables padded past the vocabulary (T5: 32,100 tokens, 32,128 rows)."""
    size = getattr(cfg, "vocab_size", None)
    if isinstance(size, int) and len(tok) < size // 2:
        raise KdError(f"the teacher's tokenizer knows {len(tok):,} tokens, its model {size:,} (config.json "
                      "vocab_size): the tokenizer files are missing or damaged (tokenizer.json, vocab.txt)", where,
                      "copy or download the checkpoint again, tokenizer files included")


def described(ref: TeacherRef, description: dict, **extra: Any) -> Teacher:
    """The teacher `Teacher.description()` describes, with neither its model nor transformers' tokenizer: an exported
    backend runs it (`extra`: its architecture, embedding source and tokenizers, from the same record)."""
    d = description
    return Teacher(ref, None, None, d["has_head"], read_st_pooling(ref.path), d["max_length"], None, None,
                   d["label_names"], d["num_layers"], d["dim"], model_type=d["model_type"], **extra)


def _has_head(cfg: Any) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in (cfg.architectures or []))


def _teacher(ref: TeacherRef, cfg: Any, model: torch.nn.Module | None, architecture: str, dev: torch.device,
             dtype: torch.dtype | None, max_length: int | None, **extra: Any) -> Teacher:
    """A Teacher from the checkpoint's config and tokenizer (max length: the tokenizer's, the position
    embeddings' and sentence-transformers' limits, then --max-length)."""

    tok = load_tokenizer(ref.path, "the directory must hold the teacher's tokenizer files, undamaged: copy or "
                         "download the checkpoint again")
    _check_vocab(tok, cfg, ref.path)
    st = read_st_pooling(ref.path)
    limit = min(x for x in (tok.model_max_length, getattr(cfg, "max_position_embeddings", 512), 8192) if x)
    if st and st.max_seq_length:
        limit = min(limit, st.max_seq_length)
    has_head = _has_head(cfg)
    labels = [cfg.id2label[i] for i in range(cfg.num_labels)] if has_head else None
    return Teacher(ref, model, tok, has_head, st, min(max_length or limit, limit), dev, dtype, labels,
                   cfg.num_hidden_layers, cfg.hidden_size, config=cfg, architecture=architecture,
                   model_type=cfg.model_type, fast=FastTokenizer.from_transformers(tok, ref.path), **extra)
