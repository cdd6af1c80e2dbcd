"""kd precompute vs sentence-transformers `encode`, measured fairly: fresh processes, A/B alternated, equal precision.

    python -m bench.precompute_vs_st [--corpus long|short|both] [--n 10000] [--threads 2] [--pairs 3]
                                     [--precisions fp32,default,int8,bf16] [--kd-backends auto,torch,onnx,openvino]
                                     [--st-python bench/out/st-onnx/bin/python]
    python -m bench.precompute_vs_st --report     # the last run's table again, from bench/out

Per precision, `--pairs` rounds of one run of each side (every kd teacher backend that supports the
precision, and ST), each in a fresh process (order rotated every round), on the same first `--n` real
sentences (Leipzig news + Wikipedia 2016) and the same thread count (torch, OpenMP, MKL and the tokenizer
all limited to `--threads`). Each child first imports the libraries both sides need (torch, transformers'
BERT modelling code, its own library), then times its whole job: kd = `precompute()` (read input, load
teacher, tokenize, forward, write cls + mean + layers as checksummed Parquet shards with a manifest);
ST = load the model + `encode` (vectors in memory, nothing written). Imports are warmed on both sides
because the import cost is the same stack either way (torch + transformers, ~4 s on a slow CPU) and a
library that happens to import it before the clock starts would otherwise win by it; the process wall
time (interpreter start to exit, imports included) is printed beside it, as a user would feel it.
Printed per side: job seconds and sentences/s as median [min-max], process seconds, peak RSS; per
precision the ratio ST seconds / kd seconds (> 1: kd faster), and the min / mean cosine of kd's `mean`
vectors to ST's at the same precision and to ST fp32, with the count of sentences below 0.99 (ST's own
bf16 / int8 vectors to ST fp32 too). The machine line names the CPU and whether it has
native bf16 and int8 dot products (AVX512-BF16/AMX, AVX512-VNNI/AVX-VNNI), which decide what bf16 and
int8 can gain; ST's int8 file uses the matching quantization preset (avx512_vnni, else avx2).

Corpora (`--corpus both` runs each in turn): `long` = Leipzig news + Wikipedia 2016 (27.6 tokens on average);
`short` = the unique sentences of STS-B dev + test (5,385, 11.1 words on average: image captions, headlines,
forum posts), the short-text case where per-batch costs weigh most. kd's `auto` backend is its default (what
`kd precompute` runs with no --backend).

Precisions: fp32 (both sides plain fp32); bf16 (kd `--precision bf16`: weights cast to bf16 on CPU, and
OpenVINO's bf16; ST with the model loaded in bf16, `model_kwargs={"torch_dtype": torch.bfloat16}`); int8
(kd `--backend onnx|openvino --quantize int8`, activations fp32; ST's own int8 path, `backend="onnx"` +
`export_dynamic_quantized_onnx_model`, which needs `optimum`: it runs only when `--st-python` names a
Python that has `sentence-transformers[onnx]`; otherwise int8 is compared with ST fp32).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.fresh import ROOT, alternate, fmt, run_fresh, spread

SHARED = Path(os.environ.get("KD_SHARED", ROOT.parent / "shared")) / "data" / "corpus"
WORK = ROOT / "bench" / "out" / "precompute_vs_st"
# which kd teacher backends run each precision (torch has no int8 path; ONNX Runtime has no CPU bf16; auto: the
# default, whichever kd picks)
# default: `kd precompute` with neither --backend nor --precision nor --quantize (auto / auto: OpenVINO in bf16
# on CPUs with native bf16), compared with ST fp32
BACKENDS = {"fp32": ("auto", "torch", "onnx", "openvino"), "bf16": ("auto", "torch", "openvino"),
            "int8": ("auto", "onnx", "openvino"), "default": ("auto",)}


def load_sentences(n: int, corpus: str = "long") -> list[str]:
    """The first `n` sentences of a corpus (see the module docstring)."""
    out: list[str] = []
    if corpus == "short":
        for name in ("sts-dev.csv", "sts-test.csv"):
            for line in (SHARED.parent / "stsb" / name).read_text(encoding="utf-8").splitlines():
                out += [x.strip() for x in line.split("\t")[5:7] if x.strip()]
        return list(dict.fromkeys(out))[:n]
    for name in ("eng_news_2016_10K-sentences.txt", "eng_wikipedia_2016_10K-sentences.txt"):
        out += [line.split("\t", 1)[1] for line in (SHARED / name).read_text(encoding="utf-8").splitlines()]
    return out[:n]


# --------------------------------------------------------------------------------------------------
# children: one timed job each, in a fresh process


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split())


def cpu_summary() -> str:
    """The CPU's model name and the instructions that decide what bf16 and int8 can gain."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        name = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name"))
        family = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("cpu family"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
    have = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                                 "amx_int8"})
    return f"{name} (family {family}; {' '.join(have) or 'no AVX2'})"


