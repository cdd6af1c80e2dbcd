"""STS-B dev and test against epochs of the corpus: the hand-staged recipe of docs/results.md against `kd distill`
runs (issue 39's plot). One PNG and the numbers behind it as JSON.

- a curve is a chain of students, each started from the one before (`training_args.json`'s `init`): a `kd distill`
  run gives the chain that ends at its last finished stage, a student folder (`NAME=DIR`) the chain that ends at it
  (a recipe run by hand, or one stage past a run); the chain is read from the folders, not from a recipe, so a
  preset changed since the run was made cannot misplace its points;
- each student is one point: the epochs of the corpus trained up to and including it (`epochs`, or `max_steps` x
  `batch_size` over the training rows), and its STS-B dev and test Spearman (x100), scored as bench/sts_dev_test.py
  scores (`kd.student.load(...).encode`, `kd.apps.eval.metrics.sts_spearman`); scores are cached (`--cache`), keyed by
  the folder and its weights' checksum, so a finished student is scored once;
- the hand-staged recipe's points are the ones docs/results.md recorded for its 6-layer student (fifth to eighth
  runs, Intel Xeon with AMX, the same corpus and exclusions): test at every stage, dev where it was measured.

    python -m bench.epoch_curve bench/out/tiny6-full bench/out/tiny3-full --out docs/epoch-curve.png
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch

from kd import student
from kd.apps.eval import metrics, tasks

# docs/results.md, "Fifth run" and "Eighth run": (epochs, STS-B dev or None, STS-B test) of the 6-layer student
HAND_STAGED = [(0.8, None, 81.26), (1.4, None, 81.68), (2.7, None, 82.01), (4.1, None, 82.32),
               (5.8, 86.67, 82.44), (6.5, 86.93, 82.71), (7.2, 87.01, 82.88)]
MINILM = {"dev": 86.72, "test": 82.03}  # the same scoring, docs/results.md (eighth run)
TINY6_TARGET = 82.8  # issue 39: STS-B test within 2 epochs


def last_stage(run: Path) -> Path:
    """A `kd distill` run's last finished stage (its state's `done`, in order)."""
    done = json.loads((run / "distill.json").read_text(encoding="utf-8"))["done"]
    stages = [d.removeprefix("train stage ") for d in done if d.startswith("train stage ")]
    if not stages:
        raise SystemExit(f"{run}: no finished stage yet")
    return run / "stages" / stages[-1]


def chain(folder: Path) -> list[Path]:
    """`folder` and the students it started from, first stage first."""
    out: list[Path] = []
    while folder is not None and (folder / "training_args.json").is_file():
        out.append(folder)
        init = json.loads((folder / "training_args.json").read_text(encoding="utf-8"))["init"]
        folder = Path(init) if init else None
    return out[::-1]


def epochs_of(folder: Path) -> float:
    args = json.loads((folder / "training_args.json").read_text(encoding="utf-8"))
    if args.get("max_steps"):
        return args["max_steps"] * args["batch_size"] / args["resolved"]["train_rows"]
    return float(args["epochs"])


def points(end: Path, cache: dict) -> list[dict]:
    """(stage, epochs so far, dev, test) of each student of the chain ending at `end`."""
    out, epochs = [], 0.0
    for folder in chain(end):
        epochs += epochs_of(folder)
        key = f"{folder.resolve()}:{hashlib.sha256((folder / 'model.safetensors').read_bytes()).hexdigest()}"
        if key not in cache:
            model = student.load(folder)
            cache[key] = {split: metrics.sts_spearman(model.encode(t.a), model.encode(t.b), t.scores)
                          for split, t in ((s, tasks.load_stsb(s)) for s in ("dev", "test"))}
        out.append({"stage": folder.name, "epochs": round(epochs, 3), **cache[key]})
    return out


def plot(curves: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for ax, split in zip(axes, ("dev", "test")):
        for name, pts in curves.items():
            xy = [(p["epochs"], p[split]) for p in pts if p.get(split) is not None]
            if xy:
                ax.plot(*zip(*xy), marker="o", label=name)
        ax.axhline(MINILM[split], color="grey", linestyle="--", linewidth=1, label="MiniLM (tiny3's target)")
        if split == "test":
            ax.axhline(TINY6_TARGET, color="grey", linestyle=":", linewidth=1, label="tiny6's target")
        ax.set_title(f"STS-B {split} (Spearman x100)")
        ax.set_xlabel("epochs of the corpus, all stages")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("curves", nargs="*", help="kd distill output folders, or NAME=DIR of a student folder")
    ap.add_argument("--out", type=Path, default=Path("epoch-curve.png"))
    ap.add_argument("--cache", type=Path, default=Path("bench/out/epoch-curve-cache.json"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cache = json.loads(args.cache.read_text(encoding="utf-8")) if args.cache.is_file() else {}
    curves = {"hand-staged 6-layer (results.md)": [{"epochs": e, "dev": d, "test": t} for e, d, t in HAND_STAGED]}
    for spec in args.curves:
        name, _, folder = spec.rpartition("=")
        folder = Path(folder)
        if (folder / "distill.json").is_file():
            name = name or f"kd distill {json.loads((folder / 'distill.json').read_text())['identity']['student']}"
            folder = last_stage(folder)
        curves[name or folder.name] = points(folder, cache)
        args.cache.parent.mkdir(parents=True, exist_ok=True)
        args.cache.write_text(json.dumps(cache, indent=1), encoding="utf-8")
        for p in curves[name or folder.name]:
            print(f"{name or folder.name:24s} {p['stage']:14s} {p['epochs']:.2f} epochs  dev {p['dev']:.2f}  "
                  f"test {p['test']:.2f}")
    plot(curves, args.out)
    args.out.with_suffix(".json").write_text(json.dumps(curves, indent=1), encoding="utf-8")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
