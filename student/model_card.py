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
from kd.student.exporters.st_fit import export_note, gap
from kd.student.models import StudentConfig
from kd.student.target import key_parts

CARD = "README.md"


def write_model_card(folder: str | os.PathLike, eval_table_markdown: str | None = None) -> Path:
    """Write folder/README.md from folder/config.json (plus an evaluation table when given)."""
    path = Path(folder)
    info = json.loads((path / "config.json").read_text(encoding="utf-8"))
    text = model_card(path.name, info, eval_table_markdown)
    fs.atomic_write_bytes(fs.resolve(str(path)), text.encode("utf-8"), CARD)
    return path / CARD


def _teachers(targets: list[str]) -> str:
    """The teachers of a saved student's target batch keys, each once."""
    return ", ".join(dict.fromkeys(key_parts(t)[0] for t in targets))


def model_card(name: str, info: dict, eval_table_markdown: str | None = None) -> str:
    """The card's Markdown text."""
    cfg = info["student"]
    targets = info.get("target") or []
    targets = [targets] if isinstance(targets, str) else list(targets)  # one per target teacher
    target = ", ".join(targets) or "(none: trained on labels or pairs only)"
    teacher = _teachers(targets) or "see objectives"
    objectives = ", ".join(str(o) for o in info.get("objectives") or []) or "cosine"
    st_load = ('from sentence_transformers import SentenceTransformer\nmodel = SentenceTransformer("{name}-st")'
               if gap(StudentConfig.from_dict(cfg)) is None else
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


def export_card(folder: Path, source: Path) -> None:
    """folder/README.md for an export of the student folder `source` (issue 49: every export has one), unless the
    export holds one already: what it is, its teacher, the scores the student's own card has (`kd eval` writes them
    there), and the one way to load this format."""
    if (folder / CARD).exists():
        return
    info = json.loads((source / "config.json").read_text(encoding="utf-8"))  # read and checked by the export's load
    cfg = info["student"]
    targets = info.get("target") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    teacher = _teachers(targets) or "see the student's card"
    onnx = (folder / "kd_onnx.json").is_file()
    said = None if onnx else export_note(StudentConfig.from_dict(cfg))
    note = "" if said is None else f"\n{said[0].upper()}{said[1:]}\n"  # what kd export printed
    if onnx:
        load = ('from kd.student.exporters.onnx_graph import onnx_encode   # tokenizers + onnxruntime, no torch\n'
                'vectors = onnx_encode("PATH/TO/THIS/FOLDER", ["A sentence.", "Another one."])')
    elif _built_in_only(folder):
        load = ('from sentence_transformers import SentenceTransformer\n'
                'model = SentenceTransformer("PATH/TO/THIS/FOLDER")\n'
                'vectors = model.encode(["A sentence.", "Another one."])')
    else:
        load = ('from kd.student import load_exported   # builds the modules itself: no trust_remote_code\n'
                'model = load_exported("PATH/TO/THIS/FOLDER")  # a SentenceTransformer\n'
                'vectors = model.encode(["A sentence.", "Another one."])')
    scores = _evaluation(source)
    text = f"""---
library_name: {"onnx" if onnx else "sentence-transformers"}
pipeline_tag: sentence-similarity
tags: [sentence-transformers, knowledge-distillation, kd]
---

# {source.name} ({"ONNX" if onnx else "sentence-transformers"} export)

A `{cfg['arch']}` sentence encoder distilled offline with kd from teacher **{teacher}**
(target `{", ".join(targets) or "none"}`): {info.get('num_parameters', 0):,} parameters, {cfg['out_dim']}-d unit
vectors, at most {cfg['max_length']} tokens a text. Exported by `kd export` from the kd student folder
`{source.name}`.

## Use

```python
{load}
```
{note}
## Evaluation

{scores}
"""
    (folder / CARD).write_text(text, encoding="utf-8")  # a plain write: the export's folder is renamed in whole


def _built_in_only(folder: Path) -> bool:
    """Whether every module of a sentence-transformers export is sentence-transformers' own (plain
    SentenceTransformer(dir) loads it)."""
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    return all(m["type"].startswith("sentence_transformers.") for m in modules)


def _evaluation(source: Path) -> str:
    """The evaluation section of the student folder's own card, when `kd eval` has filled it."""
    try:
        card = (source / CARD).read_text(encoding="utf-8")
    except OSError:
        card = ""
    section = card.split("## Evaluation", 1)[1].strip() if "## Evaluation" in card else ""
    if not section or section.startswith("Not evaluated"):
        return "Not evaluated yet: `kd eval --student STUDENT_FOLDER` scores the student this was exported from."
    return section
