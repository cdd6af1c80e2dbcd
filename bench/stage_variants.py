"""A finished stage trained again with one or more options changed, each variant scored on STS-B dev (never test:
the variants are a choice). The stage's own `training_args.json` is the base, so a variant differs from the stage
in the options it names and nothing else (store, rows left out, target, seed).

    python -m bench.stage_variants cs100k/static/stages/static --out variants \
        lr02:lr=0.02 e10:epochs=10 rel:objectives='["cosine","relational:25"]' 'b64:batch_size=64;lr=0.0025'

A variant is NAME:KEY=VALUE[;KEY=VALUE...], each VALUE read as JSON (a bare word is a string). One JSON line per
variant on stdout and in OUT/variants.jsonl, the base stage's own dev score first; a variant already trained in
OUT is scored again, not retrained.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kd.apps.eval import metrics, tasks
from kd.student.saved import load
from kd.student.train_config import TrainConfig
from kd.student.trainer import train

NOT_COPIED = ("resolved", "out", "progress")


def parse_variant(text: str) -> tuple[str, dict]:
    """NAME:KEY=VALUE[;KEY=VALUE...] -> (NAME, {KEY: VALUE}); a VALUE that is not JSON is a string."""
    name, _, spec = text.partition(":")
    options = {}
    for part in filter(None, spec.split(";")):
        key, _, value = part.partition("=")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    if not name or not options:
        raise SystemExit(f"variant {text!r}: write NAME:KEY=VALUE[;KEY=VALUE...]")
    return name, options


def dev_score(folder: Path, dev: tasks.PairTask) -> float:
    model = load(folder)
    return round(metrics.sts_spearman(model.encode(dev.a), model.encode(dev.b), dev.scores), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", type=Path, help="a finished stage folder (kd distill's stages/NAME, train-student --out)")
    ap.add_argument("variants", nargs="+", help="NAME:KEY=VALUE[;KEY=VALUE...]")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    base = json.loads((args.stage / "training_args.json").read_text(encoding="utf-8"))
    base = {k: v for k, v in base.items() if k not in NOT_COPIED}
    dev = tasks.load_stsb("dev")
    args.out.mkdir(parents=True, exist_ok=True)
    records = [{"variant": "stage", "folder": str(args.stage), "sts_dev": dev_score(args.stage, dev)}]
    print(json.dumps(records[0]), flush=True)
    for name, options in map(parse_variant, args.variants):
        out, t = args.out / name, time.perf_counter()
        if not (out / "model.safetensors").is_file():
            train(TrainConfig(**(base | options | {"out": str(out), "progress": False})))
        records.append({"variant": name, **options, "sts_dev": dev_score(out, dev),
                        "seconds": round(time.perf_counter() - t, 1)})
        print(json.dumps(records[-1]), flush=True)
    with open(args.out / "variants.jsonl", "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
