"""A trained student on disk, and loading it back to encode texts (no store, no teacher needed).

Layout of a student folder:
    model.safetensors      "student.*" weights, plus "objectives.<i>.*" (learned heads/banks)
    config.json            format, StudentConfig, objectives, target, store fingerprint, sizes, and the
                           sha256 of the weights and of each tokenizer file (checked on every load)
    tokenizer/             the tokenizer files the student was trained with (copied from the store, or
                           from the --init student when the store lacks its teacher)
    training_args.json     the TrainConfig and what was resolved from the store
    README.md              the model card (student.model_card), written after config.json

config.json is written last, so a folder with one is complete.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import nn

from kd.common import parsing
from kd.common.attention import varying_shape_attention
from kd.common.errors import InputError
from kd.common.fast_tokenizer import FastTokenizer
from kd.common.finite import first_non_finite, require_finite_weights
from kd.common.hardware import resolve_device
from kd.common.options import path_argument
from kd.common.padding import pad_rows
from kd.common.progress import Bar
from kd.common.token_batches import default_batch_tokens, run_sorted
from kd.storage import fs
from kd.storage.names import links_out
from kd.storage.tokenizer_files import load_tokenizer  # a tokenizer only: students never load model classes
from kd.student.model_card import write_model_card  # README.md: teacher, store, objectives, how to load
from kd.student.models import Arch, Student, StudentConfig, build_student

FORMAT = "kd-student"
FORMAT_VERSION = 1
WEIGHTS, CONFIG, TOKENIZER, ARGS = "model.safetensors", "config.json", "tokenizer", "training_args.json"


def _atomic_json(path: Path, obj: Any) -> None:
    fs.atomic_write_bytes(fs.resolve(str(path.parent)), json.dumps(obj, indent=1, default=str).encode(), path.name)


def write_weights(path: Path, state: dict[str, torch.Tensor]) -> str:
    """Write a safetensors file atomically; return its sha256.

    - Serialised in memory, then written by Python: a full disk is an OSError (ENOSPC) here, where
      safetensors' own file writer can fail without raising; the old file stays whole until the rename.
    - Weights holding NaN/Inf (a diverged run) are refused before anything is written.
    """
    require_finite_weights(state, str(path), "the training diverged: lower the learning rate and train again")
    data = safetensors_bytes(state, metadata={"format": FORMAT})
    fs.atomic_write_bytes(fs.resolve(str(path.parent)), data, path.name)
    return hashlib.sha256(data).hexdigest()


def weights_state(model: Student, objectives: Sequence[nn.Module]) -> dict[str, torch.Tensor]:
    """Flat state dict: "student.*" and "objectives.<i>.*", detached, contiguous, on CPU."""
    state = {f"student.{k}": v for k, v in model.state_dict().items()}
    for i, obj in enumerate(objectives):
        state |= {f"objectives.{i}.{k}": v for k, v in obj.state_dict().items()}
    # clone: safetensors refuses tensors that share memory (e.g. views of one buffer)
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def save_student(dir: str | os.PathLike, model: Student, objectives: Sequence[nn.Module], tokenizer_dir: str,
                 train_args: dict[str, Any], store_fingerprint: str, info: dict[str, Any] | None = None) -> Path:
    """Write a loadable student folder (weights, tokenizer, arguments; config.json last)."""
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    weights_sha256 = write_weights(out / WEIGHTS, weights_state(model, objectives))
    shutil.copytree(tokenizer_dir, out / TOKENIZER, dirs_exist_ok=True)
    tokenizer_sha256 = {f.name: fs.file_sha256(f) for f in sorted((out / TOKENIZER).iterdir()) if f.is_file()}
    _atomic_json(out / ARGS, train_args)
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "student": model.config.to_dict(),
        "num_parameters": model.num_parameters(),
        "store_fingerprint": store_fingerprint,
        "weights_sha256": weights_sha256,
        "tokenizer_sha256": tokenizer_sha256,
        **(info or {}),
    }
    _atomic_json(out / CONFIG, config)

    write_model_card(out)
    return out


# A static student's calls of up to this many texts run in numpy (`_encode_static`): torch's dispatch costs
# more than one short text's work (bench/static_encode.py, fresh processes, 1 thread, STS-B test texts with
# tokenisation: 5,272 vs 4,191 texts/s at 1 text per call), while its fused embedding_bag wins on large
# batches because numpy gathers every token row first (in-process sweep, embedding only: torch ahead from
# ~16 texts a call, 3.1x at 256).
NUMPY_STATIC_TEXTS = 8


class LoadedStudent:
    """A student ready to encode: `encode(texts) -> float32 [n, out_dim]`."""

    def __init__(self, path: Path, model: Student, tokenizer, info: dict[str, Any], device: torch.device) -> None:
        self.path, self.model, self.tokenizer, self.info, self.device = path, model, tokenizer, info, device
        self._fast: FastTokenizer | None = None  # the tokenizer as training ran it (lazy)

    @property
    def config(self) -> StudentConfig:
        return self.model.config

    @property
    def dim(self) -> int:
        return self.model.config.out_dim

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def size_bytes(self) -> int:
        return (self.path / WEIGHTS).stat().st_size

    def encode(self, sentences: str | Sequence[str], batch_size: int = 128, show_progress_bar: bool | None = None,
               convert_to_numpy: bool = True, convert_to_tensor: bool = False, normalize_embeddings: bool = True,
               device: str | None = None, precision: str = "float32", **unknown: Any) -> Any:
        """Embed texts in length-sorted batches (less padding), returned in input order: sentence-transformers'
        `encode`, with its arguments' names and meanings (issue 49).

        - A single string gives one vector ([dim]), a list gives [n, dim] float32 (numpy; a torch tensor with
          `convert_to_tensor`, a list of tensors with `convert_to_numpy=False`).
        - `normalize_embeddings` (default True, as the sentence-transformers export's Normalize module does, so that
          kd's vectors and the export's are the same); `normalize` is accepted as its old name.
        - `device` moves the model there first; `show_progress_bar` shows a bar over the texts (None: off);
          `precision` is "float32" (sentence_transformers.quantization turns it into int8 or binary).
        """
        if "normalize" in unknown:
            normalize_embeddings = bool(unknown.pop("normalize"))
        if unknown:
            raise InputError(f"encode() got unknown argument(s) {', '.join(sorted(unknown))}", "LoadedStudent.encode",
                             "it takes sentence-transformers' arguments: batch_size, show_progress_bar, "
                             "convert_to_numpy, convert_to_tensor, normalize_embeddings, device, precision")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"encode(): batch_size must be a whole number >= 1, not {batch_size!r}",
                             "LoadedStudent.encode", "pass batch_size=128 (or leave it out)")
        if precision != "float32":
            raise InputError(f"precision {precision!r} is not computed by kd students", "LoadedStudent.encode",
                             "encode in float32 and quantize with sentence_transformers.quantization."
                             "quantize_embeddings(vectors, precision)")
        if device is not None and resolve_device(device) != self.device:
            self.device = resolve_device(device)
            self.model.to(self.device)
            self.__dict__.pop("_static", None)  # numpy arrays of the weights: CPU only, rebuilt when back there
        if isinstance(sentences, str):
            return self.encode([sentences], batch_size, show_progress_bar, convert_to_numpy, convert_to_tensor,
                               normalize_embeddings)[0]
        if not hasattr(sentences, "__iter__"):
            raise InputError(f"encode() takes a str or a list of str, not {type(sentences).__name__}",
                             "LoadedStudent.encode", 'pass model.encode(["a sentence", "another one"])')
        out = self._encode_all(list(sentences), batch_size, bool(show_progress_bar))
        if normalize_embeddings:
            out /= np.linalg.norm(out, axis=1, keepdims=True).clip(1e-12)
        if convert_to_tensor:
            return torch.from_numpy(out)
        return out if convert_to_numpy else list(torch.from_numpy(out))

    def _encode_all(self, texts: list[str], batch_size: int, progress: bool) -> np.ndarray:
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise InputError(f"encode() takes strings; item {bad[0]} is {type(texts[bad[0]]).__name__}",
                             "LoadedStudent.encode", "pass a list of str (drop or replace missing texts first)")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        chunk = max(len(texts), 1) if not progress else 16 * batch_size  # a bar moves once per chunk
        with Bar("encode", len(texts), "texts", progress) as bar:
            for lo in range(0, len(texts), chunk):
                self._encode_into(texts[lo : lo + chunk], batch_size, out[lo : lo + chunk])
                bar.advance(min(chunk, len(texts) - lo))
        return out

    def _encode_into(self, texts: list[str], batch_size: int, out: np.ndarray) -> None:
        ids = self._token_ids(texts)
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        if self.config.arch is Arch.static and len(texts) <= NUMPY_STATIC_TEXTS and self._static_arrays() is not None:
            self._encode_static(ids, lengths, batch_size, out)
        elif self.config.arch is Arch.static:
            self._encode_bags(ids, lengths, batch_size, out)
        else:
            self._encode_padded(ids, lengths, batch_size, out)

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        """The ids training gave these texts (common/fast_tokenizer.py): special tokens, truncated to max_length."""
        if self._fast is None:  # a copy: our truncation settings, not the shared tokenizer's
            self._fast = FastTokenizer.from_transformers(self.tokenizer, str(self.path))
        return self._fast.encode(texts, max_length=self.config.max_length, first_ids=self.config.first_ids)["input_ids"]

    def _static_arrays(self) -> tuple[np.ndarray, np.ndarray | None] | None:
        """A static student on the CPU as numpy arrays: (token table, head matrix [width, out] or None).

        None where the torch path must run (a CUDA device, a non-linear SRA head). Built once per load:
        the arrays share memory with the weights, so nothing is copied.
        """
        if not hasattr(self, "_static"):
            head = self.model.head
            linear = isinstance(head, torch.nn.Linear) and head.bias is None
            usable = self.device.type == "cpu" and (linear or isinstance(head, torch.nn.Identity))
            self._static = None if not usable else (
                self.model.embed.weight.detach().numpy(), head.weight.detach().numpy().T if linear else None)
        return self._static

    def _encode_static(self, ids: list[list[int]], lengths: np.ndarray, batch_size: int, out: np.ndarray) -> None:
        """Mean of each text's token vectors, then the head, in numpy: the same sums as `embed_bags`
        without torch's per-call dispatch, which costs more than the work itself for one short text.
        (An empty text, which a BERT tokenizer never gives because of [CLS]/[SEP], gets the zero vector.)"""
        table, head = self._static_arrays()
        for s in range(0, len(ids), batch_size):
            lens = lengths[s : s + batch_size]
            flat = np.fromiter(itertools.chain.from_iterable(ids[s : s + batch_size]), np.int64, int(lens.sum()))
            if not len(flat):
                continue
            starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
            sums = np.add.reduceat(table[flat], np.minimum(starts, len(flat) - 1), axis=0)
            counts = np.maximum(lens, 1).astype(np.float32)[:, None]  # fp32: an int64 divisor would give fp64
            vecs = np.where(lens[:, None] > 0, sums / counts, np.float32(0.0))
            out[s : s + len(lens)] = vecs if head is None else vecs @ head

    @torch.inference_mode()
    def _encode_padded(self, ids: list[list[int]], lengths: np.ndarray, batch_size: int, out: np.ndarray) -> None:
        def run(idx: np.ndarray) -> np.ndarray:
            block, mask = pad_rows([ids[i] for i in idx], self.config.pad_id)
            emb = self.model(torch.from_numpy(block).to(self.device), torch.from_numpy(mask).to(self.device),
                             layers=False).embedding
            return emb.float().cpu().numpy()

        # Token-budget batches of similar lengths, at most batch_size rows: a CPU runs 4,096-token batches faster
        # than one batch of 256 padded to its longest (docs/results.md, the frontier run of issue 26)
        budget = default_batch_tokens(self.device.type)
        with varying_shape_attention(self.device.type):  # (common/attention.py: no per-shape cuDNN plans)
            out[:] = run_sorted(lengths, budget, run, self.dim, max_batch=batch_size)

    @torch.inference_mode()
    def _encode_bags(self, ids: list[list[int]], lengths: np.ndarray, batch_size: int, out: np.ndarray) -> None:
        for s in range(0, len(ids), batch_size):
            part = ids[s : s + batch_size]
            flat = torch.from_numpy(np.concatenate([np.asarray(row, dtype=np.int64) for row in part]))
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths[s : s + batch_size])[:-1]]))
            out[s : s + len(part)] = self.model.embed_bags(flat.to(self.device), offsets.to(self.device)).float().cpu()


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    cfg_file = p / CONFIG
    fix = "point at the --out folder of a finished kd train-student run"
    if (p / "modules.json").is_file():
        fix = ("this is a sentence-transformers export: load it with kd.student.load_exported(folder) (no code "
               "from the folder runs), or point at the student folder it was exported from")
    if not cfg_file.exists():
        raise InputError("no trained student here (no config.json)", str(p), fix)
    check_received(p, "copy the student folder again, or retrain it")
    info = parsing.read_config(cfg_file, "the student folder is damaged: copy it again, or retrain with --overwrite")
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise InputError("config.json is not a kd student config", str(cfg_file), fix)
    if info.get("format_version") != FORMAT_VERSION:
        raise InputError(f"student format version {info.get('format_version')} is not supported "
                         f"(this kd reads {FORMAT_VERSION})", str(cfg_file), "use the kd version that trained it")
    _check_fields(info, cfg_file)
    return info


def check_received(folder: Path, fix: str) -> None:
    """Refuse what a student or export folder kd reads must not hold, before any of its files is read:

    - a symlink that leads out of it (`storage.names.links_out`, refused in a store too): loading would read a file
      of the receiver's (tokenizer/ linked to ~/.ssh) and an export would copy it. A Hugging Face cache snapshot
      (`models--ORG--NAME/snapshots/REV/`) is the exception: its files are links into its repository's `blobs/`;
    - anything but folders and regular files, and JSON files past their size bound or not JSON
      (`common.parsing.check_model_folder`): a named pipe blocks its reader forever, /dev/zero never ends.
    """
    link = next(links_out(str(folder), _hub_blobs(folder)), None)
    if link is not None:
        raise InputError(f"{link[0]} is a symlink that leads out of the folder (to {link[1]})", str(folder / link[0]),
                         f"replace the link by the file it points to (e.g. cp -rL), or {fix}")
    parsing.check_model_folder(folder, fix, InputError)


def _hub_blobs(folder: Path) -> list[str]:
    """The `blobs/` folder of the Hugging Face cache repository whose snapshot holds `folder`, else none."""
    real = folder.resolve()
    for p in (real, *real.parents):
        if p.parent.name == "snapshots" and (p.parent.parent / "blobs").is_dir():
            return [str(p.parent.parent / "blobs")]
    return []


def _check_fields(info: dict[str, Any], cfg_file: Path) -> None:
    """The fields loading reads have their types: an edited config.json is refused here, by name, instead of
    failing with a traceback somewhere in the loading."""
    fix = "the student folder is damaged or edited: copy it again as kd wrote it, or retrain the student"
    if not isinstance(info.get("student"), dict):
        raise InputError("config.json has no student settings (a 'student' object)", str(cfg_file), fix)
    toks = info.get("tokenizer_sha256") or {}
    if not isinstance(toks, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in toks.items()):
        raise InputError("config.json's tokenizer_sha256 is not a map of file names to checksums", str(cfg_file),
                         fix)


def load(path: str | os.PathLike, device: str | torch.device = "cpu") -> LoadedStudent:
    """Rebuild a student from its folder (weights checked strictly against the config)."""
    p = Path(path_argument(path, "path", "kd.student.load"))
    if not isinstance(device, str | torch.device):
        raise InputError(f"kd.student.load(): device must be a str or torch.device, not {device!r}",
                         "kd.student.load", 'pass device="cpu", "cuda" or "cuda:N"')
    info = read_config(p)
    model = fitted_student(p, info)
    dev = resolve_device(device)
    model.to(dev).eval()
    return LoadedStudent(p, model, student_tokenizer(p, info), info, dev)


def fitted_student(path: Path, info: dict[str, Any]) -> Student:
    """The student a folder's config.json (`info`, from `read_config`) describes, holding the folder's checked
    weights; an InputError when they do not fit it."""
    state = _verified_weights(path, info)
    try:
        cfg = StudentConfig.from_dict(info["student"], str(path / CONFIG))
        return build_to_fit(lambda: build_student(cfg),
                            {k[len("student."):]: v for k, v in state.items() if k.startswith("student.")})
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise InputError(f"the weights do not fit the student described by config.json ({str(e)[:300]})",
                         str(path), "config.json and model.safetensors come from different runs: copy the whole "
                         "folder again") from e


def build_to_fit(build: Callable[[], nn.Module], state: dict[str, torch.Tensor]) -> nn.Module:
    """`build()` with `state` loaded; a ValueError when their names or shapes differ.

    - Built first on the meta device (no memory): the sizes a config file gives (vocabulary, widths, layers)
      are compared with the weights on disk before anything is allocated, so a damaged or forged config
      asking for 10**12 rows is refused instead of exhausting memory.
    """
    with torch.device("meta"):
        skeleton = build()
    want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in state.items()}
    if want != have:
        diff = sorted(set(want.items()) ^ set(have.items()))[:3]
        raise ValueError(f"the config and the weights differ in names or shapes, first: {diff}")
    model = build()
    model.load_state_dict(state)
    return model


def damaged_file(path: str | os.PathLike) -> Path | None:
    """The first file of a student folder that is not as training wrote it (config.json unreadable, the weights or a
    tokenizer file missing or not of the sha256 config.json records), or None: what `load` refuses, found without
    loading anything (kd distill trains such a stage again: the load's "retrain it" had no spelling there)."""
    p = Path(path)
    try:
        info = read_config(p)
    except InputError:
        return p / CONFIG
    recorded = {WEIGHTS: info.get("weights_sha256"),
                **{f"{TOKENIZER}/{n}": sha for n, sha in (info.get("tokenizer_sha256") or {}).items()}}
    return next((p / rel for rel, sha in recorded.items()
                 if not (p / rel).is_file() or fs.file_sha256(p / rel) != sha), None)


def _verified_weights(p: Path, info: dict[str, Any]) -> dict[str, torch.Tensor]:
    """model.safetensors, refused unless config.json records its sha256 and the file has it (damage,
    tampering: every kd version that writes students records it), and unless every weight is finite."""
    w = p / WEIGHTS
    if not w.is_file():
        raise InputError("the student folder has no model.safetensors", str(p), "copy the whole folder again")
    if not isinstance(info.get("weights_sha256"), str):
        raise InputError("config.json records no weights_sha256, so the weights cannot be checked (a student "
                         "folder written by kd always carries it: this one was edited or made by hand)",
                         str(p / CONFIG), "ask for the folder as kd wrote it, or retrain the student")
    if fs.file_sha256(w) != info["weights_sha256"]:
        raise InputError("model.safetensors does not match the checksum in config.json (damaged or modified)",
                         str(w), "copy the student folder again, or retrain it")
    try:
        state = load_file(str(w))
    except Exception as e:  # safetensors raises its own error types for truncated/garbled headers
        raise InputError(f"model.safetensors cannot be read ({e})", str(w), "copy the folder again") from e
    bad = first_non_finite(state)
    if bad is not None:  # a run that diverged before kd checked weights on save: every vector would be NaN
        raise InputError(f"the student's weights hold NaN/Inf values ({bad}): its training diverged", str(w),
                         "retrain it with a lower learning rate")
    return state


def student_tokenizer(p: Path, info: dict[str, Any]):
    """The student folder's tokenizer, its files checked against the sha256 config.json records (students
    written before kd recorded them load unchecked): a tokenizer/ swapped or damaged would map every text to
    other embedding rows without any error."""

    folder = p / TOKENIZER
    if not folder.is_dir():
        raise InputError("the student folder has no tokenizer/ folder", str(folder),
                         "copy the whole student folder (weights, config.json and tokenizer/)")
    for name, sha in (info.get("tokenizer_sha256") or {}).items():
        if not (folder / name).is_file() or fs.file_sha256(folder / name) != sha:
            raise InputError(f"tokenizer/{name} does not match the checksum in config.json (missing, damaged or "
                             "replaced)", str(folder / name), "copy the whole student folder again, or retrain it")
    return load_tokenizer(folder, "copy the whole student folder again", InputError)
