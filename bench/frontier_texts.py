"""The frontier corpus's texts as one Parquet column, for a GPU machine that has no spaCy: the news articles split
by kd's segmenter (spaCy's sentencizer, as `kd precompute --segment sentences`), then bench/corpus.py's sources;
exact duplicates dropped in first-seen order (kd's --dedup keeps the first too).

    python bench/frontier_texts.py ../shared/data/corpus/news_articles.csv frontier.jsonl texts.parquet
"""

from __future__ import annotations

import csv
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from kd.pipeline.segment import load_segmenter


def main(articles: str, extra: str, out: str) -> None:
    csv.field_size_limit(1 << 30)
    with open(articles, newline="", encoding="utf-8") as f:
        docs = [r["text"] for r in csv.DictReader(f)]
    sentences = (s.text for doc in load_segmenter(None).pipe(docs, batch_size=256) for s in doc.sents)
    with open(extra, encoding="utf-8") as f:
        others = [json.loads(line)["text"] for line in f]
    texts = list(dict.fromkeys(t.strip() for t in [*sentences, *others] if t.strip()))
    pq.write_table(pa.table({"text": texts}), out, compression="zstd")
    print(f"{len(docs):,} articles: {len(texts):,} texts")


if __name__ == "__main__":
    main(*sys.argv[1:4])
