"""The quality/speed frontier: every kd student tier against what a user would pick instead.

One run, the same test sets, the same thread count, each model in a fresh process:
- teacher fp32 (the packaged MiniLM through kd's teacher code) and teacher int8 (the "just quantize
  it" alternative: torch dynamic quantization of every Linear, no training);
- model2vec distilled from the same teacher (`--model2vec DIR`), Tokenlearn trained on the same store
  texts and teacher vectors (`--tokenlearn DIR`; both made by bench/static_baselines.py);
- every kd student given with `--student NAME=DIR`, and with `--onnx` the same student through
  `kd export --format onnx` (onnxruntime alone), with `--openvino` that export on OpenVINO (bf16 where native),
  with `--onnx-int8` its `--quantize int8` export on onnxruntime;
- the teacher on kd's own runtimes (`--teacher-backend openvino:int8`, `onnx:int8`, `openvino:none`) and
  other teachers in fp32 (`--extra-teacher mpnet`), so every model is timed on its best runtime.

Algorithm:
- quality: one child process per model encodes the evaluation texts (STS-B test pairs, SST-2 probe
  train sample + dev, news-articles clustering dev + test) and saves the vectors; the parent scores
  them with apps.eval.metrics (Spearman x100, probe accuracy, pair-F1 with the cut tuned on dev);
- speed: `--rounds` rounds (>= 3); each round starts one fresh process per model, the order rotated
  every round so no model always runs first or last; sentences/s at batch 1 and 256 on STS-B test
  sentences (apps.eval.speed.measure_speed); medians and min-max spread over rounds;
- size: megabytes on disk of what inference needs;
- a PNG: STS-B vs sentences/s at batch 256 (log x), Pareto front drawn, points labelled.

    python bench/frontier.py --threads 2 --student static=bench/out/kd-static \
        --student bilstm=bench/out/kd-bilstm --model2vec bench/out/model2vec-minilm \
        --tokenlearn bench/out/tokenlearn-minilm --out bench/out/frontier
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Spec:
    """A model to measure: a display name, a kind (teacher | teacher-int8 | static | kd) and a path."""

    name: str
    kind: str
    path: str

    def arg(self) -> str:
        return f"{self.name}|{self.kind}|{self.path}"

    @classmethod
    def parse(cls, text: str) -> Spec:
        name, kind, path = text.split("|", 2)
        return cls(name, kind, path)


# --- child side: load one model, encode or time it ------------------------------------------------

def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)


def load(spec: Spec):
    """(encode(texts) -> float32 [n, d], files on disk) for a model spec."""
    if spec.kind in ("teacher", "teacher-int8"):
        import torch

        from kd.pipeline.backends.loading import load_teacher

        t = load_teacher(spec.path, device="cpu")
        if spec.kind == "teacher-int8":
            # Dynamic int8: weights quantized once, activations per batch; what a user gets in one line.
            t.model = torch.ao.quantization.quantize_dynamic(t.model, {torch.nn.Linear}, dtype=torch.qint8)
        out = [o for o in t.available() if o.value == "sentence"] or [o for o in t.available() if o.value == "mean"]
        return (lambda texts: t.encode(texts, out)[out[0].value]), [Path(t.ref.path)]
    if spec.kind == "teacher-backend":  # path "SPEC@BACKEND:QUANTIZE", e.g. "minilm@openvino:int8"
        import torch

        from kd.pipeline.backends.loading import load as load_backend

        ref, _, how = spec.path.partition("@")
        backend, _, quantize = how.partition(":")
        t = load_backend(ref, backend, quantize or "none", device="cpu", threads=torch.get_num_threads())
        out = [o for o in t.available() if o.value == "sentence"] or [o for o in t.available() if o.value == "mean"]
        return (lambda texts: t.encode(texts, out)[out[0].value]), [t.backend.folder]
    if spec.kind == "kd-openvino":  # the same export run by OpenVINO, bf16 where the CPU has it (as kd's teachers)
        import torch

        from kd.student.exporters.onnx_graph import OnnxEncoder

        enc = OnnxEncoder(spec.path, threads=torch.get_num_threads())
        enc.session = OpenVinoSession(Path(spec.path) / "model.onnx", torch.get_num_threads())
        return (lambda texts: enc.encode(texts, batch_size=max(1, len(texts)))), [Path(spec.path)]
    if spec.kind == "kd-onnx":  # a `kd export --format onnx` folder, onnxruntime alone
        import torch

        from kd.student.exporters.onnx_graph import OnnxEncoder

        enc = OnnxEncoder(spec.path, threads=torch.get_num_threads())
        return (lambda texts: enc.encode(texts, batch_size=max(1, len(texts)))), [Path(spec.path)]
    if spec.kind == "static":
        from model2vec import StaticModel

        m = StaticModel.from_pretrained(spec.path)
        return (lambda texts: m.encode(texts, batch_size=max(1, len(texts)))), [Path(spec.path)]
    if spec.kind == "kd":
        from kd import student
        from kd.student.saved import CONFIG, TOKENIZER, WEIGHTS

        s = student.load(spec.path)
        files = [Path(spec.path) / f for f in (WEIGHTS, CONFIG, TOKENIZER)]
        return (lambda texts: s.encode(texts, batch_size=max(1, len(texts)))), files
    raise SystemExit(f"unknown model kind {spec.kind!r}")


class OpenVinoSession:
    """`onnxruntime.InferenceSession.run(names, feeds)` on OpenVINO: the compile settings kd's teacher backend
    uses (pipeline/backends/runtime.py: bf16 inference where native, one stream, latency hint, the same threads)."""

    def __init__(self, graph: Path, threads: int) -> None:
        import openvino as ov

        from kd.common.hardware import native_bf16

        config = {"INFERENCE_PRECISION_HINT": "bf16" if native_bf16() else "f32", "INFERENCE_NUM_THREADS": threads,
                  "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
        self.compiled = ov.Core().compile_model(str(graph), "CPU", config)
        self.request = self.compiled.create_infer_request()

    def run(self, names: list[str], feeds: dict) -> list:
        res = self.request.infer(feeds)
        return [res[self.compiled.output(n)] for n in names]


def _int8_mb(spec: Spec) -> float | None:
    """Megabytes of the quantized teacher's state_dict, saved the way a user would ship it."""
    import tempfile

    import torch

    from kd.pipeline.backends.loading import load_teacher

    t = load_teacher(spec.path, device="cpu")
    q = torch.ao.quantization.quantize_dynamic(t.model, {torch.nn.Linear}, dtype=torch.qint8)
    with tempfile.TemporaryDirectory() as d:
        torch.save(q.state_dict(), f"{d}/q.pt")
        return os.path.getsize(f"{d}/q.pt") / 1e6


