"""Training speed of two kd checkouts on the same stage, A/B alternated, each run in a fresh process (issue 39's
"less wasted work per step": length buckets sorted by characters before, by tokens after).

- each run trains `--steps` steps of the stage recorded in `--args` (a `training_args.json`: its store, target,
  start, rates and exclusions) into a temporary folder, pinned to the cores it is started on;
- the figure is the last `rows_per_s` window of its metrics.jsonl (training only, after warm-up) and its padding;
  wall time (start-up and the closing validation included) is printed beside it;
- `--before` / `--after`: folders whose `kd` is the checkout to run (e.g. `git worktree add /tmp/kd-a REV` and a
  folder holding a `kd` link to it);
- `--padding N`: instead, the padding of the stage's batches over its first N units, buckets sorted by characters
  and by tokens (this checkout's `shuffled_rows` with and without the token counter), counted with its tokenizer.

    taskset -c 0 python -m bench.bucket_ab --args bench/out/tiny6-full/stages/cosine/training_args.json \
        --before /work/snaproot3 --after /work/snaproot_ab --steps 80 --pairs 3
    python -m bench.bucket_ab --args bench/out/tiny6-full/stages/cosine/training_args.json --padding 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ONE_RUN = """
import json, sys, time
t0 = time.perf_counter()
from kd.student.train_config import TrainConfig
from kd.student.trainer import train
args = json.loads(open(sys.argv[1]).read())
skip = ("resolved", "out", "max_steps", "progress", "checkpoint_every", "log_every")
cfg = {k: v for k, v in args.items() if k not in skip}
train(TrainConfig(**cfg, out=sys.argv[2], max_steps=int(sys.argv[3]), progress=False, checkpoint_every=10**6,
                  log_every=20))
recs = [json.loads(x) for x in open(sys.argv[2] + "/metrics.jsonl") if "rows_per_s" in x]
print(json.dumps({"wall": time.perf_counter() - t0, "rows_per_s": recs[-1]["rows_per_s"],
                  "padding": recs[-1]["padding"]}))
"""


def one(root: str, args: Path, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="kd-bucket-ab-") as tmp:
        env = os.environ | {"PYTHONPATH": root}
        out = subprocess.run([sys.executable, "-c", ONE_RUN, str(args), f"{tmp}/run", str(steps)], env=env,
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])


def padding(args: Path, units: int) -> None:
    import numpy as np

    from kd.storage.store import Store
    from kd.student import data as D

    a = json.loads(args.read_text())
    store = Store.open(a["store"])
    cfg = D.DataConfig(a["store"], a["resolved"]["target"], a["resolved"]["tokenizer"], batch_size=a["batch_size"],
                       max_length=a["max_length"], val_percent=a["val_percent"], shuffle_buffer=a["shuffle_buffer"],
                       bucket=True)
    plan = D.build_plan(store, cfg)
    tok = D.Tokenize(cfg.tokenizer_path(store), cfg.max_length)
    for name, tokens in (("characters", None), ("tokens", tok.count)):
        real = slots = n = 0
        for b in D.shuffled_rows(store, plan, plan.units(0, 0, 0)[:units], np.random.default_rng(0), tokens):
            c = tok.count(list(b["text"]))
            real, slots, n = real + int(c.sum()), slots + int(c.max()) * len(c), n + 1
        print(f"buckets by {name}: {n} batches, padding {1 - real / slots:.1%}, token slots per batch {slots / n:,.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--args", type=Path, required=True, help="a stage's training_args.json")
    ap.add_argument("--before", help="folder whose kd is the baseline checkout")
    ap.add_argument("--after", default=str(Path(__file__).resolve().parents[2]), help="the same for the change")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--padding", type=int, default=0, help="count padding over this many units instead")
    a = ap.parse_args()
    if a.padding:
        return padding(a.args, a.padding)
    if not a.before:
        ap.error("--before is needed for the speed A/B")
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(a.pairs):
        for side, root in (("before", a.before), ("after", a.after)):
            r = one(root, a.args, a.steps)
            runs[side].append(r)
            print(f"pair {i + 1} {side}: {r['rows_per_s']:.1f} rows/s, padding {r['padding']:.1%}, "
                  f"wall {r['wall']:.0f} s", flush=True)
    for side, rs in runs.items():
        rps = [r["rows_per_s"] for r in rs]
        print(f"{side}: median {statistics.median(rps):.1f} rows/s ({min(rps):.1f}-{max(rps):.1f}), "
              f"median wall {statistics.median(r['wall'] for r in rs):.0f} s")


if __name__ == "__main__":
    main()
