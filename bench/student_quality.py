"""Distil the packaged MiniLM into small students and compare them side by side on STS-B test.

Rows: the teacher (MiniLM-L6, run), each student trained here from the store (never loading the
teacher), and model2vec distilled from the same teacher with model2vec's own `distill`. Columns:
STS-B test Spearman x100, sentences/s at batch 1 and 256 on this CPU, parameters and MB on disk.

The store is the shared corpus: news articles split into sentences by spaCy, Leipzig news +
Wikipedia, Brown, WordNet definitions (bench/corpus.py), made with:

    python bench/corpus.py --out bench/out/extra.jsonl
    kd precompute ../shared/data/corpus/news_articles.csv bench/out/extra.jsonl --text-column text \
        --segment sentences --dedup -t minilm --outputs sentence,mean,cls --precision bf16 \
        --shard-rows 20000 -o bench/out/store-minilm

model2vec[distill] pins transformers < 5.4, so it is distilled in its own virtualenv
(bench/out/m2v, made on first use) and only loaded here (the `model2vec` package, bench extra):

    python bench/student_quality.py --store bench/out/store-minilm --arch bilstm bigru --epochs 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

OUT = Path("bench/out")


def model2vec_dir(teacher_path: str) -> Path:
    """Distil model2vec from the teacher once, in a separate venv (its transformers pin)."""
    target = OUT / "model2vec-minilm"
    if (target / "model.safetensors").exists():
        return target
    venv = OUT / "m2v"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)
        subprocess.run([*pip, "model2vec[distill]"], check=True)
    code = ("from model2vec.distill import distill; import sys; "
            "distill(model_name=sys.argv[1], pca_dims=256).save_pretrained(sys.argv[2])")
    subprocess.run([str(venv / "bin" / "python"), "-c", code, teacher_path, str(target)], check=True)
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=str(OUT / "store-minilm"))
    ap.add_argument("--arch", nargs="+", default=["bilstm"])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--hidden-dim", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--skip-train", action="store_true", help="evaluate students already in bench/out")
    args = ap.parse_args()

    from kd.apps.eval.run import EvalConfig, Measure, evaluate
    from kd.pipeline.teacher.resolve import resolve_teacher
    from kd.student.trainer import TrainConfig, train

    students = []
    for arch in args.arch:
        out = OUT / f"student-{arch}"
        if not args.skip_train:
            train(TrainConfig(store=args.store, out=str(out), arch=arch, objectives=["cosine"], epochs=args.epochs,
                              max_steps=args.max_steps, batch_size=args.batch_size, hidden_dim=args.hidden_dim,
                              lr=args.lr, pooling="max" if arch == "bilstm" else "attentive", patience=2))
        students.append(str(out))
    baseline = model2vec_dir(resolve_teacher("minilm").path)
    cfg = EvalConfig(students=students, store=args.store, teacher="minilm", sts_split="test",
                     measures=[Measure.sts, Measure.agreement, Measure.speed], baseline_dir=str(baseline),
                     json_path=str(OUT / "student_quality.json"), markdown_path=str(OUT / "student_quality.md"))
    report = evaluate(cfg)
    print(report.markdown())
    rows = {r.name: r.metrics for r in report.models}
    teacher = rows[report.models[0].name]
    for name, m in rows.items():
        if name == report.models[0].name:
            continue
        print(f"{name}: {100 * m['sts_spearman'] / teacher['sts_spearman']:.1f} % of the teacher's Spearman, "
              f"{m['sent_per_s_b256'] / teacher['sent_per_s_b256']:.1f}x its sentences/s at batch 256")


if __name__ == "__main__":
    main()
