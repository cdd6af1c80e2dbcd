"""Sentence-pair tasks side by side: cross-encoder teacher, DSE, DvBERT, SRA fine-tuning, plain MiniLM.

Run from the repository root:  python -m bench.pairs --quick   (or without --quick for the full sizes)

What runs, every model on the same STS-B / MRPC test rows (sizes from the options):
1. teachers: `kd finetune-teacher` on the packaged MiniLM -> cross-encoders, two per task with seeds 0
   and 1 (DvBERT's two teachers): STS-B train (pair-regression, one score) and MRPC train (classes);
2. pair stores: `kd precompute` over each training file with MiniLM (per-side sentence vectors: the
   students' tokenizer, embedding init and width) and the cross-encoders (logits);
3. students, all BiLSTMs with SRA's head and MiniLM's input embeddings (PCA):
   - stage one (sra-base): `kd train-student` with cosine to MiniLM on unlabelled news sentences;
   - DSE: objective `pair` (f(u, v) regresses the cross-encoder's logits + label loss), plus a cosine
     term to MiniLM's sentence vectors of each side; once from scratch (one stage), once with
     `--init sra-base` (the two-stage recipe), and once more two-stage with `pair:head=residual`
     (f(u, v) = calibrated cosine + MLP, docs/training.md);
   - DvBERT, two stages: objective `multi-teacher` plus the same cosine term, from sra-base. MRPC: KL to
     both teachers' class distributions, annealed to the gold label; STS-B: MSE of the calibrated
     cosine to both teachers' scores, annealed to the gold score (the paper's regression stage);
   - SRA: sra-base, then `kd finetune` (MLP head on [u, v, |u-v|, u*v]), and SRA+KD: the same with
     `--kd-store` (logit MSE to the teacher);
4. baseline: MiniLM as a bi-encoder, cosine of sentence vectors (MRPC: threshold tuned on train).
Quality: Spearman x 100 (STS-B), accuracy / F1 x 100 (MRPC). Throughput: pairs scored per second from
raw text on this machine (encode both sides + head for bi-encoders, one joint forward for the
cross-encoder). DSE speed-up (DSE table 4, scaled): one query against `--candidates` candidates whose
student vectors were computed offline, vs the cross-encoder running every (query, candidate) pair
(measured on `--ce-sample` pairs and extrapolated linearly when that is fewer than all).
Outputs are cached under --work (a rerun skips finished steps); results go to <work>/pairs.json and
a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from bench.retrieval import median_time
from kd.common.inputs import ColumnSpec
from kd.common.tasks import LabelSet, Task, read_task, task_metrics
from kd.pipeline.backends.loading import load_teacher
from kd.pipeline.precompute import precompute
from kd.pipeline.teacher.finetune import TeacherFinetuneConfig, finetune_teacher
from kd.pipeline.teacher.model import Output
from kd.storage.store import Store
from kd.student import load
from kd.student.finetune import FinetuneConfig, finetune, load_task_model
from kd.student.models import StudentOutput
from kd.student.objectives import build_objectives
from kd.student.objectives.base import ObjectiveName
from kd.student.trainer import TrainConfig, train

DATA = Path(os.environ.get("KD_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data"
PAIR = dict(pair_columns="a,b", label_column="label")
SOURCES = {  # task -> (train file, test file, reader columns)
    "stsb": (DATA / "stsb" / "sts-train.csv", DATA / "stsb" / "sts-test.csv", ColumnSpec(pair=("5", "6"), label="4")),
    "mrpc": (DATA / "mrpc" / "msr_paraphrase_train.txt", DATA / "mrpc" / "msr_paraphrase_test.txt",
             ColumnSpec(pair=("#1 String", "#2 String"), label="Quality")),
}
TASKS = {"stsb": Task.pair_regression, "mrpc": Task.pair_classification}


@dataclass
class BenchConfig:
    work: str = "bench/out/pairs"
    train_rows: int | None = None  # None: all
    test_rows: int | None = None
    teacher_epochs: int = 2
    teacher_lr: float = 4e-5
    corpus_rows: int = 10_000
    hidden: int = 512  # BiLSTM units per direction (SRA: 512)
    student_epochs: int = 10
    sra_epochs: int = 3
    finetune_epochs: int = 4
    candidates: int = 10_000
    ce_sample: int = 10_000
    speed_pairs: int = 512  # test pairs timed for throughput (median of `repeats` runs)
    repeats: int = 5
    seed: int = 0
    threads: int | None = None  # torch threads; default: 1 on a busy machine (apps.eval.speed.pick_threads)


QUICK = dict(train_rows=1500, test_rows=400, teacher_epochs=2, teacher_lr=1e-4, corpus_rows=5000, hidden=256,
             student_epochs=4, sra_epochs=4, finetune_epochs=3, ce_sample=128, speed_pairs=128, repeats=3)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------
# Data: (sub)sampled train/test files in one format, "label<TAB>a<TAB>b"


def write_subset(src: Path, spec: ColumnSpec, task: Task, rows: int | None, seed: int, out: Path) -> Path:
    if out.exists():
        return out
    from kd.common.tasks import TaskRows

    data: TaskRows = read_task(str(src), task, spec)
    keep = np.arange(len(data)) if rows is None or rows >= len(data) else \
        np.sort(np.random.default_rng(seed).choice(len(data), rows, replace=False))
    lines = ["label\ta\tb"] + [f"{data.labels[i]}\t{data.texts[i][0]}\t{data.texts[i][1]}" for i in keep]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def corpus_file(rows: int, out: Path) -> Path:
    if not out.exists():
        lines = (DATA / "corpus" / "eng_news_2016_10K-sentences.txt").read_text(encoding="utf-8").splitlines()
        out.write_text("\n".join(ln.split("\t", 1)[1] for ln in lines[:rows]) + "\n", encoding="utf-8")
    return out


# --------------------------------------------------------------------------------------------------
# Building the models (each step skipped when its output exists)


def build_teacher(cfg: BenchConfig, task: Task, train_file: Path, out: Path, seed: int) -> Path:
    if not (out / "dev_metrics.json").exists():
        log(f"finetune-teacher {out.name}")
        finetune_teacher(TeacherFinetuneConfig("minilm", task, [str(train_file)], str(out), epochs=cfg.teacher_epochs,
                                               lr=cfg.teacher_lr, batch_size=16, seed=seed, overwrite=True,
                                               progress=False, **PAIR))
    return out


def build_store(train_file: Path, out: Path, teachers: dict[str, Path]) -> Path:
    tables = set(Store.open(str(out)).manifest.tables) if (out / "manifest.json").exists() else set()
    if "teachers/minilm" not in tables:
        log(f"precompute {out.name}: minilm")
        precompute([str(train_file)], str(out), ["minilm"], outputs=["sentence"], progress=False, **PAIR)
    todo = [f"{n}={p}" for n, p in teachers.items() if f"teachers/{n}" not in tables]
    if todo:
        log(f"precompute {out.name}: {', '.join(teachers)}")
        precompute([str(train_file)], str(out), todo, outputs=["logits"], progress=False, **PAIR)
    return out


def build_student(cfg: BenchConfig, store: Path, out: Path, objectives: list[str], epochs: int,
                  batch_size: int = 32, init: Path | None = None) -> Path:
    """A BiLSTM student; with `init`, stage two of the two-stage recipe: it starts from that (sentence-
    distilled) student's weights instead of from scratch."""
    if not (out / "config.json").exists():
        log(f"train-student {out.name}: {objectives}{f' from {init.name}' if init else ''}")
        train(TrainConfig(str(store), str(out), arch="bilstm", objectives=objectives, target="minilm.sentence",
                          embed_dim=300, hidden_dim=cfg.hidden, max_length=64, batch_size=batch_size, epochs=epochs,
                          lr=1e-3, val_percent=0.0, seed=cfg.seed, overwrite=True, progress=False,
                          init=str(init) if init else None))
    return out