def child(args: argparse.Namespace) -> None:
    from kd.apps.eval.speed import disk_mb, measure_speed

    _set_threads(args.threads)
    spec = Spec.parse(args.child)
    encode, files = load(spec)
    texts = json.loads(Path(args.texts).read_text())
    if args.mode == "quality":
        parts = [np.asarray(encode(texts[i : i + 256]), dtype=np.float32) for i in range(0, len(texts), 256)]
        np.save(args.result, np.concatenate(parts))
        return
    speed = measure_speed(encode, texts, n_b1=args.n_b1, n_b256=args.n_b256)
    mb = _int8_mb(spec) if spec.kind == "teacher-int8" else disk_mb(files)
    Path(args.result).write_text(json.dumps({**speed.to_dict(), "mb": mb}))


# --- parent side ------------------------------------------------------------------------------------

@dataclass
class EvalTexts:
    """Every text the quality measures need, in one list, with the slices that belong to each task."""

    texts: list[str]
    sts: tuple[int, int, np.ndarray]  # n pairs, offset, gold
    probe: tuple[int, int, np.ndarray, np.ndarray]  # n train, offset, train labels, test labels
    cluster: tuple[int, int, np.ndarray, np.ndarray]  # n dev, offset, dev groups, test groups


def eval_texts() -> EvalTexts:
    from kd.apps.eval import tasks

    sts = tasks.load_stsb("test")
    probe = tasks.load_sst2(4000)
    clus = tasks.load_cluster_set("news-articles")
    texts = sts.a + sts.b
    o_probe = len(texts)
    texts += probe.train_texts + probe.test_texts
    o_clus = len(texts)
    texts += clus.dev_texts + clus.test_texts
    return EvalTexts(
        texts,
        (len(sts.a), 0, sts.scores),
        (len(probe.train_texts), o_probe, probe.train_labels, probe.test_labels),
        (len(clus.dev_texts), o_clus, np.asarray(clus.dev_groups), np.asarray(clus.test_groups)),
    )


