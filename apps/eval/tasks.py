"""Evaluation tasks read from the shared real data (../shared/data, or $KD_SHARED/data).

- STS-B pairs with gold similarity, or any scored pair file (`load_pairs`);
- SST-2 sentences with binary labels (linear probe);
- clustering sets built here from raw corpora with honest gold groups (see docs/eval.md):
  `news-articles` (sentences grouped by the article they come from) and `brown-genres`
  (5-sentence Brown passages grouped by genre).
Every sample is drawn with a fixed seed, so two runs and two models see the same items.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from kd.common.bounds import StsSplit, check_choice
from kd.common.errors import InputError
from kd.common.inputs import extra_fields_error, require_regular_file

# Long news articles come close to csv's default 128 KiB field limit; lift it so no real file is refused.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

# The default evaluation sets ship with the package (built from ../shared/data by apps.eval.bundle), so
# `kd eval` and `kd demo` work on any machine; other splits, sizes and seeds read the shared data.
BUNDLE = Path(__file__).with_name("data")


def shared_data_dir() -> Path:
    """The shared data folder: $KD_SHARED/data, else ../shared/data next to the repository."""
    env = os.environ.get("KD_SHARED")
    if env:
        return Path(env) / "data"
    repo = Path(__file__).resolve().parents[2]  # kd/apps/eval/tasks.py -> kd
    for base in (repo.parent, Path.cwd().parent, Path.cwd()):
        if (base / "shared" / "data").is_dir():
            return base / "shared" / "data"
    return repo.parent / "shared" / "data"


def data_path(rel: str | Path) -> Path:
    """A path under the shared data folder (absolute paths pass through); must exist."""
    p = Path(rel)
    if not p.is_absolute() and not p.exists():
        p = shared_data_dir() / p
    if not p.exists():
        raise InputError(f"data file not found: {rel}", str(p),
                         "set KD_SHARED to the folder that holds data/, or pass an absolute path")
    return p


@dataclass(frozen=True)
class PairTask:
    """Sentence pairs with a gold similarity score per pair."""

    name: str
    a: list[str]
    b: list[str]
    scores: np.ndarray

    def head(self, n: int | None) -> PairTask:
        if n is None or n >= len(self.a):
            return self
        return PairTask(self.name, self.a[:n], self.b[:n], self.scores[:n])


@dataclass(frozen=True)
class LabelledTexts:
    """Texts with one class label each (train and test splits of a probe task)."""

    name: str
    train_texts: list[str]
    train_labels: np.ndarray
    test_texts: list[str]
    test_labels: np.ndarray


@dataclass(frozen=True)
class ClusterTask:
    """Texts with gold group ids, split into dev (to tune the cut) and test (to score it)."""

    name: str
    dev_texts: list[str]
    dev_groups: np.ndarray
    test_texts: list[str]
    test_groups: np.ndarray


def bundled(name: str) -> Path:
    """A file of the evaluation sets shipped inside the package (apps/eval/data, see its README)."""
    return BUNDLE / name


def _numbered_tsv(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every non-empty line of a TSV (optionally gzip'ed)."""
    # Quoting off: STS-B and SST-2 contain unbalanced quotes that csv would otherwise join across lines.
    # utf-8-sig: MRPC starts with a byte-order mark that would otherwise stick to the first column name.
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(reader.line_num, row) for row in reader if row]


def _read_tsv(path: Path) -> list[list[str]]:
    return [row for _, row in _numbered_tsv(path)]


def check_sts_split(split: str) -> None:
    """Refuse an STS-B split name before any file is looked for (a missing file would blame KD_SHARED)."""
    check_choice("--sts-split", split, StsSplit, "STS-B split")


def load_stsb(split: str = "dev", path: str | Path | None = None) -> PairTask:
    """STS Benchmark: TSV without header; columns 4, 5, 6 are score (0-5), sentence1, sentence2.

    Some rows carry two extra licence columns after sentence2; they are ignored.
    """
    check_sts_split(split)
    if path is None and bundled(f"stsb-{split}.tsv.gz").exists():
        p = bundled(f"stsb-{split}.tsv.gz")
    else:
        p = data_path(path or f"stsb/sts-{split}.csv")
    a, b, s = [], [], []
    for i, row in enumerate(_read_tsv(p)):
        if len(row) < 7:
            raise InputError(f"STS-B row {i + 1} has {len(row)} columns, expected at least 7", str(p))
        s.append(float(row[4]))
        a.append(row[5])
        b.append(row[6])
    return PairTask(f"stsb-{split}", a, b, np.asarray(s, dtype=np.float64))