def build_finetuned(cfg: BenchConfig, base: Path, task: Task, train_file: Path, out: Path,
                    kd: tuple[Path, str] | None) -> Path:
    if not (out / "config.json").exists():
        log(f"finetune {out.name}")
        finetune(FinetuneConfig(str(base), task, [str(train_file)], str(out), epochs=cfg.finetune_epochs, lr=5e-4,
                                batch_size=32, kd_store=str(kd[0]) if kd else None, kd_teacher=kd[1] if kd else None,
                                seed=cfg.seed, overwrite=True, progress=False, **PAIR))
    return out


# --------------------------------------------------------------------------------------------------
# Scorers: raw pairs -> outputs ([n, K] logits or [n, 1] scores)


class CrossEncoder:
    def __init__(self, path: Path) -> None:
        self.teacher = load_teacher(str(path), device="cpu")

    def outputs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        return self.teacher.encode(pairs, [Output.logits])["logits"]


class ObjectiveHead:
    """A student scored by the head its pair objective learned (DSE's f(u, v), DvBERT's linear layer)."""

    def __init__(self, student_dir: Path, store: Path, name: ObjectiveName) -> None:
        from safetensors.torch import load_file

        self.st = load(student_dir)
        specs = self.st.info["objectives"]
        objs = build_objectives(specs, self.st.config, Store.open(str(store)).manifest)
        i = next(k for k, s in enumerate(specs) if s.split(":")[0] == name.value)
        weights = load_file(str(student_dir / "model.safetensors"))
        prefix = f"objectives.{i}."
        objs[i].load_state_dict({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
        self.obj = objs[i].eval()

    @torch.inference_mode()
    def score_vectors(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """The objective's own f(u, v) (DSE's MLP, with its cosine residual if any; DvBERT's head or score)."""
        out = (StudentOutput(torch.from_numpy(u), None), StudentOutput(torch.from_numpy(v), None))
        return self.obj.score(out).numpy()

    def outputs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        u = self.st.encode([a for a, _ in pairs])
        v = self.st.encode([b for _, b in pairs])
        return self.score_vectors(u, v)


class Finetuned:
    def __init__(self, path: Path) -> None:
        self.model = load_task_model(path)

    def outputs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        return self.model.outputs(pairs)


class BiEncoderCosine:
    """MiniLM sentence vectors, cosine; for classes, "same" above a threshold tuned on training pairs."""

    def __init__(self, threshold: float | None = None) -> None:
        self.teacher = load_teacher("minilm", device="cpu")
        self.threshold = threshold

    def cosines(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        u = self.teacher.encode([a for a, _ in pairs], [Output.sentence])["sentence"]
        v = self.teacher.encode([b for _, b in pairs], [Output.sentence])["sentence"]
        return (u * v).sum(1) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1)).clip(1e-9)

    def outputs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        c = self.cosines(pairs)
        if self.threshold is None:
            return c[:, None]
        return np.stack([self.threshold - c, c - self.threshold], 1)  # argmax = "same" above the threshold

    def tune(self, pairs: list[tuple[str, str]], gold: np.ndarray) -> float:
        c = self.cosines(pairs)
        grid = np.unique(np.round(c, 3))
        self.threshold = float(max(grid, key=lambda t: ((c > t) == gold).mean()))
        return self.threshold


def cosine_spearman(st, pairs: list[tuple[str, str]], gold: np.ndarray) -> float:
    """STS-style use of a student's embeddings alone (Spearman x 100 of cosine)."""
    u, v = st.encode([a for a, _ in pairs], normalize=True), st.encode([b for _, b in pairs], normalize=True)
    return task_metrics(Task.pair_regression, (u * v).sum(1), gold)["spearman"]


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------
# DSE table 4, scaled: one query against N candidates


def query_speedup(cfg: BenchConfig, ce: CrossEncoder, dse: ObjectiveHead, query: str) -> dict:
    lines = (DATA / "corpus" / "eng_news_2016_10K-sentences.txt").read_text(encoding="utf-8").splitlines()
    cands = [lines[i % len(lines)].split("\t", 1)[1] for i in range(cfg.candidates)]
    sample = min(cfg.ce_sample, len(cands))
    ce.outputs([(query, c) for c in cands[:16]])  # warm-up
    _, ce_sample_s = timed(ce.outputs, [(query, c) for c in cands[:sample]])
    ce_s = ce_sample_s * len(cands) / sample
    vectors, offline_s = timed(dse.st.encode, cands)  # the catalogue, once, offline

    def online() -> None:
        q = dse.st.encode([query])
        dse.score_vectors(np.repeat(q, len(vectors), 0), vectors)

    dse_s = median_time(online, cfg.repeats)
    return {"candidates": len(cands), "ce_pairs_measured": sample, "ce_seconds": ce_s,
            "ce_extrapolated": sample < len(cands), "dse_online_seconds": dse_s,
            "dse_offline_catalogue_seconds": offline_s, "speedup": ce_s / dse_s}


# --------------------------------------------------------------------------------------------------
# The run


def run(cfg: BenchConfig) -> dict:
    from kd.apps.eval.speed import pick_threads

    torch.manual_seed(cfg.seed)
    # on a busy 2-core machine a second intra-op thread made MiniLM fine-tuning 5x slower, not faster
    torch.set_num_threads(pick_threads(cfg.threads))
    work = Path(cfg.work)
    files = {}
    for key, (train_src, test_src, spec) in SOURCES.items():
        splits = ((train_src, cfg.train_rows, "train"), (test_src, cfg.test_rows, "test"))
        files[key] = tuple(write_subset(src, spec, TASKS[key], n, cfg.seed, work / "data" / f"{key}-{split}.tsv")
                           for src, n, split in splits)
    corpus = corpus_file(cfg.corpus_rows, work / "data" / "news.txt")
    # teachers and stores
    # two teachers per task (seeds 0 and 1): DvBERT's multi-teacher objective needs at least two
    ce = {"stsb": {"ce": build_teacher(cfg, Task.pair_regression, files["stsb"][0], work / "ce-stsb", 0),
                   "ce1": build_teacher(cfg, Task.pair_regression, files["stsb"][0], work / "ce-stsb-s1", 1)},
          "mrpc": {f"ce{s}": build_teacher(cfg, Task.pair_classification, files["mrpc"][0], work / f"ce-mrpc-s{s}", s)
                   for s in (0, 1)}}
    stores = {k: build_store(files[k][0], work / f"store-{k}", ce[k]) for k in files}
    # students
    if not (work / "store-news" / "manifest.json").exists():
        log("precompute store-news: minilm")
        precompute([str(corpus)], str(work / "store-news"), ["minilm"], outputs=["sentence"], progress=False)
    sra = build_student(cfg, work / "store-news", work / "sra-base", ["cosine"], cfg.sra_epochs, batch_size=64)
    students: dict[str, dict[str, Path]] = {}
    for k in files:
        first = next(iter(ce[k]))
        dse = [f"pair:1:teacher={first}", "cosine"]
        students[k] = {
            "dse_scratch": build_student(cfg, stores[k], work / f"dse-{k}", dse, cfg.student_epochs),
            # two-stage (issue 11): sentence distillation on news (sra-base), then DSE on the pairs
            "dse": build_student(cfg, stores[k], work / f"dse2-{k}", dse, cfg.student_epochs, init=sra),
            # the same with f(u, v) = calibrated cosine + MLP (pair:head=residual, docs/training.md)
            "dse_res": build_student(cfg, stores[k], work / f"dse2r-{k}", [f"{dse[0]}:head=residual", "cosine"],
                                     cfg.student_epochs, init=sra),
            "sra": build_finetuned(cfg, sra, TASKS[k], files[k][0], work / f"sra-{k}", None),
            "sra_kd": build_finetuned(cfg, sra, TASKS[k], files[k][0], work / f"sra-kd-{k}", (stores[k], first)),
        }
        students[k]["dvbert"] = build_student(cfg, stores[k], work / f"dvbert2-{k}", ["multi-teacher", "cosine"],
                                              cfg.student_epochs, init=sra)
    # evaluation
    results: dict = {"config": asdict(cfg), "tasks": {}}
    for k, task in TASKS.items():
        test = read_task(str(files[k][1]), task, ColumnSpec(pair=("a", "b"), label="label"))
        train_rows = read_task(str(files[k][0]), task, ColumnSpec(pair=("a", "b"), label="label"))
        gold = test.scores() if task.regression else LabelSet.fit(train_rows.labels).encode(test.labels)
        first = next(iter(ce[k]))
        models = {"cross-encoder teacher": CrossEncoder(ce[k][first]),
                  "DSE student, one stage (from scratch)":
                      ObjectiveHead(students[k]["dse_scratch"], stores[k], ObjectiveName.pair),
                  "DSE student, two stages (from sra-base)": ObjectiveHead(students[k]["dse"], stores[k],
                                                                            ObjectiveName.pair),
                  "DSE student, two stages, f = cosine + MLP": ObjectiveHead(students[k]["dse_res"], stores[k],
                                                                             ObjectiveName.pair),
                  "SRA fine-tuned student": Finetuned(students[k]["sra"]),
                  "SRA+KD fine-tuned student": Finetuned(students[k]["sra_kd"])}
        models["DvBERT student, two stages (from sra-base)"] = ObjectiveHead(students[k]["dvbert"], stores[k],
                                                                              ObjectiveName.multi_teacher)
        mini = BiEncoderCosine()
        if not task.regression:
            mini.tune(train_rows.texts, LabelSet.fit(train_rows.labels).encode(train_rows.labels))
        models["MiniLM bi-encoder (cosine)"] = mini
        rows = {}
        for name, m in models.items():
            log(f"evaluate {k}: {name}")
            sample = test.texts[: cfg.speed_pairs]
            secs = median_time(lambda m=m, sample=sample: m.outputs(sample), cfg.repeats)
            rows[name] = task_metrics(task, m.outputs(test.texts), gold) | {"pairs_per_s": len(sample) / secs}
            if task.regression and isinstance(m, ObjectiveHead | Finetuned):
                st = m.st if isinstance(m, ObjectiveHead) else m.model.encoder
                rows[name]["cosine_spearman"] = cosine_spearman(st, test.texts, gold)
        second = CrossEncoder(ce[k]["ce1"]).outputs(test.texts)  # DvBERT's second teacher
        rows["cross-encoder teacher 2 (seed 1, DvBERT)"] = task_metrics(task, second, gold)
        results["tasks"][k] = {"test_rows": len(test), "train_rows": len(train_rows), "models": rows}
    log("query speed-up")
    stsb_test = read_task(str(files["stsb"][1]), Task.pair_regression, ColumnSpec(pair=("a", "b"), label="label"))
    results["speedup"] = query_speedup(cfg, CrossEncoder(ce["stsb"]["ce"]),
                                       ObjectiveHead(students["stsb"]["dse"], stores["stsb"], ObjectiveName.pair),
                                       stsb_test.texts[0][0])
    results["machine"] = (f"{platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch thread(s), "
                          f"load average {os.getloadavg()[0]:.1f}, torch {torch.__version__}")
    results["date"] = datetime.date.today().isoformat()
    (work / "pairs.json").write_text(json.dumps(results, indent=1))
    return results


def markdown(res: dict) -> str:
    s, m = res["tasks"]["stsb"], res["tasks"]["mrpc"]
    names = list(dict.fromkeys([*s["models"], *m["models"]]))
    lines = ["| model | STS-B Spearman | STS-B Spearman (cosine of embeddings) | STS-B pairs/s | MRPC acc / F1 "
             "| MRPC pairs/s |", "|---|---|---|---|---|---|"]
    for n in names:
        a, b = s["models"].get(n), m["models"].get(n)
        cells = [f"{a['spearman']:.1f}" if a else "n/a", f"{a['cosine_spearman']:.1f}" if a and "cosine_spearman" in a
                 else "-", f"{a['pairs_per_s']:.0f}" if a and "pairs_per_s" in a else "-",
                 f"{b['accuracy']:.1f} / {b['f1']:.1f}" if b else "n/a",
                 f"{b['pairs_per_s']:.0f}" if b and "pairs_per_s" in b else "-"]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    sp = res["speedup"]
    lines.append("")
    lines.append(f"One query against {sp['candidates']:,} candidates: cross-encoder {sp['ce_seconds']:.1f} s"
                 f"{' (extrapolated from ' + str(sp['ce_pairs_measured']) + ' pairs)' if sp['ce_extrapolated'] else ''}"
                 f", DSE student {1000 * sp['dse_online_seconds']:.1f} ms (query embedding + f(u, v) over the "
                 f"precomputed candidate vectors; computing those once took "
                 f"{sp['dse_offline_catalogue_seconds']:.1f} s)"
                 f": **{sp['speedup']:,.0f}x** faster.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes for a shared 2-core CPU: " + json.dumps(QUICK))
    for f in BenchConfig.__dataclass_fields__.values():
        p.add_argument("--" + f.name.replace("_", "-"), type=float if f.type == "float" else
                       (str if f.name == "work" else int), default=None)
    args = p.parse_args(argv)
    cfg = BenchConfig(**(QUICK if args.quick else {}))
    for k, v in vars(args).items():
        if k != "quick" and v is not None:
            setattr(cfg, k, v)
    t0 = time.perf_counter()
    res = run(cfg)
    print(markdown(res))
    print(f"\n{res['machine']}; {res['date']}; {time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
