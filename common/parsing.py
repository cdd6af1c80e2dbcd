"""The one way kd parses JSON and TOML it did not just write: any decode problem becomes kd's message.

A file a user hands kd (a manifest, a student's config.json, an export's modules.json, a recipe) can be
broken in more ways than bad syntax, and each surfaced as a different traceback before (issue 48):
- bytes that are not UTF-8 (`UnicodeDecodeError`);
- nesting deep enough to exhaust the parser's recursion ('[' * 100000: `RecursionError`);
- an integer of more than 4,300 digits: Python refuses to convert it (a plain `ValueError`, CVE-2020-10735's
  guard), and smaller giants are no better. No number kd reads needs more than `MAX_INT_DIGITS`, so longer
  ones are refused while parsing, before anything compares or allocates with them;
- a key named twice in one object: `json.loads` keeps the last silently, so a tokenizer_config.json saying
  `model_max_length` 64 and then 1e30 was read by transformers as the second and by a human as the first.
Both decoders' own errors (`json.JSONDecodeError`, `tomllib.TOMLDecodeError`) are `ValueError`s too.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from kd.common.errors import InputError, KdError
from kd.common.file_kinds import special_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_INT_DIGITS = 40  # past every count, size and seed kd stores (int64: 19 digits) and transformers' "no limit"
# sentinel in tokenizer_config.json (model_max_length = int(1e30): 31 digits), far below the 4,300 of the CVE
MAX_FILE_BYTES = 256 << 20  # a manifest of 100,000 shards is ~50 MiB
# A model's config.json, modules.json, a module's or a tokenizer's config: a few KB (with a label map, tens of KB)
MAX_CONFIG_BYTES = 1 << 20
_LONG_DIGITS = re.compile(rf"\d{{{MAX_INT_DIGITS + 1},}}")


class LongInteger(ValueError):
    """A JSON integer of more than MAX_INT_DIGITS digits (`bounded_int`)."""


def bounded_int(text: str) -> int:
    """json's `parse_int` for everything kd parses: a longer integer is refused before Python converts it."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise LongInteger(f"an integer of {len(text.lstrip('-'))} digits (kd reads at most {MAX_INT_DIGITS})")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) < len(keys):
        raise ValueError(f"key {next(k for k in keys if keys.count(k) > 1)!r} appears twice in one object")
    return dict(pairs)


def parse_json(text: str | bytes, where: str, fix: str, error: type[KdError] = InputError, what: str = "file"
               ) -> Any:
    """`text` parsed as JSON, or `error` naming `what` is not valid JSON (and why), `where` and `fix`."""
    try:
        return json.loads(text, parse_int=bounded_int, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:
        raise error(f"the {what} is not valid JSON ({_reason(e)})", where, fix) from None


def has_auto_map(obj: Any) -> bool:
    """Whether a parsed config holds an `auto_map` entry anywhere: transformers' pointer to Python code shipped
    beside the config, which kd never runs (received folders with one are refused)."""
    if isinstance(obj, dict):
        return "auto_map" in obj or any(has_auto_map(v) for v in obj.values())
    return isinstance(obj, list) and any(has_auto_map(v) for v in obj)


def read_json(path: str | Path, fix: str, error: type[KdError] = InputError, limit: int = MAX_FILE_BYTES) -> Any:
    """The JSON file at `path` (see `parse_json`), of at most `limit` bytes; a file that cannot be read is the same
    error."""
    p = Path(path)
    require_regular(p, fix, error)
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{p.name} cannot be read ({e.strerror or e})", str(p), fix) from None
    if len(data) > limit:
        raise error(f"{p.name} is larger than {limit >> 20} MiB, more than any such file kd reads", str(p), fix)
    return parse_json(data, str(p), fix, error, what=p.name)


def read_config(path: str | Path, fix: str, error: type[KdError] = InputError) -> Any:
    """A small JSON config of a folder kd was handed (a model's config.json, modules.json, a module's config):
    `read_json` held to MAX_CONFIG_BYTES, so a config that is /dev/zero or a huge file costs nothing."""
    return read_json(path, fix, error, MAX_CONFIG_BYTES)


def require_regular(path: str | Path, fix: str, error: type[KdError] = InputError) -> None:
    """A FIFO would block the open, /dev/zero never end: regular files only (checked without opening it)."""
    kind = special_file(path)
    if kind is not None:
        raise error(f"{Path(path).name} is not a regular file but {kind}", str(path), fix)


def check_model_folder(folder: str | Path, fix: str, error: type[KdError] = KdError) -> None:
    """A model folder kd was handed, before a library loads it: nothing in it is a pipe or a device
    (`refuse_special_files`), and each JSON file of it and of its module subfolders parses within its bound
    (configs: MAX_CONFIG_BYTES) and has no `auto_map`.

    transformers and model2vec read a config whole (a /dev/zero config ran out of memory) and skip a file that is
    not a regular one as if absent: a teacher whose tokenizer.json was /dev/zero ran on a 5-token vocabulary built
    from tokenizer_config.json, with exit 0 (issue 48's probe)."""
    root = Path(folder)
    refuse_special_files(root, fix, error)
    for sub in [root, *(p for p in _entries(root) if p.is_dir())]:
        for p in _entries(sub):
            if p.suffix == ".json" and p.is_file():
                parsed = read_json(p, fix, error, MAX_CONFIG_BYTES if "config" in p.name or p.name == "modules.json"
                                   else MAX_FILE_BYTES)
                # transformers asks on a terminal whether to run such code ("[y/N]"), and a y ran it: refused here,
                # before any library sees the folder
                if has_auto_map(parsed):
                    raise error(f"{p.name} has an auto_map entry: it points transformers at Python code in the "
                                "folder, which kd never runs", str(p), "do not load this folder: use a copy from a "
                                "source you trust (a kd export or checkpoint holds weights, JSON and tokenizer files "
                                "only)")


def refuse_special_files(folder: str | Path, fix: str, error: type[KdError] = InputError) -> None:
    """Every file under `folder` (symlinks followed to their target) a regular one: a named pipe blocks its reader
    forever, /dev/zero never ends, and a loader that skips them answers as if they were absent."""
    for dirpath, _, names in os.walk(folder):
        for name in names:
            require_regular(os.path.join(dirpath, name), fix, error)


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:  # missing or unreadable: the loader that opens it says so
        return []


def parse_toml(text: str, where: str, fix: str, error: type[KdError] = InputError) -> dict[str, Any]:
    """`text` parsed as TOML, with the same guarantees as `parse_json`. tomllib has no integer hook, so a run of
    more than MAX_INT_DIGITS digits anywhere is refused first: such an integer, or a string kd never needs."""
    try:
        if _LONG_DIGITS.search(text):
            raise ValueError(f"a number of more than {MAX_INT_DIGITS} digits (kd reads at most {MAX_INT_DIGITS})")
        return tomllib.loads(text)
    except (ValueError, RecursionError) as e:
        raise error(f"the file is not valid TOML ({_reason(e)})", where, fix) from None


def _reason(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e)[:200]
