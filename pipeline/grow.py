"""Growing a store in place: `kd precompute --add-to STORE` and the refusal of a store made from other inputs.

- `adopt_store_inputs`: a job with `add_to` gets the store's recorded input files and the options that shape its
  rows (the manifest's `inputs`), so adding outputs or a teacher takes only the new options. An option given
  anyway must agree with the store's: a default is indistinguishable from "not given", so only a value other than
  the default that differs from the store's is refused.
- `check_same_inputs`: before anything is loaded, a store whose fingerprint is not this run's is refused naming
  what differs (a changed or other input file, a row option with both values), with a fix that keeps the store.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from kd.common.errors import InputError, StoreError
from kd.pipeline.job import PrecomputeJob
from kd.storage import fs
from kd.storage.manifest import Manifest, comparable
from kd.storage.store import load_manifest

# The fingerprinted row options (`PrecomputeJob.input_options`' keys) and their flags.
ROW_FLAGS = {"text_column": "--text-column", "pair_columns": "--pair-columns", "label_column": "--label-column",
             "segment": "--segment", "spacy_model": "--spacy-model", "dedup": "--dedup",
             "shard_rows": "--shard-rows", "delimiter": "--delimiter", "sample": "--sample"}
# A teacher table's settings (`storage.manifest.settings`) and the flags that set them.
TEACHER_FLAGS = {"dtype": "--dtype", "precision": "--precision", "max_length": "--max-length", "backend": "--backend",
                 "quantize": "--quantize", "outputs": "--outputs", "weights_sha256": "the weights (--teacher)",
                 "config_sha256": "the config.json settings (--teacher)"}
SHOWN = 3  # differences named in one message


def adopt_store_inputs(job: PrecomputeJob) -> PrecomputeJob:
    """The job `job.add_to` asks for: the store's input files and row options, `job`'s teachers and the rest."""
    root = job.add_to or ""
    loc = fs.resolve(root)
    existing = load_manifest(loc) if fs.exists(loc) else None
    if existing is None:
        raise StoreError("--add-to names no kd store (no manifest)", root,
                         f"create it first: kd precompute INPUTS -o {root}")
    _refuse_other_options(job, existing.inputs.get("options") or {}, root)
    files = [f["path"] for f in existing.inputs.get("files", [])]
    for path in files:
        if not os.path.isfile(path):
            raise InputError("an input file of the store is missing: --add-to checks the store's inputs "
                             "(same sha256) before adding to it", path,
                             "restore the file at this path (a relative path is read from the current folder: "
                             "run where the store was made), or write a new store with a new --out")
    return dataclasses.replace(job, inputs=tuple(files), add_to=None, **_recorded_options(existing))


def _recorded_options(existing: Manifest) -> dict[str, Any]:
    """The store's row options as `PrecomputeJob` fields (--pair-columns back to its "a,b" form)."""
    opts = existing.inputs.get("options") or {}
    fields = {k: opts.get(k) for k in ROW_FLAGS if k in opts or k == "sample"}
    if fields.get("pair_columns") is not None:
        fields["pair_columns"] = ",".join(str(c) for c in fields["pair_columns"])
    return fields


def _refuse_other_options(job: PrecomputeJob, stored: dict[str, Any], root: str) -> None:
    """Refuse a row option given with --add-to (a value other than its default) that is not the store's."""
    defaults = {f.name: f.default for f in dataclasses.fields(PrecomputeJob) if f.name in ROW_FLAGS}
    given = job.input_options(job.columns())  # as fingerprinted: --pair-columns parsed
    for name, flag in ROW_FLAGS.items():
        if getattr(job, name) != defaults[name] and _plain(given.get(name)) != _plain(stored.get(name)):
            raise InputError(f"{flag}: the store has {_shown(stored.get(name))}, this run {_shown(given.get(name))}",
                             f"--add-to {root}", f"drop {flag}: --add-to reuses the store's own row options")


def check_same_inputs(existing: Manifest, header: dict, root: str, grown: bool) -> None:
    """Refuse store `existing` when its fingerprint is not `header`'s (`inputs_header`), naming the differences.
    `grown`: the run came from --add-to (its inputs are the store's own, so only a changed file can differ)."""
    if existing.fingerprint == header["fingerprint"]:
        return
    diffs = file_differences(existing.inputs.get("files") or [], header["files"]) \
        + option_differences(existing.inputs.get("options") or {}, header["options"])
    what = "; ".join(diffs[:SHOWN]) or "the fingerprint differs (a store written by another kd version?)"
    if grown:
        raise InputError(f"cannot add to the store: {what}", root,
                         "restore the input files as they were when the store was made, or write a new store from "
                         "the new files with a new --out (add --reuse STORE to copy the rows it already holds)")
    raise StoreError(f"the output folder holds a store made from other inputs or settings: {what}", root,
                     f"to add outputs or teachers to that store, pass only them: kd precompute --add-to {root} "
                     "-t TEACHER [--outputs ...] (its own inputs and row options are reused); for other inputs or "
                     f"settings use a new --out (--reuse {root} copies the rows it already holds)")


def file_differences(stored: list[dict], run: list[dict]) -> list[str]:
    """How this run's input files ({path, sha256}) differ from the store's: changed, left out, added, reordered."""
    if [f["sha256"] for f in stored] == [f["sha256"] for f in run]:
        return []
    now = {f["path"]: f["sha256"] for f in run}
    had, has = {f["sha256"] for f in stored}, {f["sha256"] for f in run}
    out = [f"{f['path']} changed since the store was made (sha256 now {now[f['path']][:12]}..., the store "
           f"recorded {f['sha256'][:12]}...)" for f in stored if now.get(f["path"], f["sha256"]) != f["sha256"]]
    changed = {f["path"] for f in stored} & set(now)
    out += [f"the store's input {f['path']} is not among this run's inputs" for f in stored
            if f["sha256"] not in has and f["path"] not in changed]
    out += [f"{f['path']} is not one of the store's inputs" for f in run
            if f["sha256"] not in had and f["path"] not in changed]
    return out or ["the same input files in another order (row order, and so the shards, follow it)"]


def option_differences(stored: dict, run: dict) -> list[str]:
    """One "FLAG: the store has X, this run Y" per row option that differs (an absent key counts as unset)."""
    keys = [k for k in ROW_FLAGS if _plain(stored.get(k)) != _plain(run.get(k))]
    keys += sorted(k for k in set(stored) | set(run) if k not in ROW_FLAGS and stored.get(k) != run.get(k))
    return [f"{ROW_FLAGS.get(k, k)}: the store has {_shown(stored.get(k))}, this run {_shown(run.get(k))}"
            for k in keys]


def teacher_differences(stored: dict, run: dict) -> str:
    """The settings in which this run's table meta of a teacher differs from the store's, as one line."""
    a, b = comparable(stored, run)
    keys = [k for k in TEACHER_FLAGS if a.get(k) != b.get(k)]
    keys += sorted(k for k in set(a) | set(b) if k not in TEACHER_FLAGS and a.get(k) != b.get(k))
    return "; ".join(f"{TEACHER_FLAGS.get(k, k)}: the store has {_shown(a.get(k))}, this run {_shown(b.get(k))}"
                     for k in keys[:SHOWN])


def _plain(value: Any) -> Any:
    """A value as the manifest's JSON holds it (tuples as lists), so a recorded and a computed one compare."""
    return json.loads(json.dumps(value))


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return repr(",".join(str(v) for v in value))
    return repr(value)
