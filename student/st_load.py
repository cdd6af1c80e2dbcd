"""`load_exported(dir)`: a sentence-transformers export of a kd student, loaded without running code the folder names.

sentence-transformers imports each module class that `modules.json` names; from 6.0 any class outside its
own package needs `trust_remote_code=True`, and with it the folder decides what runs: a received folder
with a planted `.py` file and an edited `modules.json` (or a config's `auto_map`) executes that file.
kd's recurrent, convolutional, feed-forward and small-transformer students need one class of kd's own
(`KdTokenEncoder`, see student/st_module.py), so their exports would need that flag; this loader makes it
unnecessary for every arch:

- the folder is checked first, before anything is imported or loaded: every `modules.json` type must be a
  `sentence_transformers.*` class or exactly `kd.student.st_module.KdTokenEncoder`, every module path must
  stay inside the folder, and the folder must hold no Python file, no pickle, no `auto_map` entry, no symlink
  leading out of it and nothing but folders and regular files (a kd export never has any, `saved.check_received`);
  anything else is refused with a KdError that names it;
- each module is built by its class's own `load(...)` classmethod, with `trust_remote_code=False` and
  local files only; kd's class is taken from kd itself, never imported by the name in the folder;
- the modules are assembled with `SentenceTransformer(modules=[...])` and the saved similarity function
  and prompts, so `encode` gives what `SentenceTransformer(dir)` would (the student's vectors).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from kd.common.errors import InputError
from kd.common.finite import first_non_finite
from kd.common.options import path_argument
from kd.common.parsing import has_auto_map, read_config, read_json
from kd.student.saved import check_received

KD_MODULE = "kd.student.st_module.KdTokenEncoder"
ST_PREFIX = "sentence_transformers."
CODE_SUFFIXES = (".py", ".pyc", ".so")  # what Python would import
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")  # what torch.load would unpickle
REFUSED = "do not load this folder: a kd export holds safetensors, JSON and tokenizer files only"
SETTINGS = "config_sentence_transformers.json"
AGAIN = "copy the export folder again, or export the student again"


def load_exported(path: str | os.PathLike, device: str = "cpu"):
    """A `SentenceTransformer` from a `kd export --format sentence-transformers` folder (any arch), built
    without `trust_remote_code` and without importing anything the folder names (see the module docstring)."""
    from sentence_transformers import SentenceTransformer

    root = Path(path_argument(path, "path", "kd.student.load_exported"))
    entries = check_export(root)
    settings = _model_settings(root)
    modules = [_load_module(root, e) for e in entries]
    for e, module in zip(entries, modules):
        _refuse_non_finite(root / e["path"], module)
    try:
        return SentenceTransformer(modules=modules, device=device, **settings)
    except ValueError as e:  # a value sentence-transformers refuses (similarity function, default prompt)
        raise InputError(f"{SETTINGS} holds a setting sentence-transformers refuses ({str(e)[:300]})",
                         str(root / SETTINGS), AGAIN) from e


def _load_module(root: Path, entry: dict[str, Any]) -> Any:
    """One module, built by its class's own `load` from local files, without remote code."""
    try:
        return _module_class(entry["type"]).load(str(root), subfolder=entry["path"], local_files_only=True,
                                                 trust_remote_code=False)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, SafetensorError) as e:  # junk files
        raise InputError(f"the module {entry['path'] or '(the top folder)'} of the export cannot be built from its "
                         f"files ({str(e)[:300]})", str(root / entry["path"]), AGAIN) from e


def _refuse_non_finite(folder: Path, module: Any) -> None:
    """The bar `kd.student.load` sets: weights holding NaN/Inf (a diverged run) would make every vector NaN."""
    bad = first_non_finite(module.state_dict())
    if bad is not None:
        raise InputError(f"the exported weights hold NaN/Inf values ({bad}): the student's training diverged",
                         str(folder), "retrain the student with a lower learning rate and export it again")


def check_export(root: Path) -> list[dict[str, Any]]:
    """The `modules.json` entries of an export folder, after refusing anything that could run code."""
    listing = root / "modules.json"
    if not listing.is_file():
        raise InputError("no sentence-transformers export here (no modules.json)", str(root),
                         "point at the --out folder of kd export --format sentence-transformers")
    check_received(root, AGAIN)
    return check_listing(root)


