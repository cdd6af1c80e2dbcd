"""The Python API of kd's two stages, one call each, mirroring the CLI (`import kd`):

    import kd
    store = kd.precompute(["corpus.txt"], "emb", teachers=["minilm"])   # kd precompute corpus.txt -o emb
    model = kd.train_student(store, "runs/bilstm", arch="bilstm")       # kd train-student -s emb -o runs/bilstm
    vectors = model.encode(["a sentence", "another one"])
    result = kd.distill(["corpus.txt"], "runs/tiny3", student="tiny3")   # kd distill corpus.txt -o runs/tiny3

The keyword options are the CLI's own, under their config names (`PrecomputeJob` and `TrainConfig` fields:
`--batch-tokens` is `batch_tokens`, `--layers` is `num_layers`): the CLI builds the same config from its flags,
so both doors check, default and record the same values. Errors are KdError (what, where, fix), as the CLI
prints them. Progress bars are on as in the CLI; pass `progress=False` in notebooks or logs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kd.apps.distill.plan import Plan, estimate
from kd.apps.distill.run import DistillConfig, DistillResult
from kd.apps.distill.run import distill as _distill
from kd.common.options import known_options, path_argument, paths_argument, with_options
from kd.pipeline.job import PrecomputeJob
from kd.pipeline.precompute import precompute as _precompute
from kd.storage.store import Store
from kd.student.saved import LoadedStudent, load
from kd.student.train_config import TrainConfig
from kd.student.trainer import train

__all__ = ["distill", "precompute", "train_student"]


def precompute(inputs: str | os.PathLike | Sequence[str | os.PathLike] = (), out: str | os.PathLike | None = None,
               teachers: str | Sequence[str] = ("minilm",), **options: Any) -> Store:
    """`kd precompute`: run `teachers` (packaged names, checkpoint folders or NAME=DIR) over `inputs` once and
    write (or resume, or grow) the store at `out`; returns the store, opened and verified. Growing a store with
    only new teachers or outputs: `precompute(add_to=store, teachers=[...], outputs=[...])` (no inputs, no out)."""
    known_options(PrecomputeJob, options, "kd.precompute")
    files = paths_argument(inputs, "inputs", "kd.precompute")
    folder = None if out is None else path_argument(out, "out", "kd.precompute")
    names = paths_argument(teachers, "teachers", "kd.precompute", "a teacher name or folder, or a list of them")
    return Store.open(_precompute(files, folder, names, **options).store)


def train_student(store: Store | str | os.PathLike, out: str | os.PathLike, **options: Any) -> LoadedStudent:
    """`kd train-student`: fit a student on `store`'s teacher outputs (the teacher is never loaded) into `out`,
    resuming a run there; returns the trained student, ready to `encode`."""
    known_options(TrainConfig, options, "kd.train_student")
    root = store.root if isinstance(store, Store) else path_argument(store, "store", "kd.train_student")
    return load(train(TrainConfig(root, path_argument(out, "out", "kd.train_student"), **options)))


def distill(inputs: str | os.PathLike | Sequence[str | os.PathLike], out: str | os.PathLike,
            **options: Any) -> DistillResult | Plan:
    """`kd distill`: a corpus to a served student by a recipe (`student="tiny6"` or `recipe="my.toml"`), resuming
    a run in `out`; the result names the chosen stage, the exported model folder and the suite report. With
    `dry_run=True`: the plan with each step's measured estimate (`.table()`), and nothing written."""
    known_options(DistillConfig, options, "kd.distill")
    cfg = DistillConfig(paths_argument(inputs, "inputs", "kd.distill"), path_argument(out, "out", "kd.distill"),
                        **options)
    return estimate(cfg) if cfg.dry_run else _distill(cfg)


# help(kd.distill) and the others list every keyword with its type and default, from the configs' own fields
with_options(precompute, PrecomputeJob, ("inputs", "out", "teachers"))
with_options(train_student, TrainConfig, ("store", "out"))
with_options(distill, DistillConfig, ("inputs", "out"))
