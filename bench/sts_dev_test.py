"""STS-B Spearman (x100) on the dev and the test split for saved kd students, one line per student.

- each student is loaded with `kd.student.load` and encodes both sides of each pair (its own batching);
- the score is `kd.apps.eval.metrics.sts_spearman` of the pair cosines against the gold scores, the same
  measure bench/frontier.py reports for the test split (so its test column equals frontier's);
- tune recipes on the dev column: the test column is what frontier runs report.

    python -m bench.sts_dev_test --threads 1 bench/out/stronger-full/tinit3-rel bench/out/stronger-full/tinit6-rel7
"""

from __future__ import annotations

import argparse

import torch

from kd import student
from kd.apps.eval import metrics, tasks

SPLITS = ("dev", "test")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("students", nargs="+", help="saved student directories")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pairs = {split: tasks.load_stsb(split) for split in SPLITS}
    for path in args.students:
        model = student.load(path)
        scores = {split: metrics.sts_spearman(model.encode(t.a), model.encode(t.b), t.scores)
                  for split, t in pairs.items()}
        print(path, "  ".join(f"{split} {score:.2f}" for split, score in scores.items()), flush=True)


if __name__ == "__main__":
    main()
