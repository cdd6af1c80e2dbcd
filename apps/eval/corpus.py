"""The small real corpus bundled for `kd demo` (apps/eval/data/demo_corpus.tsv.gz).

Built once by `build_demo_corpus` from ../shared/data/corpus, deterministically (seeded sample):
- 1,500 Leipzig news 2016 sentences, 1,500 Leipzig Wikipedia 2016 sentences;
- 1,500 Brown corpus sentences (detokenised), 1,500 WordNet 3.0 glosses (definitions);
kept only when 30-300 characters long, deduplicated. One `source TAB sentence` a line, gzip'ed.
Sources and licences: apps/eval/data/README.md.
"""

from __future__ import annotations

import csv
import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np

from kd.apps.eval import tasks

DEMO_CORPUS = Path(__file__).with_name("data") / "demo_corpus.tsv.gz"
SOURCES = ("leipzig-news", "leipzig-wikipedia", "brown", "wordnet-glosses")


def _leipzig(name: str) -> list[str]:
    lines = tasks.data_path(f"corpus/eng_{name}_2016_10K-sentences.txt").read_text(encoding="utf-8").splitlines()
    return [line.split("\t", 1)[1].strip() for line in lines if "\t" in line]


def _brown() -> list[str]:
    with open(tasks.data_path("corpus/brown_sentences.tsv"), encoding="utf-8", newline="") as f:
        return [tasks.detokenize_brown(r["sentence"]) for r in csv.DictReader(f, delimiter="\t",
                                                                                quoting=csv.QUOTE_NONE)]


def _wordnet() -> list[str]:
    with open(tasks.data_path("corpus/wordnet30_glosses.tsv"), encoding="utf-8", newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [r["definition"].strip() for r in rows if r["definition"]]


def build_demo_corpus(out: Path = DEMO_CORPUS, per_source: int = 1500, seed: int = 0) -> Path:
    """Sample `per_source` sentences of 30-300 characters from each source and write the gzip."""
    readers = {"leipzig-news": lambda: _leipzig("news"), "leipzig-wikipedia": lambda: _leipzig("wikipedia"),
               "brown": _brown, "wordnet-glosses": _wordnet}
    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    lines = []
    for source in SOURCES:
        pool = [s.replace("\t", " ") for s in dict.fromkeys(readers[source]()) if 30 <= len(s) <= 300]
        picked = 0
        for i in rng.permutation(len(pool)):
            if picked == per_source:
                break
            if pool[i] not in seen:
                seen.add(pool[i])
                lines.append(f"{source}\t{pool[i]}")
                picked += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same sample gives byte-identical files.
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))
    return out


@lru_cache(maxsize=1)
def demo_corpus() -> tuple[tuple[str, str], ...]:
    """(source, sentence) rows of the bundled corpus, in file order (sources interleaved by block)."""
    with gzip.open(DEMO_CORPUS, "rt", encoding="utf-8") as f:
        return tuple(tuple(line.rstrip("\n").split("\t", 1)) for line in f if "\t" in line)  # type: ignore[misc]


def demo_sentences() -> list[str]:
    """The bundled sentences, round-robin over sources so any prefix mixes all four."""
    by_source: dict[str, list[str]] = {}
    for source, text in demo_corpus():
        by_source.setdefault(source, []).append(text)
    cols = list(by_source.values())
    return [c[i] for i in range(max(map(len, cols))) for c in cols if i < len(c)]
