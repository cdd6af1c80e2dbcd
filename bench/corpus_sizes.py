"""How much corpus each preset needs (issue 50 item 2): every `kd distill` run's trained stages against its
baseline, by corpus size. One JSON of points (kept: runs of other sessions and machines add to it), one PNG and a
markdown table drawn from it.

- a point is one finished `kd distill` run: its preset (`distill.json`'s student, or its recipe file's stem), the
  corpus's rows (the store's `texts`: after dedup, before the leakage rows and the validation split are left out;
  the size `--dry-run`'s warning compares with a preset's `[measured]` sizes), the STS-B dev of its baseline and
  of its best stage of the recipe's final shape (`choice.json`'s candidates, every one scored on dev), what it
  exported, and STS-B test of the export and of the baseline (`report.json`: test is read once per run, by the
  run itself);
- a point is keyed by (preset, rows): a new run of the same preset on the same rows replaces the old one;
- `--note` says where and on which code the runs were made (a point written into the JSON by hand names the
  docs/results.md section it comes from there).

    python -m bench.corpus_sizes RUN... --json docs/corpus-sizes.json --out docs/corpus-sizes.png --note "..."
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kd.storage.store import Store

BASELINE = "baseline"


def point(run: Path, note: str) -> dict:
    """One finished run's point (see the module docstring)."""
    state = json.loads((run / "distill.json").read_text(encoding="utf-8"))
    if not any(step.startswith("evaluate") for step in state["done"]):
        raise SystemExit(f"{run}: not finished (its distill.json has no evaluation step done)")
    ident = state["identity"]
    preset = ident["student"] or Path(ident["recipe"]).stem
    choice = json.loads((run / "choice.json").read_text(encoding="utf-8"))
    dev = choice["sts_dev"]
    # the stages of the recipe's final shape: tiny3's 6-layer stages are never what it exports (apps.distill.run)
    best = max((s for s in choice["candidates"] if s != BASELINE), key=dev.__getitem__)
    rows = {m["name"]: m for m in json.loads((run / "report.json").read_text(encoding="utf-8"))["models"]}
    exported = rows[choice["chosen"]]
    base = rows.get(BASELINE, exported if choice["chosen"] == BASELINE else None)
    args = json.loads((run / "stages" / best / "training_args.json").read_text(encoding="utf-8"))
    texts = Store.open(args["store"]).table("texts")  # an absolute path (distill.json's is the user's spelling)
    return {"preset": preset, "rows": sum(shard.rows for shard in texts.shards.values()),
            "baseline_dev": round(dev[BASELINE], 2), "best_stage": best, "best_dev": round(dev[best], 2),
            "exported": choice["chosen"],
            "exported_test": exported.get("sts_test"), "baseline_test": base and base.get("sts_test"),
            "run": str(run), "note": note}


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    by_key = {(p["preset"], p["rows"]): p for p in old}
    by_key.update({(p["preset"], p["rows"]): p for p in new})
    return sorted(by_key.values(), key=lambda p: (p["preset"], p["rows"]))


def table(points: list[dict]) -> str:
    head = ("| preset | rows | baseline dev | best trained stage dev | exported | exported test | baseline test |\n"
            "|---|---|---|---|---|---|---|")
    lines = [f"| `{p['preset']}` | {p['rows']:,} | {p['baseline_dev']:.2f} | {p['best_dev']:.2f} ({p['best_stage']}) "
             f"| {p['exported']} | {_num(p['exported_test'])} | {_num(p['baseline_test'])} |" for p in points]
    return "\n".join([head, *lines])


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = sorted({p["preset"] for p in points})
    fig, axes = plt.subplots(1, len(presets), figsize=(4.2 * len(presets), 3.6), squeeze=False, sharex=True)
    for ax, preset in zip(axes[0], presets):
        mine = [p for p in points if p["preset"] == preset]
        x = [p["rows"] for p in mine]
        ax.plot(x, [p["best_dev"] for p in mine], "-", color="C0", label="best trained stage")
        ax.plot(x, [p["baseline_dev"] for p in mine], "--", color="C1", label="baseline (untrained start)")
        for p in mine:  # hollow: a point recorded from an earlier run by hand (its note says which)
            face = "none" if p["note"].startswith("recorded") else None
            ax.plot(p["rows"], p["best_dev"], "o", color="C0", mfc=face)
            ax.plot(p["rows"], p["baseline_dev"], "s", color="C1", mfc=face)
        ax.set_xscale("log")
        ax.set_title(preset)
        ax.set_xlabel("corpus rows")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("STS-B dev (Spearman x100)")
    axes[0][0].legend(fontsize=8, title="hollow: recorded by hand", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", type=Path, help="finished kd distill output folders")
    ap.add_argument("--json", type=Path, required=True, help="the points, read if present and rewritten")
    ap.add_argument("--out", type=Path, help="the PNG")
    ap.add_argument("--note", default="", help="where and on which code the runs were made")
    a = ap.parse_args()
    old = json.loads(a.json.read_text(encoding="utf-8")) if a.json.is_file() else []
    points = merge(old, [point(r, a.note) for r in a.runs])
    a.json.write_text(json.dumps(points, indent=1) + "\n", encoding="utf-8")
    if a.out:
        plot(points, a.out)
    print(table(points))


if __name__ == "__main__":
    main()
