"""Retrieval per query over a real catalogue: cross-encoder vs teacher + faiss vs student + faiss (DSE table 4).

Run from the repository root (a store with teacher `sentence` vectors, e.g. bench/out/store-frontier, and a
trained kd student):

    python -m bench.retrieval --store bench/out/store-frontier --student bench/out/kd-static \
        [--rows 100000] [--ce-pairs 2000] [--threads 2]

The catalogue is the store's first `--rows` real texts. Three ways to answer one query, all on `--threads`
torch/faiss threads, the same queries (STS-B test sentences, not in the catalogue):
1. cross-encoder: a MiniLM-L6 forward over (query, row) for every row (all-MiniLM-L6-v2 with a one-logit
   head, the size of the usual MiniLM cross-encoders). Its time is MEASURED on `--ce-pairs` (query, row)
   pairs, length-sorted and batched like the bi-encoder side, and EXTRAPOLATED linearly to all rows (at
   most 50x; printed);
2. teacher + faiss: the teacher embeds the query; faiss flat over the store's teacher vectors. The
   catalogue's embedding cost is the teacher's rate on `--embed-sample` catalogue texts, extrapolated;
3. student + faiss: the kd student embeds the query; faiss flat over the student's vectors of the whole
   catalogue (embedded here, timed, not extrapolated). Quality cost of the student: overlap of its top-10
   with the teacher's top-10 for the same queries.
So the gain from precomputing (1 vs 2) and the gain from the student (2 vs 3) are separate ratios.
Then exact top-10 by cosine: DuckDB SQL on the store's view vs faiss flat on the same vectors (same ids).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from kd.dataset.index import IndexKind, make_index, normalize
from kd.dataset.query import connect, view_names
from kd.storage.schema import arrow_to_vectors
from kd.storage.store import Store

STSB_TEST = Path(os.environ.get("KD_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data" / "stsb" \
    / "sts-test.csv"


def median_time(fn, repeats: int, warmup=None) -> float:
    (warmup or fn)()  # first calls pay for allocation and thread start-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def queries(n: int) -> list[str]:
    """Real query sentences from STS-B test (first sentence of each pair)."""
    lines = STSB_TEST.read_text(encoding="utf-8").splitlines()
    return list(dict.fromkeys(line.split("\t")[5] for line in lines))[:n]


def catalogue(store: Store, teacher: str, rows: int) -> tuple[list[str], np.ndarray]:
    """The store's first `rows` texts and the teacher's stored `sentence` vectors for them (id-aligned)."""
    texts = store.read_table("texts", ["id", "text"])
    vecs = store.read_table(f"teachers/{teacher}", ["id", "sentence"])
    assert texts["id"].equals(vecs["id"]), "texts and teacher rows are stored in the same order"
    return texts["text"].to_pylist()[:rows], arrow_to_vectors(vecs["sentence"])[:rows]


def cross_encoder_seconds(query: str, rows: list[str], batch: int) -> float:
    """Measured seconds for a MiniLM-L6 pair classifier over (query, row) for `rows`: length-sorted batches
    (as kd and sentence-transformers batch their bi-encoder), CPU, fp32, the current torch threads."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from kd.pipeline.teacher.resolve import resolve_teacher

    hf_logging.set_verbosity_error()  # the new one-logit head's "newly initialized" notice
    path = resolve_teacher("minilm").path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
    ordered = sorted(rows, key=len)

    def run(part_rows: list[str]) -> None:
        with torch.inference_mode():
            for s in range(0, len(part_rows), batch):
                part = part_rows[s : s + batch]
                enc = tok([query] * len(part), part, truncation=True, max_length=256, padding=True,
                          return_tensors="pt")
                model(**enc)

    run(ordered[:batch])  # warm-up: allocation and thread start-up
    t0 = time.perf_counter()
    run(ordered)
    return time.perf_counter() - t0


