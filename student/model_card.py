"""The model card (README.md) a student folder carries: what it was distilled from and how to use it.

- Read from the folder's config.json (teacher target, store fingerprint, objectives, arch and sizes).
- `eval_table_markdown`: the hook for `kd eval` — a Markdown table appended under "Evaluation".
- Written atomically; rewriting it (e.g. after an evaluation) replaces the whole file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kd.storage import fs

CARD = "README.md"
BUILT_IN = ("static", "transformer-init")  # sentence-transformers modules only: plain SentenceTransformer(dir)


def write_model_card(folder: str | os.PathLike, eval_table_markdown: str | None = None) -> Path:
    """Write folder/README.md from folder/config.json (plus an evaluation table when given)."""
    path = Path(folder)
    info = json.loads((path / "config.json").read_text(encoding="utf-8"))
    text = model_card(path.name, info, eval_table_markdown)
    fs.atomic_write_bytes(fs.resolve(str(path)), text.encode("utf-8"), CARD)
    return path / CARD


def model_card(name: str, info: dict, eval_table_markdown: str | None = None) -> str:
    """The card's Markdown text."""
    cfg = info["student"]
    targets = info.get("target") or []
    targets = [targets] if isinstance(targets, str) else list(targets)  # one per target teacher
    target = ", ".join(targets) or "(none: trained on labels or pairs only)"
    teacher = ", ".join(dict.fromkeys(t.split(".", 1)[0] for t in targets)) or "see objectives"
    objectives = ", ".join(str(o) for o in info.get("objectives") or []) or "cosine"
    st_load = ('from sentence_transformers import SentenceTransformer\nmodel = SentenceTransformer("{name}-st")'
               if cfg["arch"] in BUILT_IN else
               'from kd.student import load_exported\n'
               'model = load_exported("{name}-st")   # a SentenceTransformer; never trust_remote_code=True on a '
               'received folder').format(name=name)
    size = f"{info.get('num_parameters', 0):,}"
    evaluation = eval_table_markdown.strip() if eval_table_markdown else (
        "Not evaluated yet: `kd eval --student THIS_FOLDER` writes the table here.")
    return f"""---
library_name: kd
tags: [sentence-embeddings, knowledge-distillation]
---

# {name}

A `{cfg['arch']}` sentence encoder distilled offline with kd from the precomputed outputs of teacher
**{teacher}** (target `{target}`).

| | |
|---|---|
| teacher target | `{target}` |
| store fingerprint | `{info.get('store_fingerprint')}` |
| objectives | {objectives} |
| arch | `{cfg['arch']}`, pooling `{cfg['pooling']}`, {cfg['num_layers']} layer(s) |
| widths | embed {cfg['embed_dim']}, hidden {cfg['hidden_dim']}, output {cfg['out_dim']} |
| parameters | {size} |
| max tokens | {cfg['max_length']} |
| steps | {info.get('steps', '?')} (best {info.get('best_step', '?')}) |

## Use it

With kd:

```python
from kd import student
model = student.load("{name}")
vectors = model.encode(["A sentence.", "Another one."])
```

With sentence-transformers (after `kd export {name} --format sentence-transformers --out {name}-st`):

```python
{st_load}
vectors = model.encode(["A sentence.", "Another one."])
```

With onnxruntime, no torch (after `kd export {name} --format onnx --out {name}-onnx`):

```python
from kd.student.exporters.onnx_graph import onnx_encode   # or the 15 lines of it: tokenizers + onnxruntime
vectors = onnx_encode("{name}-onnx", ["A sentence.", "Another one."])
```

## Evaluation

{evaluation}
"""
