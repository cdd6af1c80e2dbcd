"""Does an int8 teacher store cost the student quality? Same corpus, same student, same steps; two stores.

    python -m bench.int8_store [--brown 10000] [--backend openvino] [--work bench/out/int8-store]

1. corpus: `bench/corpus.py` without in-domain text (Leipzig news + Wikipedia 20k, `--brown` Brown
   sentences, no WordNet);
2. two stores with `kd precompute -t minilm --outputs sentence,mean` plus `--outputs vocab`: one fp32 on
   torch (the reference), one `--backend BACKEND --quantize int8 --precision fp32`; the int8 manifest's
   recorded fidelity is printed;
3. `kd leakage` on each store (the same rows: the texts are identical), then the same static student
   (`--arch static`, its defaults, seed 0) on each, excluding the overlapping rows;
4. both students and the two stores' own sentence vectors scored on STS-B test, the SST-2 probe and
   clustering (bench/frontier.py's measures). Prints the int8 - fp32 difference per measure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.frontier import ROOT, eval_texts, score


def kd(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "kd", *args], check=True, cwd=ROOT)


def build(work: Path, backend: str, brown: int) -> dict[str, Path]:
    corpus = work / "corpus.jsonl"
    if not corpus.exists():
        subprocess.run([sys.executable, "bench/corpus.py", "--out", str(corpus), "--brown", str(brown),
                        "--wordnet", "0"], check=True, cwd=ROOT)
    stores = {"fp32": work / "store-fp32", "int8": work / "store-int8"}
    flags = {"fp32": ["--precision", "fp32"],
             "int8": ["--backend", backend, "--quantize", "int8", "--precision", "fp32"]}
    for name, store in stores.items():
        for outputs in ("sentence,mean", "vocab"):
            kd("precompute", str(corpus), "--text-column", "text", "-t", "minilm", "--outputs", outputs,
               *flags[name], "-o", str(store), "--no-progress")
        exclude = work / f"exclude-{name}.txt"
        if not exclude.exists():
            kd("leakage", str(store), "--exclude-out", str(exclude))
        student = work / f"static-{name}"
        if not (student / "config.json").exists():
            kd("train-student", "--shards", str(store), "--out", str(student), "--arch", "static",
               "--exclude-ids", str(exclude), "--seed", "0", "--no-progress")
    return stores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="bench/out/int8-store")
    ap.add_argument("--backend", default="openvino", choices=["onnx", "openvino"])
    ap.add_argument("--brown", type=int, default=10000)
    a = ap.parse_args()
    work = ROOT / a.work
    work.mkdir(parents=True, exist_ok=True)
    stores = build(work, a.backend, a.brown)
    from kd import student

    manifest = json.loads((stores["int8"] / "manifest.json").read_text())
    meta = manifest["tables"]["teachers/minilm"]["meta"]
    print(f"int8 store: backend {meta.get('backend')}, quantize {meta.get('quantize')}, "
          f"recipe {json.dumps(meta.get('int8_recipe') or meta.get('smoothing'))}, "
          f"fidelity {json.dumps(meta.get('fidelity'))}")
    ev = eval_texts()
    rows = {}
    for name in ("fp32", "int8"):
        s = student.load(work / f"static-{name}")
        v = np.concatenate([s.encode(ev.texts[i: i + 256]) for i in range(0, len(ev.texts), 256)])
        rows[f"static student from the {name} store"] = score(np.asarray(v, dtype=np.float32), ev)
    lines = ["| model | STS-B test | SST-2 probe | cluster pair-F1 |", "|---|---|---|---|"]
    lines += [f"| {n} | {r['stsb']:.2f} | {r['sst2_probe']:.2f} | {r['cluster_f1']:.2f} |" for n, r in rows.items()]
    a32, a8 = rows.values()
    lines.append(f"| **int8 - fp32** | **{a8['stsb'] - a32['stsb']:+.2f}** | "
                 f"{a8['sst2_probe'] - a32['sst2_probe']:+.2f} | {a8['cluster_f1'] - a32['cluster_f1']:+.2f} |")
    print("\n".join(lines))
    (work / "results.json").write_text(json.dumps({"rows": rows, "fidelity": meta.get("fidelity"),
                                                   "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