# Column-name pairs that hold the two texts in common pair files, tried in order.
KNOWN_TEXT_COLUMNS = (("sentence1", "sentence2"), ("text_a", "text_b"), ("s1", "s2"),
                      ("#1 String", "#2 String"), ("question1", "question2"), ("premise", "hypothesis"))


def load_pairs(
    path: str | Path, score_column: str, text_columns: tuple[str, str] | None = None
) -> PairTask:
    """A generic scored pair file: .jsonl, .csv or TSV (anything else), read with quoting off for TSV.

    - `score_column` a header name, or a 0-based index for files without a header;
    - `text_columns` the two text columns (names or indexes); by default a known name pair
      (sentence1/sentence2, text_a/text_b, ...) or, for an index score, the two columns after it.
    - Refused, naming the file and line: a file without pairs, a row without the columns, a gold score
      that is not a finite number (a NaN would make every Spearman correlation undefined).
    """
    p = data_path(path)
    require_regular_file(str(p), "the pair file")  # a named pipe blocks the read, /dev/zero never ends
    by_index = score_column.isdigit()
    try:
        header, rows = _pair_rows(p, by_index)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"cannot read the pair file ({e})", str(p), "pass a UTF-8 .jsonl, .csv or TSV file") from e
    if not rows:
        raise InputError("the pair file holds no pairs", str(p), "pass a file with one scored pair a line")
    if by_index:
        if text_columns and not all(c.isdigit() for c in text_columns):
            raise InputError(f"--score-column {score_column} is a column's index (a file without a header) and "
                             f"--text-columns {','.join(text_columns)} names columns", str(p),
                             "give all three as indexes (--text-columns 0,1) or all as names")
        key_s = int(score_column)
        key_a, key_b = (int(c) for c in text_columns) if text_columns else (key_s + 1, key_s + 2)
    else:
        if score_column not in header:
            raise InputError(f"no column {score_column!r} (columns: {header})", str(p), "pass --score-column")
        if text_columns is None:
            text_columns = next((c for c in KNOWN_TEXT_COLUMNS if c[0] in header and c[1] in header), None)
            if text_columns is None:
                raise InputError(f"cannot tell which columns hold the two texts (columns: {header})", str(p),
                                 "pass --text-columns A,B")
        absent = [c for c in text_columns if c not in header]
        if absent:  # else every row is "KeyError: '0'"
            raise InputError(f"no column {absent[0]!r} (columns: {header})", str(p),
                             "pass --text-columns A,B naming two of these columns")
        key_s, (key_a, key_b) = score_column, text_columns
    scores, a, b = [], [], []
    for line, r in rows:
        try:
            score, ta, tb = float(r[key_s]), str(r[key_a]), str(r[key_b])
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise InputError(f"cannot read the score/text columns of this row ({type(e).__name__}: {e})",
                             f"{p}:{line}", "check --score-column and --text-columns") from None
        if r[key_a] is None or r[key_b] is None:  # a short CSV row, a JSON null
            raise InputError("a text of this pair is missing", f"{p}:{line}", "fix or remove that row")
        if not math.isfinite(score):
            raise InputError(f"the gold score {r[key_s]!r} is not a finite number", f"{p}:{line}",
                             "fix or remove that row (a pair without a gold score cannot be scored)")
        scores.append(score)
        a.append(ta)
        b.append(tb)
    return PairTask(p.stem, a, b, np.asarray(scores, dtype=np.float64))


