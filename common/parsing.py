"""The one way kd parses JSON and TOML it did not just write: any decode problem becomes kd's message.

A file a user hands kd (a manifest, a student's config.json, an export's modules.json, a recipe) can be
broken in more ways than bad syntax, and each surfaced as a different traceback before (issue 48):
- bytes that are not UTF-8 (`UnicodeDecodeError`);
- nesting deep enough to exhaust the parser's recursion ('[' * 100000: `RecursionError`);
- an integer of more than 4,300 digits: Python refuses to convert it (a plain `ValueError`, CVE-2020-10735's
  guard), and smaller giants are no better. No number kd reads needs more than `MAX_INT_DIGITS`, so longer
  ones are refused while parsing, before anything compares or allocates with them.
Both decoders' own errors (`json.JSONDecodeError`, `tomllib.TOMLDecodeError`) are `ValueError`s too.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from kd.common.errors import InputError, KdError
from kd.common.inputs import special_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_INT_DIGITS = 30  # 10**30 exceeds every count, size and seed kd stores (int64 ids have 19 digits)
MAX_FILE_BYTES = 256 << 20  # a manifest of 100,000 shards is ~50 MiB
_LONG_DIGITS = re.compile(rf"\d{{{MAX_INT_DIGITS + 1},}}")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (kd reads at most {MAX_INT_DIGITS})")
    return int(text)


def parse_json(text: str | bytes, where: str, fix: str, error: type[KdError] = InputError, what: str = "file"
               ) -> Any:
    """`text` parsed as JSON, or `error` naming `what` is not valid JSON (and why), `where` and `fix`."""
    try:
        return json.loads(text, parse_int=_bounded_int)
    except (ValueError, RecursionError) as e:
        raise error(f"the {what} is not valid JSON ({_reason(e)})", where, fix) from None


def read_json(path: str | Path, fix: str, error: type[KdError] = InputError) -> Any:
    """The JSON file at `path` (see `parse_json`); a file that cannot be read is the same error."""
    p = Path(path)
    kind = special_file(p)  # a FIFO would block the open, /dev/zero never end: regular files only, bounded
    if kind is not None:
        raise error(f"{p.name} is not a regular file but {kind}", str(p), fix)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise error(f"{p.name} cannot be read ({e.strerror or e})", str(p), fix) from None
    if len(data) > MAX_FILE_BYTES:
        raise error(f"{p.name} is larger than {MAX_FILE_BYTES >> 20} MiB, more than any file of kd's", str(p), fix)
    return parse_json(data, str(p), fix, error, what=p.name)


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