def check_listing(root: Path) -> list[dict[str, Any]]:
    """The `modules.json` entries of a received folder (none without one), after refusing code anywhere in it
    (Python, pickles, auto_map) and any entry naming a class kd does not load or a path outside the folder. Also
    for folders another library loads (a model2vec --baseline-dir), which would not read modules.json at all: what
    a folder says about itself is checked the same wherever it is received."""
    listing = root / "modules.json"
    _refuse_code_files(root)
    if not listing.is_file():
        return []
    entries = read_config(listing, AGAIN)
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise InputError("modules.json is not a list of modules", str(listing), REFUSED)
    for e in entries:
        _check_entry(root, e, listing)
    return entries


def _refuse_code_files(root: Path) -> None:
    """No Python, no pickle, no `auto_map` (transformers' pointer to code in the repository) anywhere."""
    for p in sorted(root.rglob("*")):
        if p.suffix in CODE_SUFFIXES or p.suffix in PICKLE_SUFFIXES:
            kind = "Python code" if p.suffix in CODE_SUFFIXES else "a pickle (loading it can run code)"
            raise InputError(f"the export folder holds {kind}: {p.relative_to(root)}", str(p), REFUSED)
        if p.suffix == ".json" and p.is_file() and has_auto_map(_read_json(p)):
            raise InputError("a config in the export folder has an auto_map entry (it points transformers at "
                             f"code to import): {p.relative_to(root)}", str(p), REFUSED)


def _check_entry(root: Path, entry: dict[str, Any], listing: Path) -> None:
    ref, sub = entry.get("type"), entry.get("path")
    if not isinstance(ref, str) or not (ref == KD_MODULE or (ref.startswith(ST_PREFIX) and _is_dotted(ref))):
        raise InputError(f"modules.json names the class {ref!r}, which is neither sentence-transformers' nor "
                         f"kd's {KD_MODULE}: loading it would run code chosen by the folder", str(listing), REFUSED)
    inside = root.resolve()
    if not isinstance(sub, str) or not (inside / sub).resolve().is_relative_to(inside):
        raise InputError(f"modules.json points a module outside the folder ({sub!r})", str(listing), REFUSED)


def _is_dotted(ref: str) -> bool:
    return all(part.isidentifier() for part in ref.split("."))


def _module_class(ref: str) -> type:
    """kd's class from kd; a sentence-transformers class from its installed package."""
    if ref == KD_MODULE:
        from kd.student.st_module import KdTokenEncoder  # lazy: sentence-transformers (seconds), for kd's own module

        return KdTokenEncoder
    module, _, name = ref.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise InputError(f"this sentence-transformers has no module class {ref!r}", ref,
                         "install the sentence-transformers version the export was written with (>= 6.2)") from e
    if not isinstance(cls, type) or not callable(getattr(cls, "load", None)):
        raise InputError(f"{ref!r} is not a sentence-transformers module class", ref, REFUSED)
    return cls


def _model_settings(root: Path) -> dict[str, Any]:
    """Similarity function and prompts saved with the model (what `SentenceTransformer(dir)` restores), each of
    its JSON type (their values are sentence-transformers' to check)."""
    path = root / SETTINGS
    saved = read_config(path, AGAIN) if os.path.lexists(path) else {}  # a pipe or device refused, not skipped
    if not isinstance(saved, dict):
        raise InputError(f"{SETTINGS} is not a JSON object", str(path), AGAIN)
    settings = {k: saved[k] for k in ("similarity_fn_name", "prompts", "default_prompt_name")
                if saved.get(k) is not None}
    for key, value in settings.items():
        if not _setting_ok(key, value):
            want = "an object of prompt names and texts" if key == "prompts" else "a string"
            raise InputError(f"{SETTINGS}'s {key} is {value!r}, not {want}", str(path), AGAIN)
    return settings


def _setting_ok(key: str, value: Any) -> bool:
    if key != "prompts":
        return isinstance(value, str)
    return isinstance(value, dict) and all(isinstance(text, (str, type(None))) for text in value.values())


def _read_json(path: Path) -> Any:
    return read_json(path, AGAIN)
