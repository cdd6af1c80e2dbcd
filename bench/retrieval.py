"""Query latency of retrieval over a 100k-row catalogue (DSE table 4, scaled to this machine).

Run from the repository root:  python -m bench.retrieval [--rows 100000] [--sample-pairs 256]

Two comparisons, each printed as a ratio:
1. Cross-encoder vs distilled dual encoder, per query:
   - a cross-encoder must run a BERT forward over (query, row) for every row. The pair model is
     all-MiniLM-L6-v2's architecture with a one-logit head (the size of the usual MiniLM-L6
     cross-encoders); its time is MEASURED on `--sample-pairs` real (query, news sentence) pairs
     and EXTRAPOLATED linearly to all rows (labelled as such in the output);
   - a student (the SRA-sized BiLSTM, untrained: cost does not depend on the weights) embeds the
     query, then a faiss flat index over the precomputed row vectors returns the top 10.
2. Exact top-10 by cosine: DuckDB SQL (`ORDER BY array_cosine_similarity(...) LIMIT 10` on the
   store's view) vs faiss flat search on the same vectors, after checking both give the same ids.

Row vectors are synthetic (random unit vectors, dim 384): latency does not depend on their values.
Times are medians over repeats; the machine is described in the output. Threads: the cross-encoder
gets all of torch's threads (batched throughput, its best case); the single-query path (query
embedding, faiss) runs on one thread, which is fastest for one query on a small CPU (faiss
parallelises over queries, and idle OpenMP workers of torch and faiss otherwise spin against each
other); DuckDB uses its default thread pool.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from storage.index import IndexKind, make_index, normalize
from storage.manifest import Manifest
from storage.query import connect
from storage.schema import VectorDType, texts_schema, vectors_to_arrow
from storage.store import open_writer

CORPUS = Path(os.environ.get("KD_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data" / "corpus"
QUERY = "Stock markets fell sharply after the central bank raised interest rates."


def median_time(fn, repeats: int, warmup=None) -> float:
    (warmup or fn)()  # first calls pay for allocation and thread start-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def load_sentences(n: int) -> list[str]:
    lines = (CORPUS / "eng_news_2016_10K-sentences.txt").read_text(encoding="utf-8").splitlines()
    return [lines[i % len(lines)].split("\t", 1)[1] for i in range(n)]


def write_catalogue(path: Path, texts: list[str], x: np.ndarray, shard_rows: int) -> None:
    """A store with texts + one teacher table `cat.sentence`, written through the store contract."""
    n = len(texts)
    num_shards = (n + shard_rows - 1) // shard_rows
    inputs = {"fingerprint": f"bench-{n}", "num_rows": n, "rows_per_shard": shard_rows, "num_shards": num_shards}
    schema = texts_schema(False, None)
    w = open_writer(path, Manifest(inputs), "bench", overwrite=True)
    try:
        w.declare("texts", "texts", {f.name: str(f.type) for f in schema}, {})
        w.declare("teachers/cat", "teacher", {"id": "int64", "sentence": f"float[{x.shape[1]}]"}, {})
        for k in range(num_shards):
            lo, hi = k * shard_rows, min(n, (k + 1) * shard_rows)
            ids = pa.array(np.arange(lo, hi, dtype=np.int64))
            w.commit("texts", k, pa.table({
                "id": ids, "text": texts[lo:hi], "doc_id": [f"d{i}" for i in range(lo, hi)],
                "position": pa.array(np.zeros(hi - lo, dtype=np.int32)), "source": ["bench"] * (hi - lo),
            }, schema=schema))
            vecs = vectors_to_arrow(x[lo:hi], VectorDType.float32)
            w.commit("teachers/cat", k, pa.table({"id": ids, "sentence": vecs}))
        w.publish()
    finally:
        w.close()


def cross_encoder_seconds_per_pair(texts: list[str], sample: int, batch: int) -> float:
    """Measured seconds per (query, row) pair of a MiniLM-L6 pair classifier forward (CPU, fp32)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from pipeline.resolve import resolve_teacher

    hf_logging.set_verbosity_error()  # the new one-logit head's "newly initialized" notice
    path = resolve_teacher("minilm").path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
    rows = texts[:sample]

    def run(rows: list[str]) -> None:
        with torch.inference_mode():
            for s in range(0, len(rows), batch):
                part = rows[s : s + batch]
                enc = tok([QUERY] * len(part), part, truncation=True, max_length=128, padding=True,
                          return_tensors="pt")
                model(**enc)

    return median_time(lambda: run(rows), repeats=1, warmup=lambda: run(rows[:batch])) / len(rows)


