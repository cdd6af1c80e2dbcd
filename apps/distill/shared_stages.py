"""Stages shared between `kd distill` runs on one store: a run on another run's store (`--store OTHER/store`) copies
each stage OTHER has finished with the same key instead of training it again. The presets share stages on
purpose (tiny3's first two stages are tiny6's), so trying a second preset after the first pays only for
the stages that differ, as `--store` already spares it the teacher pass.

A stage's key hashes everything its weights depend on, so equal keys mean the copy is the stage that training would
give, byte for byte (training is deterministic: tests/apps/test_distill.py):
- its `kd train-student` options, less the ones that only say where to write and how to report;
- what it starts from: the key of the stage it names, or, for a role, that role's tables in the store;
- the store's tables it reads (their records: shard checksums, settings) and its per-model files; the leakage
  exclusion as a yes/no (it is a function of the store's texts, so the same store gives the same rows);
- the code and the runtime: a digest of kd's own source files, torch's version and the thread count (a reduction
  split over another number of threads changes the last bits).
Anything not in the key is not shared: a run from other code trains its stages again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from kd.apps.distill import step_files
from kd.apps.distill.recipe import is_stage_name
from kd.storage.manifest import teacher_table
from kd.storage.names import first_link
from kd.storage.store import Store
from kd.student import saved
from kd.student.trainer import killed_before_a_checkpoint

# TrainConfig fields that do not change the weights: where the stage is written and how a run reports and resumes.
NOT_IN_KEY = ("out", "progress", "resume", "overwrite")


@functools.cache
def code_digest() -> str:
    """sha256 over kd's own Python source: the package root's modules and its subpackages' (the folders with an
    __init__.py: tests, benches and docs have none)."""
    root = Path(__file__).resolve().parents[2]  # kd/apps/distill/shared_stages.py -> kd
    subs = sorted(d for d in root.iterdir() if (d / "__init__.py").is_file())
    files = sorted(root.glob("*.py")) + sorted(p for sub in subs for p in sub.rglob("*.py"))
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def runtime() -> dict[str, Any]:
    import torch

    return {"kd": code_digest(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def store_tables(store: Path, models: list[str]) -> dict[str, Any]:
    """What a stage reads from the store: each model's table record and per-model files (init layers, vocab)."""

    m = Store.open(store).manifest
    files = m.extras.get("files", {})
    return {"store": str(store.resolve()), "fingerprint": m.fingerprint,
            **{name: {"table": m.tables[teacher_table(name)].to_json() if teacher_table(name) in m.tables else None,
                      "files": {f: v for f, v in sorted(files.items()) if f.startswith(f"teachers/{name}/")}}
               for name in sorted(set(models))}}


def stage_key(options: dict[str, Any], source_key: str | None, reads: dict[str, Any]) -> str:
    """The key of a stage trained with `options` (TrainConfig.to_json()), from the stage keyed `source_key` (None:
    from a role, whose tables `reads` holds), on the store tables `reads` (store_tables)."""
    opts = {k: v for k, v in options.items() if k not in NOT_IN_KEY}
    opts["init"] = source_key
    opts["exclude_ids"] = opts.get("exclude_ids") is not None
    record = {"options": opts, "reads": reads, "runtime": runtime()}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def recorded_paths(folder: Path) -> tuple[Path, ...]:
    """What the train step records of its stage folder (distill.json's "files"): its config.json, which holds the
    sha256 of its weights and tokenizer files (`saved.damaged_file`), and those tokenizer files."""
    return folder / saved.CONFIG, folder / saved.TOKENIZER


def finished_stage(owner: Path, state: object, key: str) -> Path | None:
    """The stage folder of the run in `owner` (its distill.json, read unchecked: `state`) finished with this key, if
    any (a record of another shape has none: a list there was a traceback in every run beside it, a probe)."""
    if not isinstance(state, dict):
        return None
    stages, done = state.get("stages"), state.get("done")
    if not isinstance(stages, dict) or not isinstance(done, list):
        return None
    for name, rec in stages.items():
        # another run's record is no checked input: a stage named "../../x" there had a folder outside both runs copied
        # as this run's stage (a probe); one whose files are not as trained is no finished stage
        if is_stage_name(name) and isinstance(rec, dict) and rec.get("key") == key and f"train stage {name}" in done:
            folder = owner / "stages" / name
            if _as_trained(owner, folder, step_files.recorded(state, f"train stage {name}")):
                return folder
    return None


def _as_trained(owner: Path, folder: Path, recorded: step_files.Record | None) -> bool:
    """A stage folder of `owner` with its files as training wrote them: inside the run, no link on the way or in it
    (a stages/ link had a folder outside the run copied), the run's record of it what the train step records of those
    files now (an edited config.json was copied as the same stage, and so it was under a record left out, emptied or
    another stage's: probes), weights and tokenizer as its config.json records."""
    real = folder.resolve()
    if real != owner.resolve() / "stages" / folder.name or first_link(folder) is not None:
        return False
    if recorded != step_files.record(owner, recorded_paths(folder)):
        return False
    return (folder / "model.safetensors").is_file() and saved.damaged_file(folder) is None


def untouched(folder: Path) -> bool:
    """Nothing to resume in `folder`: absent, or what a kill before the first checkpoint leaves (a lock, the first
    metrics), which a copied stage may replace."""
    return not folder.exists() or killed_before_a_checkpoint(folder)


def copy_stage(src: Path, dst: Path) -> None:
    """src's finished stage as dst, whole or not at all: copied beside it, then renamed into place."""
    tmp = dst.with_name(f".{dst.name}.copy")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(".kd-*", "checkpoint.pt"))
    if dst.exists():
        shutil.rmtree(dst)  # untouched(): a lock and first metrics at most
    os.replace(tmp, dst)