def per_query(encode, index, qs: list[str], k: int = 10) -> tuple[float, np.ndarray]:
    """Median seconds of embed-one-query + faiss top-k over `qs`, and the top-k ids per query."""
    encode([qs[0]])  # warm-up
    times, hits = [], []
    for q in qs:
        t0 = time.perf_counter()
        v = normalize(np.asarray(encode([q]), dtype=np.float32))
        _, ids = index.search(v, k)
        times.append(time.perf_counter() - t0)
        hits.append(ids[0])
    return statistics.median(times), np.stack(hits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="a store with the teacher's `sentence` vectors")
    ap.add_argument("--teacher", default="minilm", help="the store's teacher (and the query encoder)")
    ap.add_argument("--student", required=True, help="a trained kd student folder")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--ce-pairs", type=int, default=2000, help="pairs actually run through the cross-encoder")
    ap.add_argument("--embed-sample", type=int, default=2000, help="catalogue texts the teacher embeds, timed")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import faiss
    import torch

    from kd import student
    from kd.pipeline.backends.loading import load_teacher

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    load = os.getloadavg()
    store = Store.open(args.store)
    texts, tvecs = catalogue(store, args.teacher, args.rows)
    n, qs = len(texts), queries(args.queries)
    if n > 50 * args.ce_pairs or n > 50 * args.embed_sample:
        raise SystemExit(f"--rows {n} would extrapolate more than 50x from --ce-pairs/--embed-sample")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {load[0]:.2f}; {args.threads} "
          f"threads for torch and faiss; torch {torch.__version__}, faiss {faiss.__version__}", flush=True)

    # 1. cross-encoder: every (query, row) pair
    rng = np.random.default_rng(0)
    sample = [texts[i] for i in rng.choice(n, min(args.ce_pairs, n), replace=False)]
    ce_s = cross_encoder_seconds(qs[0], sample, args.batch)
    ce_total = ce_s / len(sample) * n

    # 2. teacher + faiss over the store's vectors
    teacher = load_teacher(args.teacher, device="cpu")
    t_index = make_index(normalize(tvecs), IndexKind.flat)
    t_query, t_hits = per_query(lambda x: teacher.encode(x)["sentence"], t_index, qs)
    part = [texts[i] for i in rng.choice(n, min(args.embed_sample, n), replace=False)]
    t0 = time.perf_counter()
    teacher.encode(part)
    t_catalogue = (time.perf_counter() - t0) / len(part) * n

    # 3. student + faiss over the student's vectors of the whole catalogue
    st = student.load(args.student)
    t0 = time.perf_counter()
    svecs = st.encode(texts, batch_size=256)
    s_catalogue = time.perf_counter() - t0
    s_index = make_index(normalize(np.asarray(svecs, dtype=np.float32)), IndexKind.flat)
    s_query, s_hits = per_query(st.encode, s_index, qs)
    overlap = float(np.mean([len(set(a) & set(b)) / a.size for a, b in zip(s_hits, t_hits)]))

    # 4. DuckDB SQL top-10 vs faiss flat over every stored teacher vector
    con = connect(args.store)
    view = view_names(store.manifest)[f"teachers/{args.teacher}"]
    all_v = arrow_to_vectors(store.read_table(f"teachers/{args.teacher}", ["sentence"])["sentence"])
    ids = store.read_table(f"teachers/{args.teacher}", ["id"])["id"].to_numpy()
    full = make_index(normalize(all_v), IndexKind.flat)
    qv = normalize(np.asarray(teacher.encode([qs[1]])["sentence"], dtype=np.float32))
    dim = all_v.shape[1]
    sql = (f"SELECT id FROM {view} ORDER BY array_cosine_similarity(sentence, $1::FLOAT[{dim}]) DESC, id LIMIT 10")
    sql_ids = [r[0] for r in con.execute(sql, [qv[0].tolist()]).fetchall()]
    _, pos = full.search(qv, 10)
    assert sql_ids == ids[pos[0]].tolist(), (sql_ids, ids[pos[0]].tolist())  # the same exact answer
    sql_s = median_time(lambda: con.execute(sql, [qv[0].tolist()]).fetchall(), args.repeats)
    flat_s = median_time(lambda: full.search(qv, 10), args.repeats * 4)

    t_total, s_total = t_query, s_query
    print(f"\ncatalogue: {n:,} real texts of {args.store}; {len(qs)} STS-B test queries (medians)\n")
    print("| per query | latency | catalogue embedding, once | top-10 overlap with teacher + faiss |")
    print("|---|---|---|---|")
    print(f"| cross-encoder over all {n:,} rows (**extrapolated** {n / len(sample):.0f}x from {len(sample):,} "
          f"measured pairs) | {ce_total:,.1f} s | none | - |")
    print(f"| teacher ({args.teacher}) query embedding + faiss flat | {t_total * 1e3:.1f} ms | {t_catalogue:,.0f} s "
          f"(**extrapolated** {n / len(part):.0f}x from {len(part):,} texts) | 1.00 |")
    print(f"| kd student ({st.info['student']['arch']}) query embedding + faiss flat | {s_total * 1e3:.2f} ms | "
          f"{s_catalogue:,.1f} s (measured) | {overlap:.2f} |")
    print(f"\ngain from precomputing (cross-encoder / teacher + faiss): **{ce_total / t_total:,.0f}x**; "
          f"gain from the student (teacher + faiss / student + faiss): **{t_total / s_total:,.1f}x** per query, "
          f"{t_catalogue / s_catalogue:,.0f}x for the catalogue")
    duck_threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    print(f"\nexact top-10 by cosine over all {len(ids):,} stored rows (same ids from both): DuckDB SQL "
          f"({duck_threads} threads) {sql_s * 1e3:.1f} ms, faiss flat ({args.threads} threads) {flat_s * 1e3:.2f} ms: "
          f"**{sql_s / flat_s:,.0f}x**")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