def student_encoder(tmp: Path):
    """The SRA-sized BiLSTM student saved and loaded like a trained one (`student.load(dir)`)."""
    import student
    from pipeline.resolve import resolve_teacher
    from student.export import save_student
    from student.models import StudentConfig, build_student

    model = build_student(StudentConfig(arch="bilstm", vocab_size=30522, embed_dim=300, hidden_dim=512, out_dim=384))
    save_student(tmp / "student", model, [], resolve_teacher("minilm").path, {}, "bench")
    return student.load(tmp / "student")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--sample-pairs", type=int, default=256, help="pairs actually run through the cross-encoder")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import faiss
    import torch

    from pipeline.teacher import load_teacher

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU threads, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), faiss {faiss.__version__}, "
          f"GPUs for faiss: {faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0}")
    rng = np.random.default_rng(0)
    x = normalize(rng.normal(size=(args.rows, args.dim)).astype(np.float32))
    texts = load_sentences(args.rows)

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        t0 = time.perf_counter()
        index = make_index(x, IndexKind.flat)
        build_s = time.perf_counter() - t0

        # 1. cross-encoder over every row vs student query embedding + faiss
        ce_threads = torch.get_num_threads()
        per_pair = cross_encoder_seconds_per_pair(texts, args.sample_pairs, args.batch)
        ce_total = per_pair * args.rows
        torch.set_num_threads(1)
        faiss.omp_set_num_threads(1)
        st = student_encoder(tmp)
        embed_s = median_time(lambda: st.encode([QUERY]), args.repeats * 4)
        teacher = load_teacher("minilm", device="cpu")
        teacher_s = median_time(lambda: teacher.encode([QUERY]), args.repeats * 4)
        q = normalize(st.encode([QUERY]))
        faiss_s = median_time(lambda: index.search(q, 10), args.repeats * 4)
        dual = embed_s + faiss_s

        # 2. DuckDB SQL top-10 vs faiss flat on the same stored vectors
        store = tmp / "store"
        t0 = time.perf_counter()
        write_catalogue(store, texts, x, shard_rows=20_000)
        write_s = time.perf_counter() - t0
        con = connect(store)
        qv = normalize(rng.normal(size=(1, args.dim)).astype(np.float32))
        sql = (f"SELECT id FROM cat ORDER BY array_cosine_similarity(sentence, $1::FLOAT[{args.dim}]) DESC, id "
               "LIMIT 10")
        sql_ids = [r[0] for r in con.execute(sql, [qv[0].tolist()]).fetchall()]
        _, pos = index.search(qv, 10)
        assert sql_ids == pos[0].tolist(), (sql_ids, pos[0].tolist())  # same exact answer
        sql_s = median_time(lambda: con.execute(sql, [qv[0].tolist()]).fetchall(), args.repeats)
        flat_s = median_time(lambda: index.search(qv, 10), args.repeats * 4)

    n = f"{args.rows:,}"
    print(f"catalogue: {n} rows x {args.dim} (synthetic unit vectors); faiss flat build {build_s:.2f} s; "
          f"store write {write_s:.1f} s")
    print()
    print(f"1. one query against {n} rows")
    print(f"   cross-encoder (MiniLM-L6 pair forward, {ce_threads} threads): {per_pair * 1e3:.2f} ms/pair measured "
          f"on {args.sample_pairs} pairs -> EXTRAPOLATED to {n} pairs: {ce_total:,.1f} s")
    print(f"   student (BiLSTM, {st.num_parameters() / 1e6:.1f}M params) query embedding, 1 thread: "
          f"{embed_s * 1e3:.2f} ms   (teacher MiniLM-L6 query embedding: {teacher_s * 1e3:.2f} ms)")
    print(f"   faiss flat top-10 over {n} rows, 1 thread:  {faiss_s * 1e3:.2f} ms")
    print(f"   student + faiss:                             {dual * 1e3:.2f} ms")
    print(f"   ratio cross-encoder / (student + faiss):     {ce_total / dual:,.0f}x   "
          f"(teacher + faiss: {ce_total / (teacher_s + faiss_s):,.0f}x)")
    print()
    print(f"2. exact top-10 by cosine over {n} stored rows (same ids from both)")
    duck_threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    print(f"   DuckDB SQL array_cosine_similarity ORDER BY LIMIT 10 ({duck_threads} threads): {sql_s * 1e3:.1f} ms")
    print(f"   faiss flat search (1 thread, index in memory):          {flat_s * 1e3:.2f} ms")
    print(f"   ratio DuckDB / faiss:                                   {sql_s / flat_s:,.0f}x")


if __name__ == "__main__":
    main()
