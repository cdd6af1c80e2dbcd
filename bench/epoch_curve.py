"""STS-B dev and test against epochs of the corpus: the hand-staged recipe of docs/results.md against `kd distill`
runs (issue 39's plot). One PNG and the numbers behind it as JSON.

- a `kd distill` run contributes one point per stage: the epochs of the corpus trained up to and including that
  stage (its recipe's `epochs`, summed along the stages), and its student's STS-B dev and test Spearman (x100),
  scored as bench/sts_dev_test.py scores (`kd.student.load(...).encode`, `kd.apps.metrics.sts_spearman`);
  the scores are cached in the run's folder (`curve.json`), so a finished stage is read once;
- the hand-staged recipe's points are the ones docs/results.md recorded for its 6-layer student (fifth to eighth
  runs, Intel Xeon with AMX, the same corpus and exclusions): test at every stage, dev where it was measured.

    python -m bench.epoch_curve bench/out/tiny6-full bench/out/tiny3-full --out docs/epoch-curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from kd import student
from kd.apps import metrics, tasks
from kd.apps import recipe as R

# docs/results.md, "Fifth run" and "Eighth run": (epochs, STS-B dev or None, STS-B test) of the 6-layer student
HAND_STAGED = [(0.8, None, 81.26), (1.4, None, 81.68), (2.7, None, 82.01), (4.1, None, 82.32),
               (5.8, 86.67, 82.44), (6.5, 86.93, 82.71), (7.2, 87.01, 82.88)]
MINILM = {"dev": 86.72, "test": 82.03}  # the same scoring, docs/results.md (eighth run)
TINY6_TARGET = 82.8  # issue 39: STS-B test within 2 epochs


def run_points(run: Path) -> list[dict]:
    """(stage, epochs so far, dev, test) of each finished stage of one `kd distill` run, cached in curve.json."""
    state = json.loads((run / "distill.json").read_text(encoding="utf-8"))["identity"]
    recipe = R.load(state["recipe"] or state["student"])
    cache_path = run / "curve.json"
    cache = json.loads(cache_path.read_text(encoding="utf-8")) if cache_path.is_file() else {}
    points, epochs = [], 0.0
    for stage in recipe.stages:
        epochs += stage.options.get("epochs", 0)
        folder = run / "stages" / stage.name
        if not (folder / "model.safetensors").is_file() or (folder / "checkpoint.pt").exists():
            break  # not finished yet
        if stage.name not in cache:
            model = student.load(folder)
            cache[stage.name] = {split: metrics.sts_spearman(model.encode(t.a), model.encode(t.b), t.scores)
                                 for split, t in ((s, tasks.load_stsb(s)) for s in ("dev", "test"))}
            cache_path.write_text(json.dumps(cache, indent=1), encoding="utf-8")
        points.append({"stage": stage.name, "epochs": epochs, **cache[stage.name]})
    return points


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
    ap.add_argument("runs", nargs="*", type=Path, help="kd distill output folders")
    ap.add_argument("--out", type=Path, default=Path("epoch-curve.png"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    curves = {"hand-staged 6-layer (results.md)": [{"epochs": e, "dev": d, "test": t} for e, d, t in HAND_STAGED]}
    for run in args.runs:
        name = f"kd distill {json.loads((run / 'distill.json').read_text())['identity']['student']}"
        curves[name] = run_points(run)
        for p in curves[name]:
            print(f"{name:20s} {p['stage']:12s} {p['epochs']:.1f} epochs  dev {p['dev']:.2f}  test {p['test']:.2f}")
    plot(curves, args.out)
    args.out.with_suffix(".json").write_text(json.dumps(curves, indent=1), encoding="utf-8")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