def st_int8_preset() -> str:
    """ST's quantization config for this CPU: VNNI int8 dot products where the CPU has them."""
    return "avx512_vnni" if cpu_flags() & {"avx512_vnni", "avx_vnni"} else "avx2"


def st_int8_file() -> str:
    # Named by us, not by ST: ST's default suffix follows the preset's weight dtype (qint8 for VNNI, quint8
    # for avx2), and a wrong guess makes ST silently try to re-export from a folder it cannot read.
    return f"onnx/model_int8_{st_int8_preset()}.onnx"


def warm_imports(side: str) -> None:
    """Import what the timed job needs before the clock starts, on both sides alike (see the docstring)."""
    import transformers.models.bert.modeling_bert  # noqa: F401  the teacher's architecture, both sides

    if side == "kd":
        import kd.pipeline.precompute  # noqa: F401
    else:
        import sentence_transformers  # noqa: F401


def child_kd(a: argparse.Namespace, sentences: list[str]) -> tuple[float, np.ndarray, str]:
    from kd.pipeline.precompute import precompute
    from kd.storage import Store
    from kd.storage.schema import arrow_to_vectors

    with tempfile.TemporaryDirectory(dir=WORK) as tmp:
        src = Path(tmp) / "in.txt"
        src.write_text("\n".join(sentences) + "\n")
        out = Path(tmp) / "store"
        extra = kd_options(a.backend, a.precision)
        t0 = time.perf_counter()
        precompute([str(src)], str(out), ["minilm"], outputs=["cls", "mean", "layers"], shard_rows=5000,
                   batch_tokens=a.batch_tokens, device="cpu", progress=False, **extra)
        secs = time.perf_counter() - t0
        store = Store.open(str(out))
        meta = store.table("teachers/minilm").meta
        chosen = f"{meta.get('backend', 'torch')} {meta.get('quantize', 'none')} {meta.get('precision', '')}".strip()
        return secs, arrow_to_vectors(store.read_table("teachers/minilm", ["mean"])["mean"]), chosen


def kd_options(backend: str, precision: str) -> dict:
    """precompute() options of a kd side. auto: what a user types (int8 = defaults + --quantize int8, so the
    activations run in the CPU's default precision); a named backend: the precision spelled out (int8 with fp32
    activations, as ST's int8)."""
    if backend == "auto":
        return {"default": {}, "int8": {"quantize": "int8"}}.get(precision, {"precision": precision})
    return {"backend": backend, "precision": "fp32" if precision == "int8" else precision,
            "quantize": "int8" if precision == "int8" else "none"}


def _st_int8_dir() -> Path:
    """A copy of the packaged MiniLM with ST's dynamically quantized ONNX file (made once, not timed)."""
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    from kd.pipeline.teacher.resolve import resolve_teacher

    folder = WORK / "st-minilm-onnx"
    if not (folder / st_int8_file()).exists():
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(resolve_teacher("minilm").path, folder)
        model = SentenceTransformer(str(folder), device="cpu", backend="onnx")
        export_dynamic_quantized_onnx_model(model, st_int8_preset(), str(folder),
                                            file_suffix=f"int8_{st_int8_preset()}")
    return folder


def child_st(a: argparse.Namespace, sentences: list[str]) -> tuple[float, np.ndarray, str]:
    import torch
    from sentence_transformers import SentenceTransformer

    from kd.pipeline.teacher.resolve import resolve_teacher

    kwargs: dict = {}
    path = resolve_teacher("minilm").path
    if a.precision == "bf16":
        kwargs = {"model_kwargs": {"torch_dtype": torch.bfloat16}}
    elif a.precision == "int8":
        path = str(_st_int8_dir())
        kwargs = {"backend": "onnx", "model_kwargs": {"file_name": st_int8_file()}}
    t0 = time.perf_counter()
    model = SentenceTransformer(path, device="cpu", **kwargs)
    emb = model.encode(sentences, batch_size=32, convert_to_numpy=True, normalize_embeddings=False)
    return time.perf_counter() - t0, np.asarray(emb, dtype=np.float32), "sentence-transformers"


