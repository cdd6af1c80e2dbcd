"""The trainer's reader on a store of millions of rows: rows/s (checksums verified) and RSS over time.

    python -m bench.reader_scale write --rows 2000000 --out /tmp/readerscale     # once (~1.6 GB)
    python -m bench.reader_scale read --store /tmp/readerscale [--json out.json]

write: a synthetic store through kd's own writer (`storage.store.open_writer`: atomic shard commits, sha256 in the
  manifest), sharded as `kd precompute` shards (20,000 rows a shard by default):
  - `texts`: short random sentences (3-14 words of a 200-word list), content-hash ids (`common.ids.row_ids`,
    the ids kd precompute gives), doc_id/position/source as precompute writes them;
  - `teachers/minilm`: a random unit 384-d `sentence` vector per row, float16 (kd's `--dtype float16`);
  - MiniLM's real tokenizer files, checksummed in the manifest (the reader tokenizes with them).
read: one epoch through the trainer's data path (`student.data.build_plan`, then `train_batches`: verified shard
  reads, block shuffle, tokenization to 128 tokens, batches of 64, num_workers 0 as `kd train-student`'s
  default) in this process, for the objective column `minilm.sentence`:
  - every shard read is counted through `Store.read_verified` (sha256 checked against the manifest);
  - a thread samples this process's RSS (psutil) and the load average every second;
  - prints plan seconds, epoch rows/s (wall, and per second of this process's CPU time: on a busy machine the
    latter is what one free core gives), RSS start / peak / end and at each quarter of the epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from kd.common.ids import row_ids
from kd.storage.manifest import Manifest
from kd.storage.schema import VectorDType, texts_schema, type_name, vector_type, vectors_to_arrow
from kd.storage.store import Store, open_writer

DIM, TEACHER = 384, "minilm"
WORDS = ("the a of to and in is was for on that with as by at from this be are were have has not it his her "
         "their they we you one all new more after first two time year years people world government city "
         "state country market company news team game season music film school water power police report "
         "study health money family house road river war life work day week night home group party court "
         "million percent share price rose fell said says told made found took gave used called known left "
         "began led won lost came went saw made set put kept held ran grew fell rose paid sold bought built "
         "big small old young long short high low good bad early late local national public private major "
         "last next other many few most least only same different important possible large red green blue "
         "north south east west first second third final free open full human natural political economic "
         "social military financial medical legal private general special recent former current united").split()


# --- write ------------------------------------------------------------------------------------------------------

def _texts(rng: np.random.Generator, n: int) -> list[str]:
    lengths = rng.integers(3, 15, size=n)
    words = rng.integers(0, len(WORDS), size=(n, 14))
    return [" ".join(WORDS[w] for w in row[:m]) for row, m in zip(words, lengths)]


def _vectors(rng: np.random.Generator, n: int) -> pa.Array:
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return vectors_to_arrow(x, VectorDType.float16)


def _tokenizer_files() -> dict[str, bytes]:
    """MiniLM's tokenizer files (the packaged teacher's), as kd precompute saves them into a store."""
    from transformers import AutoTokenizer

    from kd.pipeline.teacher.resolve import resolve_teacher

    tok = AutoTokenizer.from_pretrained(resolve_teacher("minilm").path)
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        return {f"tokenizers/{TEACHER}/{f}": (Path(tmp) / f).read_bytes() for f in sorted(os.listdir(tmp))}


def write(out: str, rows: int, shard_rows: int, seed: int) -> None:
    """Write the synthetic store (see the module docstring); shard k holds rows [k * shard_rows, ...)."""
    from kd.pipeline.engines.shards import record_files

    shards = -(-rows // shard_rows)
    header = Manifest(inputs={"fingerprint": f"reader-scale-{rows}-{shard_rows}-{seed}", "num_rows": rows,
                              "rows_per_shard": shard_rows, "num_shards": shards, "pairs": False})
    w = open_writer(out, header, "writer-00000-of-00001", overwrite=True)
    schema = texts_schema(False, None)
    vec = type_name(vector_type((DIM,), VectorDType.float16))
    try:
        w.declare("texts", "texts", {f.name: type_name(f.type) for f in schema}, {"pairs": False})
        w.declare(f"teachers/{TEACHER}", "teacher", {"id": "int64", "sentence": vec},
                  {"synthetic": True, "dim": DIM, "dtype": "float16"})
        record_files(w, _tokenizer_files())
        rng, seen = np.random.default_rng(seed), set()
        t0 = time.perf_counter()
        for k in range(shards):
            n = min(shard_rows, rows - k * shard_rows)
            texts = _texts(rng, n)
            ids = row_ids(texts)  # content hashes; a text repeated across shards is made unique below
            while dup := [i for i, x in enumerate(ids.tolist()) if x in seen]:
                for i in dup:
                    texts[i] += " again"
                ids = row_ids(texts)
            seen.update(ids.tolist())
            n_ids = pa.array(ids, pa.int64())
            w.commit("texts", k, pa.table({"id": n_ids, "text": texts, "doc_id": [f"d{i}" for i in ids],
                                           "position": pa.array(np.zeros(n, np.int32)),
                                           "source": ["synthetic"] * n}, schema=schema))
            w.commit(f"teachers/{TEACHER}", k, pa.table({"id": n_ids, "sentence": _vectors(rng, n)}))
            print(f"shard {k + 1}/{shards} ({(k + 1) * shard_rows / (time.perf_counter() - t0):,.0f} rows/s)",
                  file=sys.stderr, end="\r")
        w.publish()
    finally:
        w.close()
    size = sum(p.stat().st_size for p in Path(out).rglob("*.parquet"))
    print(f"\nwrote {rows:,} rows in {shards} shards to {out}: {size / 1e9:.2f} GB Parquet")


# --- read -------------------------------------------------------------------------------------------------------

class Sampler(threading.Thread):
    """RSS (MB) of this process, the 1-minute load average and the rows read so far, every `every` seconds."""

    def __init__(self, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        import psutil

        self.proc, self.every, self.rows = psutil.Process(), every, 0
        self.samples: list[tuple[float, int, float, float]] = []  # (t, rows, rss MB, load)
        self.halt = threading.Event()
        self.sample()

    def sample(self) -> None:
        self.samples.append((time.perf_counter(), self.rows, self.proc.memory_info().rss / 2**20, os.getloadavg()[0]))

    def run(self) -> None:
        """Sample every `every` s; every 30 samples also print a line (a long, starved run shows progress)."""
        while not self.halt.wait(self.every):
            self.sample()
            if len(self.samples) % 30 == 0:
                t, rows, rss, load = self.samples[-1]
                print(f"{rows:,} rows, {rows / (t - self.samples[0][0]):,.0f} rows/s, RSS {rss:,.0f} MB, "
                      f"load {load:.2f}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self.halt.set()
        self.join()
        self.sample()


def count_verified() -> dict[str, int]:
    """Count every shard read whose sha256 `Store.read_verified` checks (and its bytes)."""
    seen = {"reads": 0, "bytes": 0}
    inner = Store.read_verified

    def counted(self, rec):
        data = inner(self, rec)
        seen["reads"] += 1
        seen["bytes"] += len(data)
        return data

    Store.read_verified = counted
    return seen


def read(path: str, batch_size: int, max_length: int) -> dict:
    """One epoch of the trainer's reader over the store; the measurements."""
    from kd.student.data import DataConfig, build_plan, train_batches

    store = Store.open(path)
    verified = count_verified()
    cfg = DataConfig(store=path, columns=[f"{TEACHER}.sentence"], tokenizer=TEACHER, batch_size=batch_size,
                     max_length=max_length)
    sampler = Sampler()
    sampler.start()
    t0, c0 = time.perf_counter(), time.process_time()
    plan = build_plan(store, cfg)
    t1, c1 = time.perf_counter(), time.process_time()
    plan_reads = verified["reads"]
    for batch in train_batches(store, plan, epoch=0, start=0):
        sampler.rows += len(batch["id"])
        assert batch[f"{TEACHER}.sentence"].shape[1] == DIM
    t2, c2 = time.perf_counter(), time.process_time()
    sampler.stop()
    assert sampler.rows == plan.train_rows(), (sampler.rows, plan.train_rows())
    return summarise(store, sampler, (t0, t1, t2), (c0, c1, c2), verified, plan_reads)


