"""Load a tokenizer folder; a file in it that cannot be parsed is an error naming that file.

transformers reports a damaged tokenizer file with the bare parser message (`Extra data: line 30686
column 2`, an invalid start byte...) and no file name; here that becomes a KdError with the file and
the caller's fix (for a store: `kd validate --repair`, then the precompute command again).
"""

from __future__ import annotations

import json
import os
from typing import Any

from kd.common.errors import KdError


def load_tokenizer(folder: str | os.PathLike, fix: str, error: type[KdError] = KdError) -> Any:
    """AutoTokenizer.from_pretrained(folder), or an `error` (a KdError) naming the damaged file.

    - Any failure to load is caught (JSON and UTF-8 errors from Python, the Rust `tokenizers` parser's
      own exception type, missing files);
    - the file named is the first JSON file of the folder that does not parse, else the folder.
    """
    from transformers import AutoTokenizer  # tokenizer only

    try:
        return AutoTokenizer.from_pretrained(os.fspath(folder))
    except Exception as e:  # noqa: BLE001 - the Rust parser raises a bare Exception subclass
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise error(f"cannot load the tokenizer ({detail})", damaged_file(folder) or os.fspath(folder), fix) from e


def damaged_file(folder: str | os.PathLike) -> str | None:
    """The first *.json file of `folder` that is not valid UTF-8 JSON, or None."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        path = os.path.join(folder, name)
        if not name.endswith(".json") or not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as f:
                json.loads(f.read().decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError, OSError):
            return path
    return None
