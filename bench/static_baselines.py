"""The static-embedding alternatives of bench/frontier.py, made from the same teacher and store.

- model2vec: `model2vec.distill` of the teacher (PCA 256), no corpus;
- Tokenlearn 0.2.1 (`pip install tokenlearn`, runs offline): its own `train.py` recipe (a 56,000-token
  vocabulary built from the corpus, `distill` with that vocabulary, targets reduced by PCA to 256,
  `train_supervised`: AdamW 1e-3, batch 256, MSE, early stopping) on the SAME store texts and the
  store's `mean` teacher vectors (the mean of the teacher's token outputs, which is Tokenlearn's own
  featurisation up to the [CLS]/[SEP] positions it leaves out), minus every row that overlaps an
  evaluation set. Its training is stopped after `--budget` seconds (SIGINT, which Tokenlearn handles by
  keeping the best weights) so it gets the same training wall time as a kd student; the vocabulary
  build and distill before it are not counted.

model2vec[distill] pins transformers < 5.4, so both run in their own venv (bench/out/m2v, made on first
use); kd only loads the results (the `model2vec` core package, bench extra).

    python bench/static_baselines.py --store bench/out/store-frontier --budget 900
    python bench/static_baselines.py --store bench/out/stronger/store --teacher mpnet --budget 900

Outputs are named by teacher: bench/out/model2vec-<teacher>, bench/out/tokenlearn-<teacher> (--out-dir moves them).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "out"

M2V_SCRIPT = """
import sys
from model2vec.distill import distill
distill(model_name=sys.argv[1], pca_dims=256).save_pretrained(sys.argv[2])
"""

# FIXED_PADDING: all-mpnet-base-v2's tokenizer.json pads every encoding to 128 ids (sentence-transformers
# saved it so), and model2vec encodes each corpus token beyond the teacher's own vocabulary through that
# tokenizer: 256 x 128 positions per batch instead of 256 x ~4, 6-13 instead of ~200 tokens/s on one core
# (py-spy: the batch's seq_len 128). The pads also count as tokens in model2vec's mean (its attention mask
# comes from the list lengths), so those tokens' vectors were means over mostly padding. MiniLM's
# tokenizer.json pads to 128 too (its run finished: ~1/8 of mpnet's cost per position), so Tokenlearn
# rows made before this fix started from the same damaged vectors. `distill` below is model2vec's own
# function with the tokenizer's padding off.
# Tokenlearn's train.py main(), split in two so that the time budget covers training only: the
# vocabulary build + distill (the teacher over ~64k tokens) is featurisation, not training.
TOKENLEARN_DISTILL = """
import json, sys
from model2vec.distill.distillation import distill_from_model
from tokenlearn.utils import create_vocab
from transformers import AutoModel, AutoTokenizer
teacher, data, out = sys.argv[1:4]
texts = json.load(open(f"{data}/texts.json"))
vocab = create_vocab(texts=texts, vocab_size=56000)
model, tokenizer = AutoModel.from_pretrained(teacher), AutoTokenizer.from_pretrained(teacher, use_fast=True)
tokenizer.backend_tokenizer.no_padding()  # see FIXED_PADDING
distill_from_model(model, tokenizer, vocabulary=vocab, quantize_to="float32", pca_dims=256).save_pretrained(out)
"""

TOKENLEARN_TRAIN = """
import json, sys
import numpy as np
from model2vec import StaticModel
from tokenlearn.train import train_model
init, data, out = sys.argv[1:4]
texts = json.load(open(f"{data}/texts.json"))
vecs = np.load(f"{data}/vecs.npy")
model = train_model(StaticModel.from_pretrained(init), texts, vecs, device="cpu", pca_dims=256)
model.save_pretrained(out)
"""


def venv() -> Path:
    """The model2vec[distill] + tokenlearn venv (torch from the same CPU wheel as kd's)."""
    py = OUT / "m2v" / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(OUT / "m2v")], check=True)
        pip = [str(OUT / "m2v" / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)
        subprocess.run([*pip, "model2vec[distill]", "tokenlearn==0.2.1"], check=True)
    return py


def eval_overlap_ids(store) -> np.ndarray:
    """Ids of store rows whose text (lower-cased, whitespace collapsed) is in an evaluation set."""
    import re

    from kd.apps.eval import tasks

    def norm(t: str) -> str:
        return re.sub(r"\s+", " ", t.strip().lower())

    sts_test, sts_dev, sst = tasks.load_stsb("test"), tasks.load_stsb("dev"), tasks.load_sst2()
    clus = tasks.load_cluster_set("news-articles")
    evals = {norm(t) for t in sts_test.a + sts_test.b + sts_dev.a + sts_dev.b + sst.train_texts + sst.test_texts
             + clus.dev_texts + clus.test_texts}
    texts = store.read_table("texts", ["id", "text"])
    hit = [norm(t) in evals for t in texts["text"].to_pylist()]
    return texts["id"].to_numpy()[np.asarray(hit, dtype=bool)]


def export_training_data(store_path: str, teacher: str, out: Path) -> int:
    """Store texts + `mean` vectors minus evaluation-set overlaps, as Tokenlearn's inputs."""

    from kd.storage.store import Store

    store = Store.open(store_path)
    texts = store.read_table("texts", ["id", "text"])
    vecs = store.read_table(f"teachers/{teacher}", ["mean"])
    keep = ~np.isin(texts["id"].to_numpy(), eval_overlap_ids(store))
    out.mkdir(parents=True, exist_ok=True)
    kept = [t for t, k in zip(texts["text"].to_pylist(), keep) if k]
    (out / "texts.json").write_text(json.dumps(kept))
    v = np.asarray(vecs["mean"].combine_chunks().flatten().to_numpy()).reshape(len(keep), -1)[keep]
    np.save(out / "vecs.npy", v.astype(np.float32))
    return len(kept)


def run_with_budget(cmd: list[str], budget: float) -> None:
    """Run `cmd`; after `budget` seconds send SIGINT (Tokenlearn then keeps its best weights and saves)."""
    # SIGINT back to its default in the child: a job started in the background (`cmd &`, nohup) inherits
    # SIGINT ignored, Python then installs no KeyboardInterrupt, and the budget's SIGINT would be lost
    p = subprocess.Popen(cmd, cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        p.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        p.wait()
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} exited with {p.returncode}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=str(OUT / "store-frontier"))
    ap.add_argument("--teacher", default="minilm")
    ap.add_argument("--budget", type=float, default=900.0, help="Tokenlearn training seconds")
    ap.add_argument("--out-dir", default=str(OUT))
    a = ap.parse_args()
    from kd.pipeline.teacher.resolve import resolve_teacher

    teacher_dir = resolve_teacher(a.teacher).path
    out = Path(a.out_dir)
    py = str(venv())
    m2v = out / f"model2vec-{a.teacher}"
    if not (m2v / "model.safetensors").exists():
        subprocess.run([py, "-c", M2V_SCRIPT, teacher_dir, str(m2v)], check=True)
    data = out / f"tokenlearn-data-{a.teacher}"
    n = export_training_data(a.store, a.teacher, data)
    print(f"Tokenlearn: {n} training texts (evaluation overlaps removed)", flush=True)
    init = out / f"tokenlearn-init-{a.teacher}"
    if not (init / "model.safetensors").exists():
        t0 = time.time()
        subprocess.run([py, "-c", TOKENLEARN_DISTILL, teacher_dir, str(data), str(init)], check=True)
        print(f"Tokenlearn vocabulary + distill: {time.time() - t0:.0f} s", flush=True)
    t0 = time.time()
    final = out / f"tokenlearn-{a.teacher}"
    run_with_budget([py, "-c", TOKENLEARN_TRAIN, str(init), str(data), str(final)], a.budget)
    print(f"Tokenlearn training: {time.time() - t0:.0f} s (budget {a.budget:.0f} s) -> {final}")


if __name__ == "__main__":
    main()