def summarise(store: Store, sampler: Sampler, t: tuple, cpu: tuple, verified: dict, plan_reads: int) -> dict:
    """Wall and CPU-time rates (on a busy machine the CPU-time rate is what one free core would give), RSS
    over the run, the load average."""
    rss = [s[2] for s in sampler.samples]
    quarter = {}
    for q in (0.25, 0.5, 0.75, 1.0):
        quarter[f"{int(q * 100)}%"] = round(next(s[2] for s in sampler.samples if s[1] >= q * sampler.rows), 1)
    loads = [s[3] for s in sampler.samples]
    return {
        "store_rows": store.manifest.inputs["num_rows"], "shards": store.manifest.num_shards,
        "train_rows": sampler.rows, "plan_s": round(t[1] - t[0], 1), "epoch_s": round(t[2] - t[1], 1),
        "epoch_rows_per_s": round(sampler.rows / (t[2] - t[1])),
        "with_plan_rows_per_s": round(sampler.rows / (t[2] - t[0])),
        "plan_cpu_s": round(cpu[1] - cpu[0], 1), "epoch_cpu_s": round(cpu[2] - cpu[1], 1),
        "epoch_rows_per_cpu_s": round(sampler.rows / (cpu[2] - cpu[1])),
        "with_plan_rows_per_cpu_s": round(sampler.rows / (cpu[2] - cpu[0])),
        "verified_reads": {"plan": plan_reads, "epoch": verified["reads"] - plan_reads,
                           "GB": round(verified["bytes"] / 1e9, 2)},
        "rss_mb": {"start": round(rss[0], 1), "peak": round(max(rss), 1), "end": round(rss[-1], 1),
                   "at_quarters": quarter},
        "load_avg_1m": {"start": loads[0], "mean": round(float(np.mean(loads)), 2), "max": max(loads),
                        "end": loads[-1]},
        "cpus": os.cpu_count(), "nice": os.nice(0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--rows", type=int, default=2_000_000)
    w.add_argument("--shard-rows", type=int, default=20_000)
    w.add_argument("--out", default="/tmp/readerscale")
    w.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("read")
    r.add_argument("--store", default="/tmp/readerscale")
    r.add_argument("--batch-size", type=int, default=64)
    r.add_argument("--max-length", type=int, default=128)
    r.add_argument("--json", help="also write the measurements here")
    args = ap.parse_args()
    if args.cmd == "write":
        write(args.out, args.rows, args.shard_rows, args.seed)
        return
    res = read(args.store, args.batch_size, args.max_length)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
