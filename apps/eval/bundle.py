"""Build the evaluation sets shipped inside the package (apps/eval/data) from ../shared/data.

- `stsb-{dev,test}.tsv.gz`: the STS Benchmark files as they are (genre, file, year, id, score, s1, s2);
- `sst2-probe.tsv.gz`: the probe's seeded 4,000-sentence train sample and the full dev split
  (`split TAB label TAB text`);
- `cluster-{news-articles,brown-genres,brown-documents}.tsv.gz`: each clustering set at its default size and seed
  (`split TAB group TAB text`);
- `lee-docsim.tsv.gz`: the 50 Lee documents, each with its row of the symmetric human similarity matrix;
- `retrieval-news-titles.tsv.gz`: 1,000 news titles and their articles' leads (`title TAB lead`).
MRPC is not bundled: its licence is non-commercial, so `kd eval` reads it from the shared data when present.
The files are gzip'ed with mtime 0, so the same inputs give byte-identical files; a test checks that
the bundle equals what the shared data gives. Rebuild with `python -m apps.eval.bundle`.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from kd.apps.eval import tasks


def _write(path: Path, lines: list[str]) -> None:
    bad = [line for line in lines if "\n" in line or "\r" in line]
    if bad:
        raise ValueError(f"{path.name}: a text holds a line break: {bad[0][:80]!r}")
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))


def _rows(split: str, labels, texts: list[str]) -> list[str]:
    out = []
    for y, t in zip(labels, texts):
        if "\t" in t:
            raise ValueError(f"a text holds a tab: {t[:80]!r}")
        out.append(f"{split}\t{int(y)}\t{t}")
    return out


def build_bundle(out: Path = tasks.BUNDLE) -> list[Path]:
    """Write every bundled evaluation file from the shared data; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for split in ("dev", "test"):
        src = tasks.data_path(f"stsb/sts-{split}.csv").read_text(encoding="utf-8").splitlines()
        _write(out / f"stsb-{split}.tsv.gz", [line for line in src if line.strip()])
        written.append(out / f"stsb-{split}.tsv.gz")
    sst = tasks.load_sst2(train_rows=4000, seed=0, bundle=False)
    _write(out / "sst2-probe.tsv.gz", _rows("train", sst.train_labels, sst.train_texts)
           + _rows("test", sst.test_labels, sst.test_texts))
    written.append(out / "sst2-probe.tsv.gz")
    for name in tasks.ClusterSet:
        c = tasks.load_cluster_set(name, bundle=False)
        _write(out / f"cluster-{name.value}.tsv.gz", _rows("dev", c.dev_groups, c.dev_texts)
               + _rows("test", c.test_groups, c.test_texts))
        written.append(out / f"cluster-{name.value}.tsv.gz")
    return written + [_lee(out), _retrieval(out)]


def _tab_free(*texts: str) -> list[str]:
    bad = [t for t in texts if "\t" in t]
    if bad:
        raise ValueError(f"a text holds a tab: {bad[0][:80]!r}")
    return list(texts)


def _lee(out: Path) -> Path:
    """Each Lee document with its row of the (symmetric) human similarity matrix: `doc TAB s_1 ... TAB s_50`."""
    lee = tasks.load_lee(bundle=False)
    _write(out / "lee-docsim.tsv.gz", ["\t".join(_tab_free(d) + [repr(float(v)) for v in row])
                                       for d, row in zip(lee.docs, lee.sims)])
    return out / "lee-docsim.tsv.gz"


def _retrieval(out: Path) -> Path:
    """The title-retrieval sample: `title TAB lead`, query i's relevant document on line i."""
    r = tasks.load_title_retrieval(bundle=False)
    _write(out / "retrieval-news-titles.tsv.gz", ["\t".join(_tab_free(q, d)) for q, d in zip(r.queries, r.docs)])
    return out / "retrieval-news-titles.tsv.gz"


if __name__ == "__main__":
    for p in build_bundle():
        print(f"{p} ({p.stat().st_size / 1e3:.0f} kB)")
