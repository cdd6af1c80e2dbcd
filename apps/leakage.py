"""Leakage check: which store rows are evaluation texts (STS-B, SST-2, the clustering sets)?

A student distilled on the very sentences it is evaluated on has seen its teacher's answer for
them; its scores would flatter it. The check:
- normalises texts (Unicode NFKC, lower-case, whitespace collapsed) on both sides;
- compares every store text (both sides of a pair) with each evaluation set `kd eval` uses by default
  (STS-B dev + test, the SST-2 probe's train sample and dev split, the news and Brown clustering sets);
- reports, per set, how many of its texts occur in the store and how many store rows they cover, and
  returns the ids of every overlapping row, which `kd train-student --exclude-ids` then leaves out of
  training and validation (streaming: nothing is rewritten).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kd.apps.eval import tasks
from kd.apps.leakage_config import LeakageConfig
from kd.common.errors import InputError
from kd.common.options import with_options
from kd.common.outputs import claim_output, write_text
from kd.storage.store import Store


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text)).strip().lower()


def eval_sets() -> dict[str, list[str]]:
    """The texts of every default evaluation set (bundled with the package)."""
    out = {}
    for split in ("dev", "test"):
        sts = tasks.load_stsb(split)
        out[f"stsb-{split}"] = sts.a + sts.b
    sst = tasks.load_sst2()
    out["sst2-probe-train"], out["sst2-dev"] = sst.train_texts, sst.test_texts
    for name in tasks.ClusterSet:
        c = tasks.load_cluster_set(name)
        out[f"cluster-{name.value}"] = c.dev_texts + c.test_texts
    out["lee"] = tasks.load_lee().docs
    r = tasks.load_title_retrieval()
    out["retrieval-news-titles"] = r.queries + r.docs
    try:  # MRPC is never bundled (its licence): its test split is left out where the shared data has it
        m = tasks.load_mrpc("test")
        out["mrpc-test"] = m.a + m.b
    except InputError:
        pass
    return out


@dataclass
class Overlap:
    """Per evaluation set: its size, texts found in the store, store rows they cover; all row ids."""

    sets: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # name -> (texts, found, rows)
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rows: int = 0

    def write_ids(self, path: str | Path, overwrite: bool = False) -> None:
        claim_exclude_out(path, overwrite)
        write_text(path, "# kd leakage: store rows that are evaluation texts\n"
                   + "".join(f"{i}\n" for i in self.ids.tolist()), "kd leakage", "--exclude-out")


def claim_exclude_out(path: str | Path, overwrite: bool = False, store: str | None = None) -> None:
    """--exclude-out is a new file, or one kd wrote with `overwrite`; never inside a store (common.outputs)."""
    claim_output(path, "kd leakage", inputs=[store], overwrite=overwrite, file=True, flag="--exclude-out")


def check_store(store_path: str, sets: dict[str, list[str]] | None = None, **options: Any) -> Overlap:
    """`leakage` of the store at `store_path`; `options` are `LeakageConfig`'s fields (exclude_out, overwrite)."""
    return leakage(LeakageConfig(store_path, **options), sets)


with_options(check_store, LeakageConfig, ("store",))  # help(check_store) lists the config's keywords


def leakage(cfg: LeakageConfig, sets: dict[str, list[str]] | None = None) -> Overlap:
    """Overlap of a store's texts with evaluation sets (`eval_sets` by default; see the module docstring); with
    `cfg.exclude_out` the overlapping ids are written there (the path checked before the work)."""
    store_path, exclude_out, overwrite = cfg.store, cfg.exclude_out, cfg.overwrite
    if exclude_out is not None:
        claim_exclude_out(exclude_out, overwrite, store_path)
    store = Store.open(store_path, content=True)
    sets = eval_sets() if sets is None else sets
    wanted = {name: {normalise(t) for t in texts} for name, texts in sets.items()}
    cols = ["text_a", "text_b"] if store.manifest.pairs else ["text"]
    hits: dict[str, set[str]] = {n: set() for n in sets}
    rows_per_set = dict.fromkeys(sets, 0)
    bad_ids = []
    for k in sorted(store.require_complete("texts").shards):
        t = store.read_shard("texts", k, ["id", *cols])
        ids = t["id"].to_numpy()
        norm = [[normalise(x) for x in t[c].to_pylist()] for c in cols]
        for i in range(t.num_rows):
            texts = [side[i] for side in norm]
            found = [n for n, w in wanted.items() if any(x in w for x in texts)]
            for n in found:
                rows_per_set[n] += 1
                hits[n].update(x for x in texts if x in wanted[n])
            if found:
                bad_ids.append(ids[i])
    out = Overlap({n: (len(wanted[n]), len(hits[n]), rows_per_set[n]) for n in sets},
                  np.unique(np.asarray(bad_ids, dtype=np.int64)), store.manifest.inputs.get("num_rows", 0))
    if exclude_out is not None:
        out.write_ids(exclude_out, overwrite)
    return out