def score(v: np.ndarray, ev: EvalTexts) -> dict[str, float]:
    from kd.apps.eval import metrics

    n, _, gold = ev.sts
    out = {"stsb": metrics.sts_spearman(v[:n], v[n : 2 * n], gold)}
    n_tr, o, y_tr, y_te = ev.probe
    n_te = len(y_te)
    out["sst2_probe"] = metrics.probe_accuracy(v[o : o + n_tr], y_tr, v[o + n_tr : o + n_tr + n_te], y_te)
    n_dev, o, g_dev, g_te = ev.cluster
    res = metrics.cluster_quality(v[o : o + n_dev], g_dev, v[o + n_dev : o + n_dev + len(g_te)], g_te)
    out["cluster_f1"] = res.test.f1 * 100.0
    return out


def run_child(spec: Spec, mode: str, texts: Path, result: Path, a: argparse.Namespace) -> None:
    """A fresh process per measurement, with BLAS/OpenMP pools limited to the same thread count."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads),
               OPENBLAS_NUM_THREADS=str(a.threads), RAYON_NUM_THREADS=str(a.threads),
               TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, __file__, "--child", spec.arg(), "--mode", mode, "--texts", str(texts),
           "--result", str(result), "--threads", str(a.threads), "--n-b1", str(a.n_b1), "--n-b256", str(a.n_b256)]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)


def specs(a: argparse.Namespace) -> list[Spec]:
    out = [Spec("MiniLM fp32 (teacher)", "teacher", a.teacher),
           Spec("MiniLM int8 (dynamic)", "teacher-int8", a.teacher)]
    for how in a.teacher_backend:  # the same teacher on kd's own runtimes: each model on its best one
        out.append(Spec(f"MiniLM {how.replace(':', ' ')}", "teacher-backend", f"{a.teacher}@{how}"))
    for extra in a.extra_teacher:
        name, _, ref = extra.partition("=")
        out.append(Spec(f"{name} fp32", "teacher", ref or name))
    if a.model2vec:
        out.append(Spec("model2vec distill", "static", a.model2vec))
    if a.tokenlearn:
        out.append(Spec("Tokenlearn", "static", a.tokenlearn))
    for s in a.student:
        name, path = s.split("=", 1)
        out.append(Spec(f"kd {name}", "kd", path))
        if a.onnx:
            out.append(Spec(f"kd {name} onnx", "kd-onnx", str(onnx_export(path, Path(a.out) / f"onnx-{name}"))))
        if a.openvino:
            out.append(Spec(f"kd {name} openvino", "kd-openvino", str(onnx_export(path, Path(a.out) / f"onnx-{name}"))))
        if a.onnx_int8:
            int8 = onnx_export(path, Path(a.out) / f"onnx-int8-{name}", "int8")
            out.append(Spec(f"kd {name} onnx int8", "kd-onnx", str(int8)))
    return out


def onnx_export(student_dir: str, folder: Path, quantize: str = "none") -> Path:
    """The student through `kd export --format onnx [--quantize int8]`, once (an existing export is reused)."""
    if not (folder / "model.onnx").exists():
        from kd.student.exporters.onnx_graph import export_onnx

        export_onnx(student_dir, folder, overwrite=True, quantize=quantize)
    return folder


def measure_all(a: argparse.Namespace) -> dict[str, dict]:
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = specs(a)
    ev = eval_texts()
    texts_file = out_dir / "eval_texts.json"
    texts_file.write_text(json.dumps(ev.texts))
    speed_texts = out_dir / "speed_texts.json"
    speed_texts.write_text(json.dumps(ev.texts[: ev.sts[0] * 2]))
    rows: dict[str, dict] = {m.name: {"kind": m.kind, "path": m.path} for m in models}
    known = json.loads((out_dir / "results.json").read_text())["rows"] if a.speed_only else {}
    for m in models:
        if m.name in known:  # --speed-only: quality is deterministic, re-measure only the speeds
            rows[m.name].update({k: known[m.name][k] for k in ("stsb", "sst2_probe", "cluster_f1")})
            continue
        vec = out_dir / f"vectors-{models.index(m)}.npy"
        run_child(m, "quality", texts_file, vec, a)
        rows[m.name].update(score(np.load(vec), ev))
        print(f"{m.name}: {rows[m.name]}", flush=True)
    runs: dict[str, list[dict]] = {m.name: [] for m in models}
    for r in range(a.rounds):
        order = models[r % len(models):] + models[: r % len(models)]
        for m in order:
            res = out_dir / "speed.json"
            run_child(m, "speed", speed_texts, res, a)
            runs[m.name].append(json.loads(res.read_text()))
        print(f"speed round {r + 1}/{a.rounds} done", flush=True)
    for name, rs in runs.items():
        for key in ("sent_per_s_b1", "sent_per_s_b256", "latency_ms"):
            vals = [x[key] for x in rs]
            rows[name][key] = statistics.median(vals)
            rows[name][key + "_range"] = [min(vals), max(vals)]
        rows[name]["mb"] = rs[0]["mb"]
    return rows


def pareto(rows: dict[str, dict], speed: str = "sent_per_s_b256") -> list[str]:
    """Names no other model beats on both STS-B and `speed` (sentences/s at batch 256, or at batch 1)."""
    front = []
    for n, r in rows.items():
        if not any(o["stsb"] >= r["stsb"] and o[speed] >= r[speed] and (o["stsb"], o[speed]) != (r["stsb"], r[speed])
                   for m, o in rows.items() if m != n):
            front.append(n)
    return sorted(front, key=lambda n: rows[n][speed])


def markdown(rows: dict[str, dict], front: list[str]) -> str:
    teacher = next(r for r in rows.values() if r["kind"] == "teacher")
    head = ("| model | STS-B test ρ×100 | SST-2 probe acc | cluster pair-F1 | sent/s b=1 | sent/s b=256 (min-max) "
            "| × teacher b=256 | MB | Pareto |")
    lines = [head, "|" + "---|" * 9]
    for n, r in sorted(rows.items(), key=lambda kv: -kv[1]["sent_per_s_b256"]):
        lo, hi = r["sent_per_s_b256_range"]
        lines.append(
            f"| {n} | {r['stsb']:.2f} | {r['sst2_probe']:.2f} | {r['cluster_f1']:.2f} | "
            f"{r['sent_per_s_b1']:,.0f} | {r['sent_per_s_b256']:,.0f} ({lo:,.0f}-{hi:,.0f}) | "
            f"{r['sent_per_s_b256'] / teacher['sent_per_s_b256']:.2f} | {r['mb']:.1f} | "
            f"{'yes' if n in front else ''} |")
    return "\n".join(lines)


def plot(rows: dict[str, dict], path: Path, speed: str = "sent_per_s_b256") -> None:
    """STS-B against `speed` (log x), the Pareto front of that speed drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = pareto(rows, speed)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for n, r in rows.items():
        kd = r["kind"].startswith("kd")
        ax.scatter(r[speed], r["stsb"], s=60, marker="o" if kd else "s",
                   color="tab:blue" if kd else "tab:gray", zorder=3)
        ax.annotate(n, (r[speed], r["stsb"]), textcoords="offset points", xytext=(6, 4), fontsize=8)
    xs = [rows[n][speed] for n in front]
    ys = [rows[n]["stsb"] for n in front]
    ax.step(xs, ys, where="post", color="tab:red", alpha=0.6, label="Pareto front")
    ax.set_xscale("log")
    ax.set_xlabel(f"sentences/s at batch {speed.rsplit('b', 1)[1]} (log scale, this CPU)")
    ax.set_ylabel("STS-B test Spearman ×100")
    ax.set_title("Quality vs speed: kd students (blue) and alternatives (grey)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", default="minilm")
    ap.add_argument("--student", action="append", default=[], help="NAME=DIR of a kd student (repeatable)")
    ap.add_argument("--model2vec", default=None, help="model2vec folder distilled from the teacher")
    ap.add_argument("--tokenlearn", default=None, help="Tokenlearn folder trained on the same store")
    ap.add_argument("--teacher-backend", action="append", default=[], metavar="BACKEND:QUANTIZE",
                    help="also time the teacher on a kd backend, e.g. openvino:int8, onnx:int8 (repeatable)")
    ap.add_argument("--extra-teacher", action="append", default=[], metavar="NAME[=SPEC]",
                    help="another teacher row in fp32, e.g. mpnet (repeatable)")
    ap.add_argument("--onnx", action="store_true", help="also time each kd student through kd export --format onnx")
    ap.add_argument("--openvino", action="store_true",
                    help="also run each student's ONNX export on OpenVINO (bf16 where native), as kd runs teachers")
    ap.add_argument("--onnx-int8", action="store_true",
                    help="also time each student's `kd export --format onnx --quantize int8` on onnxruntime")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-b1", type=int, default=128)
    ap.add_argument("--n-b256", type=int, default=1024)
    ap.add_argument("--out", default="bench/out/frontier")
    ap.add_argument("--speed-only", action="store_true", help="keep results.json's quality, re-time the speeds")
    ap.add_argument("--render", action="store_true", help="only re-draw results.md and frontier.png from results.json")
    ap.add_argument("--score", nargs="+", default=None, metavar="DIR",
                    help="only score these kd student folders, or static:DIR model2vec / Tokenlearn folders (quality "
                         "columns, this process), then exit")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="quality", help=argparse.SUPPRESS)
    ap.add_argument("--texts", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    if a.score:
        _set_threads(a.threads)
        ev = eval_texts()
        for folder in a.score:  # DIR: a kd student; static:DIR a model2vec / Tokenlearn folder
            kind, _, path = folder.partition(":") if folder.startswith("static:") else ("kd", "", folder)
            encode, _ = load(Spec(folder, kind, path))
            print(f"{folder}: " + ", ".join(f"{k} {v:.2f}" for k, v in score(encode(ev.texts), ev).items()))
        return
    out = Path(a.out)
    t0 = time.time()
    if a.render:
        rows = json.loads((out / "results.json").read_text())["rows"]
        front = pareto(rows)
    else:
        load_before = os.getloadavg()
        print(f"load average before: {load_before}, threads {a.threads}", flush=True)
        rows = measure_all(a)
        front = pareto(rows)
        (out / "results.json").write_text(json.dumps({"rows": rows, "pareto": front, "threads": a.threads,
                                                      "rounds": a.rounds, "load_before": load_before}, indent=1))
    table = markdown(rows, front)
    (out / "results.md").write_text(table + "\n")
    plot(rows, out / "frontier.png")
    plot(rows, out / "frontier-b1.png", "sent_per_s_b1")
    print(table)
    teacher = next(r for r in rows.values() if r["kind"] == "teacher")
    int8 = next((r for r in rows.values() if r["kind"] == "teacher-int8"), None)
    for n, r in rows.items():
        if r["kind"].startswith("kd") or r["kind"] == "static":
            vs = f", {r['sent_per_s_b256'] / int8['sent_per_s_b256']:.2f}x teacher-int8" if int8 else ""
            print(f"{n}: STS-B {r['stsb'] - teacher['stsb']:+.2f} vs teacher, "
                  f"{r['sent_per_s_b256'] / teacher['sent_per_s_b256']:.2f}x teacher fp32 sentences/s{vs}")
    print(f"load average after: {os.getloadavg()}; {time.time() - t0:.0f} s; "
          f"wrote {out}/results.md, frontier.png, frontier-b1.png")


if __name__ == "__main__":
    main()