def _pair_rows(p: Path, by_index: bool) -> tuple[list[str], list[tuple[int, Any]]]:
    """(header, [(line number, row)]) of a pair file; rows are dicts by column name, or lists by index."""
    if p.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(p.read_text(encoding="utf-8-sig").splitlines(), 1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except (ValueError, RecursionError) as e:
                    raise InputError(f"invalid JSON ({e})", f"{p}:{n}", "each line must be one JSON object") from None
        return (list(rows[0][1]) if rows and isinstance(rows[0][1], dict) else []), rows
    if p.suffix == ".csv" and not by_index:
        with open(p, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            rows = [(reader.line_num, r) for r in reader]
        for n, r in rows:  # DictReader keeps a row's extra fields under None: a text cut at an unquoted comma
            if None in r:
                raise extra_fields_error(len(r) - 1 + len(r[None]), len(reader.fieldnames or []), ",", f"{p}:{n}")
        return list(reader.fieldnames or []), rows
    raw = _numbered_tsv(p)
    if by_index or not raw:
        return [], raw
    header = raw[0][1]
    for n, r in raw[1:]:
        if len(r) > len(header):
            raise extra_fields_error(len(r), len(header), "\t", f"{p}:{n}")
    return header, [(n, dict(zip(header, r))) for n, r in raw[1:]]


def load_sst2(train_rows: int = 4000, seed: int = 0, bundle: bool = True) -> LabelledTexts:
    """SST-2 (SentEval copy: `text TAB label`): a seeded sample of train, and the full dev split.

    The train split is phrase-level (67k rows); a few thousand are enough for a linear probe and
    keep the cost of encoding them small.
    """
    if bundle and (train_rows, seed) == (4000, 0) and bundled("sst2-probe.tsv.gz").exists():
        return _read_labelled(bundled("sst2-probe.tsv.gz"))

    def read(name: str) -> tuple[list[str], np.ndarray]:
        rows = _read_tsv(data_path(f"sst2/{name}"))
        return [r[0].strip() for r in rows], np.asarray([int(r[1]) for r in rows], dtype=np.int64)

    tr_x, tr_y = read("sentiment-train")
    te_x, te_y = read("sentiment-dev")
    pick = np.sort(np.random.default_rng(seed).permutation(len(tr_x))[: min(train_rows, len(tr_x))])
    return LabelledTexts("sst2", [tr_x[i] for i in pick], tr_y[pick], te_x, te_y)


class ClusterSet(str, Enum):
    """Clustering sets with gold groups built from the shared corpora."""

    news_articles = "news-articles"
    brown_genres = "brown-genres"
    brown_documents = "brown-documents"


# A Brown document is its file's opening sentences up to this many words: ~520 BERT tokens, past the longest
# max length of the suite's models (mpnet 384, MiniLM 256), so every model truncates and shows what it makes of
# the part it reads; the whole files (~2,000 words) would only make the bundle 5x larger.
DOCUMENT_WORDS = 400


# End punctuation (optionally followed by a closing quote), space, then a capital, digit or quote.
_SENT_SPLIT = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"']))\s+(?=[\"'A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Rule-based sentence split (end punctuation + space + capital); enough for news prose."""
    return [s.strip() for s in _SENT_SPLIT.split(text) if s.strip()]


def detokenize_brown(sentence: str) -> str:
    """Undo the Brown corpus' tokenisation (`` '' quotes, spaces before punctuation)."""
    s = sentence.replace("``", '"').replace("''", '"')
    s = re.sub(r" ([.,;:!?)])", r"\1", s)
    s = re.sub(r"\( ", "(", s)
    s = re.sub(r' " ([^"]*?) "', r' "\1"', s)
    return s.strip()


def _split_groups(groups: dict[str, list[str]], n_dev: int, n_test: int, per_group: int, seed: int) -> ClusterTask:
    """Seeded choice of groups for dev and test (disjoint) and of `per_group` items in each."""
    rng = np.random.default_rng(seed)
    names = sorted(g for g, items in groups.items() if len(items) >= per_group)
    order = [names[i] for i in rng.permutation(len(names))]
    if len(order) < n_dev + n_test:
        n_dev, n_test = len(order) // 3, len(order) - len(order) // 3

    def take(chosen: list[str]) -> tuple[list[str], np.ndarray]:
        texts, ids = [], []
        for gid, g in enumerate(chosen):
            items = groups[g]
            for j in np.sort(rng.choice(len(items), per_group, replace=False)):
                texts.append(items[j])
                ids.append(gid)
        return texts, np.asarray(ids, dtype=np.int64)

    dev = take(order[:n_dev])
    test = take(order[n_dev : n_dev + n_test])
    return ClusterTask("", dev[0], dev[1], test[0], test[1])


def news_article_groups(min_chars: int = 40, max_chars: int = 300) -> dict[str, list[str]]:
    """Sentences of each news article (corpus/news_articles.csv), keyed by article id."""
    p = data_path("corpus/news_articles.csv")
    groups: dict[str, list[str]] = {}
    with open(p, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            # '"?' is how this copy of the data renders curly quotes and dashes.
            text = row["text"].replace('"?', '"')
            sents = [s for s in split_sentences(text) if min_chars <= len(s) <= max_chars]
            groups[row["article_id"]] = list(dict.fromkeys(sents))
    return groups


def _brown_files() -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each Brown file's sentences in order, and its genre."""
    with open(data_path("corpus/brown_sentences.tsv"), encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    by_file: dict[str, list[str]] = defaultdict(list)
    genre: dict[str, str] = {}
    for r in rows:
        by_file[r["file_id"]].append(detokenize_brown(r["sentence"]))
        genre[r["file_id"]] = r["category"]
    return by_file, genre


def brown_genre_groups(passage: int = 5) -> dict[str, list[tuple[str, str]]]:
    """Passages of `passage` consecutive Brown sentences, keyed by file, tagged with the genre."""
    by_file, genre = _brown_files()
    return {f: [(genre[f], " ".join(s[i : i + passage])) for i in range(0, len(s) - passage + 1, passage)]
            for f, s in by_file.items()}


def brown_documents(words: int = DOCUMENT_WORDS) -> dict[str, list[tuple[str, str]]]:
    """Each Brown file as one document (its opening whole sentences up to `words` words), tagged with the genre:
    the shape brown_genre_groups gives, one item a file."""
    by_file, genre = _brown_files()
    out = {}
    for f, sentences in by_file.items():
        taken, n = [], 0
        for sentence in sentences:
            if n >= words:
                break
            taken.append(sentence)
            n += len(sentence.split())
        out[f] = [(genre[f], " ".join(taken))]
    return out


def load_cluster_set(
    name: ClusterSet | str = ClusterSet.news_articles, scale: float = 1.0, seed: int = 0, bundle: bool = True
) -> ClusterTask:
    """Build a clustering set with dev/test splits that share no source document.

    - news-articles: 100 dev + 200 test articles (× scale), 6 sentences each, group = article.
    - brown-genres: Brown files split 1:2 into dev/test, 4 passages of 5 sentences per file,
      group = genre (15 genres); files never straddle the split.
    - brown-documents: the same split, each file one document of DOCUMENT_WORDS words, group = genre: the
      suite's long-document task.
    """
    name = ClusterSet(name)
    if bundle and (scale, seed) == (1.0, 0) and bundled(f"cluster-{name.value}.tsv.gz").exists():
        return _read_cluster(name.value, bundled(f"cluster-{name.value}.tsv.gz"))
    if name is ClusterSet.news_articles:
        task = _split_groups(news_article_groups(), max(2, int(100 * scale)), max(2, int(200 * scale)), 6, seed)
        return ClusterTask(name.value, task.dev_texts, task.dev_groups, task.test_texts, task.test_groups)
    documents = name is ClusterSet.brown_documents
    files = brown_documents() if documents else brown_genre_groups()
    rng = np.random.default_rng(seed)
    per_file = 1 if documents else 4
    names = sorted(f for f, p in files.items() if len(p) >= per_file)
    names = [names[i] for i in rng.permutation(len(names))]
    keep = max(6, int(len(names) * scale))
    names = names[:keep]
    genres = sorted({files[f][0][0] for f in names})
    gid = {g: i for i, g in enumerate(genres)}
    out: dict[str, tuple[list[str], list[int]]] = {"dev": ([], []), "test": ([], [])}
    for i, f in enumerate(names):
        split = "dev" if i % 3 == 0 else "test"
        for j in np.sort(rng.choice(len(files[f]), per_file, replace=False)):
            g, text = files[f][j]
            out[split][0].append(text)
            out[split][1].append(gid[g])
    return ClusterTask(name.value, out["dev"][0], np.asarray(out["dev"][1]), out["test"][0], np.asarray(out["test"][1]))


def _split_rows(path: Path, splits: tuple[str, str]) -> list[tuple[list[str], np.ndarray]]:
    """A bundled `split TAB label TAB text` file as (texts, int64 labels) for each of `splits`."""
    rows = _read_tsv(path)
    return [([r[2] for r in rows if r[0] == sp], np.asarray([int(r[1]) for r in rows if r[0] == sp], dtype=np.int64))
            for sp in splits]


def _read_labelled(path: Path) -> LabelledTexts:
    (tr_x, tr_y), (te_x, te_y) = _split_rows(path, ("train", "test"))
    return LabelledTexts("sst2", tr_x, tr_y, te_x, te_y)


def _read_cluster(name: str, path: Path) -> ClusterTask:
    (dev_x, dev_g), (te_x, te_g) = _split_rows(path, ("dev", "test"))
    return ClusterTask(name, dev_x, dev_g, te_x, te_g)


# --- the suite beyond STS-B: MRPC, Lee document similarity, title -> article retrieval -----------------------------

MRPC_SPLITS = ("train", "test")


def load_mrpc(split: str = "test") -> PairTask:
    """MRPC (`Quality TAB #1 ID TAB #2 ID TAB #1 String TAB #2 String`, with a header): scores are the 0/1 labels.

    Never bundled (its licence is non-commercial), so it always reads the shared data: a missing file raises
    `InputError` ("data file not found", fix: set KD_SHARED), which the suite reports as "not run".
    """
    if split not in MRPC_SPLITS:
        raise InputError(f"unknown MRPC split {split!r}", "load_mrpc", f"use one of {', '.join(MRPC_SPLITS)}")
    p = data_path(f"mrpc/msr_paraphrase_{split}.txt")
    rows = _numbered_tsv(p)
    a, b, y = [], [], []
    for line, r in rows[1:]:
        if len(r) != 5 or r[0] not in ("0", "1"):
            raise InputError(f"MRPC row has {len(r)} columns or label {r[0]!r}, expected 5 and 0/1", f"{p}:{line}")
        y.append(float(r[0]))
        a.append(r[3])
        b.append(r[4])
    return PairTask(f"mrpc-{split}", a, b, np.asarray(y, dtype=np.float64))


@dataclass(frozen=True)
class DocSimTask:
    """Documents with a symmetric human similarity matrix (1 on the diagonal)."""

    name: str
    docs: list[str]
    sims: np.ndarray


def _symmetric(upper: np.ndarray) -> np.ndarray:
    """The full matrix from one whose upper triangle holds the values (the Lee file leaves the lower one 0)."""
    return np.triu(upper) + np.triu(upper, 1).T


def load_lee(bundle: bool = True) -> DocSimTask:
    """Lee et al. 2005: 50 news documents (lee.cor, latin-1, one a line) and the mean human similarity of every
    pair (similarities0-1.txt, upper triangle)."""
    if bundle and bundled("lee-docsim.tsv.gz").exists():
        rows = _read_tsv(bundled("lee-docsim.tsv.gz"))
        docs = [r[0] for r in rows]
        sims = np.asarray([[float(v) for v in r[1:]] for r in rows], dtype=np.float64)
    else:
        lines = data_path("lee-docsim/lee.cor").read_text(encoding="latin-1").splitlines()
        docs = [d.strip() for d in lines if d.strip()]
        sims = np.loadtxt(data_path("lee-docsim/similarities0-1.txt"), dtype=np.float64)
    if sims.shape != (len(docs), len(docs)):
        raise InputError(f"Lee matrix is {sims.shape} for {len(docs)} documents", "lee-docsim")
    return DocSimTask("lee", docs, _symmetric(sims))


@dataclass(frozen=True)
class RetrievalTask:
    """Queries and documents where query i's only relevant document is document i."""

    name: str
    queries: list[str]
    docs: list[str]

    def head(self, n: int) -> RetrievalTask:
        return RetrievalTask(self.name, self.queries[:n], self.docs[:n])


RETRIEVAL_ARTICLES = 1000  # the bundled sample's size
RETRIEVAL_SENTENCES = 3  # an article is embedded as its lead: models truncate long texts anyway
RETRIEVAL_MIN_LEAD = 100


def _article_leads(sentences: int) -> list[tuple[str, str]]:
    """(title, lead) of every article whose title and lead are unique and non-empty, in file order.

    A title or lead shared by two articles is dropped from both: with two "relevant" articles the only-one
    relevance of the task would be false. Leads under 100 characters are page furniture ("March 20", "- -").
    """
    with open(data_path("corpus/news_articles.csv"), encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    # '"?' is how this copy of the data renders curly quotes and dashes.
    pairs = [(" ".join(r["title"].replace('"?', '"').split()),
              " ".join(split_sentences(r["text"].replace('"?', '"'))[:sentences])) for r in rows]
    titles, leads = Counter(t for t, _ in pairs), Counter(lead for _, lead in pairs)
    return [(t, lead) for t, lead in pairs
            if t and len(lead) >= RETRIEVAL_MIN_LEAD and titles[t] == 1 and leads[lead] == 1]


def load_title_retrieval(n: int = RETRIEVAL_ARTICLES, seed: int = 0, bundle: bool = True) -> RetrievalTask:
    """News titles retrieving their own article's lead (first 3 sentences) among `n` articles.

    The sample is the first `n` of a seeded permutation of the eligible articles, so a smaller `n` is a prefix
    of the bundled 1,000 and needs no shared data.
    """
    if bundle and seed == 0 and n <= RETRIEVAL_ARTICLES and bundled("retrieval-news-titles.tsv.gz").exists():
        rows = _read_tsv(bundled("retrieval-news-titles.tsv.gz"))
        return RetrievalTask("news-titles", [r[0] for r in rows], [r[1] for r in rows]).head(n)
    pairs = _article_leads(RETRIEVAL_SENTENCES)
    pick = np.random.default_rng(seed).permutation(len(pairs))[:n]
    return RetrievalTask("news-titles", [pairs[i][0] for i in pick], [pairs[i][1] for i in pick])