def child(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(a.threads)
    WORK.mkdir(parents=True, exist_ok=True)
    sentences = load_sentences(a.n, a.corpus)
    warm_imports(a.side)
    secs, vecs, chosen = (child_kd if a.side == "kd" else child_st)(a, sentences)
    np.save(WORK / f"vectors-{a.corpus}-{side_name(a.side, a.backend)}-{a.precision}.npy", vecs)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    process = time.time() - a.started  # interpreter start (the parent's clock just before it) to now
    Path(a.result).write_text(json.dumps({"seconds": secs, "process_seconds": process, "rows": len(sentences),
                                          "peak_rss_mb": rss_mb, "ran": chosen}))


# --------------------------------------------------------------------------------------------------
# parent: alternate sides, summarise


def side_name(side: str, backend: str) -> str:
    return f"kd-{backend}" if side == "kd" else "st"


def cosines(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Min and mean cosine per row, and how many rows fall below 0.99 (the int8 target's bar)."""
    c = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return {"min": float(c.min()), "mean": float(c.mean()), "below_0.99": int((c < 0.99).sum())}


def cell(c: dict) -> str:
    return f"{c['min']:.5f} / {c['mean']:.6f} ({c['below_0.99']} < 0.99)"


def kd_label(backend: str, precision: str, ran: str = "") -> str:
    """The side's name, with the int8 recipe kd picks on this CPU (OpenVINO's follows its int8 dot products)."""
    from kd.pipeline.backends.runtime import Backend, Quantize, int8_method

    if backend == "auto":
        return f"kd precompute, default backend (auto: ran {ran}) (cls + mean + layers, written)"
    recipe = ""
    if precision == "int8":
        recipe = {"onnx": ", dynamic int8 smoothed", "openvino": f", {int8_method(Backend.openvino, Quantize.int8)}"
                  " int8"}[backend]
    return f"kd precompute, {backend} backend{recipe} (cls + mean + layers, written)"


def export_once(kd_backends: list[str], precision: str) -> None:
    """Fill kd's export cache (and, for auto, its fidelity record) before the clock, as ST's int8 file is made
    once: a user exports once."""
    from kd.pipeline.backends import loading

    if "auto" in kd_backends:  # one untimed small job records auto's choice and its fidelity for this CPU
        from kd.pipeline.precompute import precompute

        with tempfile.TemporaryDirectory(dir=WORK) as tmp:
            (Path(tmp) / "in.txt").write_text("A warm-up sentence.\nAnother one.\n")
            precompute([str(Path(tmp) / "in.txt")], str(Path(tmp) / "s"), ["minilm"], outputs=["cls", "mean", "layers"],
                       device="cpu", progress=False, **kd_options("auto", precision))
    for b in kd_backends:
        if b not in ("torch", "auto"):
            loading.load("minilm", b, "int8" if precision == "int8" else "none",
                          precision="fp32" if precision == "int8" else precision)


def measure(a: argparse.Namespace, precision: str, corpus: str) -> dict:
    def side(name: str, backend: str = "torch") -> dict:
        py = a.st_python if (name == "st" and precision == "int8") else None
        return run_fresh("bench.precompute_vs_st", ["--child", "--side", name, "--backend", backend,
                                                    "--precision", precision, "--n", str(a.n), "--corpus", corpus,
                                                    "--threads", str(a.threads), "--started", repr(time.time()),
                                                    *(["--batch-tokens", str(a.batch_tokens)] if a.batch_tokens
                                                      else [])], a.threads, py)

    wanted = a.kd_backends.split(",")
    sides = {f"kd-{b}": (lambda b=b: side("kd", b)) for b in BACKENDS[precision] if b in wanted}
    export_once([b for b in BACKENDS[precision] if b in wanted], precision)
    if precision not in ("int8", "default") or a.st_python and precision == "int8":
        sides["st"] = lambda: side("st")
    print(f"{corpus} {precision}:", flush=True)
    runs = alternate(sides, a.pairs)
    res: dict = {}
    for name, rs in runs.items():
        res[name] = {"seconds": spread([r["seconds"] for r in rs]),
                     "sent_per_s": spread([r["rows"] / r["seconds"] for r in rs]),
                     "process_seconds": spread([r["process_seconds"] for r in rs]),
                     "peak_rss_mb": spread([r["peak_rss_mb"] for r in rs]), "runs": rs}
    return res


def report(by_corpus: dict, a: argparse.Namespace) -> list[str]:
    lines = ["| corpus | precision | side | job s | sentences/s | process s (imports incl.) | peak RSS MB "
             "| kd / ST same precision | kd / ST fp32 | min / mean cosine to ST same precision | to ST fp32 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for corpus, results in by_corpus.items():
        lines += _rows(corpus, results)
    return lines


def _rows(corpus: str, results: dict) -> list[str]:
    st32, lines = results.get("fp32", {}).get("st"), []
    for p, res in results.items():
        for s, r in res.items():
            same = res.get("st")
            kd_side = s.startswith("kd")
            ratio = f"**{same['seconds']['median'] / r['seconds']['median']:.2f}x**" if kd_side and same else ""
            r32 = f"{st32['seconds']['median'] / r['seconds']['median']:.2f}x" if kd_side and st32 else ""
            cos_same = cos32 = ""
            if kd_side:
                kd = np.load(WORK / f"vectors-{corpus}-{s}-{p}.npy")
                if same:
                    c = cosines(kd, np.load(WORK / f"vectors-{corpus}-st-{p}.npy"))
                    cos_same, r["cosine_to_st"] = cell(c), c
            if st32 and (kd_side or p != "fp32"):  # ST's own bf16 / int8 fidelity too
                c = cosines(np.load(WORK / f"vectors-{corpus}-{s}-{p}.npy"),
                            np.load(WORK / f"vectors-{corpus}-st-fp32.npy"))
                cos32, r["cosine_to_st_fp32"] = cell(c), c
            label = kd_label(s[3:], p, r["runs"][0].get("ran", "")) if kd_side else "sentence-transformers encode"
            lines.append(f"| {corpus} | {p} | {label} | {fmt(r['seconds'])} | {fmt(r['sent_per_s'], 0)} | "
                         f"{fmt(r['process_seconds'])} | {r['peak_rss_mb']['median']:.0f} | {ratio} | {r32} | "
                         f"{cos_same} | {cos32} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="long", choices=("long", "short", "both"))
    ap.add_argument("--n", type=int, default=None, help="sentences (default: 5,000 short, 10,000 long)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--precisions", default="fp32,default,int8")
    ap.add_argument("--batch-tokens", type=int, default=None, help="kd's token budget per batch (default: kd's)")
    ap.add_argument("--kd-backends", default="auto,torch,onnx,openvino", help="kd teacher backends to run")
    ap.add_argument("--st-python", default=None, help="a Python with sentence-transformers[onnx] for ST int8")
    ap.add_argument("--report", action="store_true", help="print the last run's table again (bench/out), no runs")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--side", default="kd", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="torch", help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--started", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    if a.report:
        last = json.loads((WORK / "results.json").read_text())
        print("\n".join(report(last["results"], a)))
        print(last["machine"])
        return
    WORK.mkdir(parents=True, exist_ok=True)
    load_before, n_given = os.getloadavg(), a.n
    print(f"load average before: {load_before}; {a.n} sentences, {a.threads} threads, {a.pairs} pairs", flush=True)
    corpora = ("short", "long") if a.corpus == "both" else (a.corpus,)
    results = {}
    for c in corpora:
        a.n = n_given or (5000 if c == "short" else 10000)
        results[c] = {p: measure(a, p, c) for p in a.precisions.split(",")}
    lines = report(results, a)
    machine = (f"{cpu_summary()}, {platform.machine()}, {os.cpu_count()} CPUs, "
               f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    (WORK / "results.json").write_text(json.dumps({"results": results, "machine": machine, "n": a.n, "corpus": a.corpus,
                                                   "threads": a.threads, "pairs": a.pairs}, indent=1))
    print("\n".join(lines))
    print(machine)


if __name__ == "__main__":
    main()
