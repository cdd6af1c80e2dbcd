"""The models an evaluation compares, behind one interface: texts in, float32 vectors out.

- teacher: `pipeline.backends.loading.load_teacher` (only `apps` may load a teacher), one output column;
- student: `student.load(dir)`;
- baseline: a model2vec static model distilled from the teacher, when model2vec is importable.
Models load lazily, so a teacher whose numbers all come from the store is never loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from kd import student
from kd.apps.eval.speed import SizeResult, model_size
from kd.common.cache import cache_dir
from kd.common.errors import InputError
from kd.common.inputs import require_regular_file
from kd.pipeline.backends.loading import load_teacher
from kd.pipeline.teacher.resolve import TeacherSpec, parse_teacher

EncodeFn = Callable[[list[str]], np.ndarray]


class Kind(str, Enum):
    teacher = "teacher"
    student = "student"
    baseline = "baseline"


@dataclass
class Loaded:
    encode: EncodeFn  # one batch of texts -> [n, dim] float32
    module: object | None  # torch module, to count parameters
    files: list[Path]  # what inference needs on disk (files or folders), for megabytes


@dataclass
class EvalModel:
    """A named model that loads on first use and encodes unique texts once per call."""

    name: str
    kind: Kind
    loader: Callable[[], Loaded]
    _loaded: Loaded | None = field(default=None, repr=False)

    @property
    def loaded(self) -> Loaded:
        if self._loaded is None:
            self._loaded = self.loader()
        return self._loaded

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        """One call on exactly these texts (what speed measurements time)."""
        return np.asarray(self.loaded.encode(list(texts)), dtype=np.float32)

    def encode(self, texts: list[str], batch_size: int = 256, progress: Callable[[int], None] | None = None
               ) -> np.ndarray:
        """Vectors for `texts` in order; duplicates are encoded once."""
        uniq = list(dict.fromkeys(texts))
        parts = []
        for i in range(0, len(uniq), batch_size):
            parts.append(self.encode_batch(uniq[i : i + batch_size]))
            if progress:
                progress(min(batch_size, len(uniq) - i))
        vecs = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
        pos = {t: i for i, t in enumerate(uniq)}
        return vecs[[pos[t] for t in texts]]

    def size(self) -> SizeResult | None:
        return model_size(self.loaded.files, self.loaded.module)


def teacher_model(spec: str | TeacherSpec, target: str | None = None, name: str | None = None) -> EvalModel:
    """A teacher checkpoint (alias, directory or NAME=PATH) giving its `target` output."""
    spec = parse_teacher(spec)

    def load() -> Loaded:
        t = load_teacher(spec)
        out = target or ("sentence" if t.st is not None else "mean")
        outputs = [o for o in t.available() if o.value == out]
        if not outputs:
            raise InputError(f"teacher {t.name} has no output {out!r}", str(spec),
                             f"pick one of: {', '.join(o.value for o in t.available())}")
        return Loaded(lambda texts: t.encode(texts, outputs)[out], t.model, [Path(t.ref.path)])

    return EvalModel(name or spec.name, Kind.teacher, load)


def student_model(folder: str | Path, name: str | None = None) -> EvalModel:
    """A student saved by `kd train-student` (student.saved)."""

    def load() -> Loaded:
        from kd.student.saved import CONFIG, TOKENIZER, WEIGHTS  # lazy: torch; kd eval imports none before a model

        s = student.load(folder)
        files = [Path(folder) / f for f in (WEIGHTS, CONFIG, TOKENIZER)]
        return Loaded(lambda texts: s.encode(texts, batch_size=max(1, len(texts))), s.model, files)

    return EvalModel(name or Path(folder).resolve().name, Kind.student, load)


def model2vec_available() -> bool:
    return importlib.util.find_spec("model2vec") is not None


def model2vec_baseline(teacher_dir: str | Path, pca_dims: int = 256) -> EvalModel:
    """model2vec distilled from the teacher's checkpoint (the static-embedding baseline).

    Distilling runs the teacher over its whole vocabulary (minutes on a CPU), so the result is
    cached under the kd cache ($KD_CACHE or ~/.cache/kd) keyed by the checkpoint path and reused.
    """

    def load() -> Loaded:
        from model2vec import StaticModel

        key = hashlib.sha256(f"{Path(teacher_dir).resolve()}:{pca_dims}".encode()).hexdigest()[:16]
        folder = cache_dir() / "model2vec" / key
        if (folder / "config.json").exists():
            m = StaticModel.from_pretrained(str(folder))
        else:
            from model2vec.distill import distill

            m = distill(model_name=str(teacher_dir), pca_dims=pca_dims)
            m.save_pretrained(str(folder))
        return Loaded(lambda texts: m.encode(texts), None, [folder])

    return EvalModel("model2vec", Kind.baseline, load)


def model2vec_folder(folder: str | Path, name: str = "model2vec") -> EvalModel:
    """A model2vec model saved by `StaticModel.save_pretrained` (e.g. distilled in another venv)."""

    from kd.student.saved import check_received  # lazy: torch, as above
    from kd.student.st_load import check_listing  # lazy: torch, as above

    if not Path(folder).is_dir():
        raise InputError("--baseline-dir is not a folder (missing, or a file)", str(folder), M2V_AGAIN)
    # model2vec reads its configs whole and follows links: the folder is checked as a received export is, when it
    # is named (before any model loads), so a broken one stops the run rather than leaving a cell "not measured"
    check_received(Path(folder), M2V_AGAIN)
    check_listing(Path(folder))
    if not model2vec_available():  # (its import inside the evaluation was a ModuleNotFoundError traceback)
        raise InputError("--baseline-dir needs model2vec, which is not installed in this environment", str(folder),
                         "pip install model2vec (or kd's bench extra: pip install 'kd[bench]'), or leave "
                         "--baseline-dir out")
    _check_model2vec_files(Path(folder))

    def load() -> Loaded:
        from model2vec import StaticModel

        try:
            m = StaticModel.from_pretrained(str(folder))
        except (SafetensorError, OSError, ValueError, KeyError) as e:  # what the check above cannot foresee
            raise InputError(f"model2vec cannot load --baseline-dir ({str(e)[:300]})", str(folder), M2V_AGAIN) from e
        return Loaded(lambda texts: m.encode(texts), None, [Path(folder)])

    return EvalModel(name, Kind.baseline, load)


M2V_AGAIN = "point --baseline-dir at the folder StaticModel.save_pretrained wrote (copy it again)"


def _check_model2vec_files(folder: Path) -> None:
    """The files model2vec will read, checked when the folder is named: model2vec opens its weights and takes one
    tensor by name unchecked, so weights that were a folder or another model's ended in safetensors' traceback
    (issue 48's probe). Its own table of layouts says which files those are."""
    try:
        from model2vec.persistence.datamodels import FOLDER_LAYOUTS
    except ImportError:  # no model2vec here: loading says so; another version's layout: `load` maps its errors
        return
    layout = next((lay for lay in (x.with_parent(folder) for x in FOLDER_LAYOUTS) if lay.is_valid()), None)
    if layout is None:
        raise InputError("--baseline-dir is not a model2vec model (no model.safetensors, tokenizer.json and config "
                         "side by side)", str(folder), M2V_AGAIN)
    for path in (layout.embeddings, layout.config, layout.tokenizer):
        try:
            require_regular_file(str(path), f"the baseline's {path.name}")
        except InputError as e:
            raise InputError(e.what, e.where, M2V_AGAIN) from None
    name = "embedding.weight" if layout.is_sentence_transformers else "embeddings"
    try:
        with safe_open(str(layout.embeddings), framework="numpy") as f:  # the header only: nothing is allocated
            shape = f.get_slice(name).get_shape() if name in f.keys() else None
    except (SafetensorError, OSError) as e:
        raise InputError(f"the baseline's weights cannot be read ({str(e)[:300]})", str(layout.embeddings),
                         M2V_AGAIN) from e
    if shape is None or len(shape) != 2:
        raise InputError(f"the baseline's weights hold no token table ({name!r} of 2 dimensions): not a model2vec "
                         "model's file", str(layout.embeddings), M2V_AGAIN)
