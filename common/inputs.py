"""Read user corpora (.txt, .jsonl, .csv/.tsv, .parquet) into plain records.

Shared by both stages: `kd precompute` builds a store's `texts` from these records and `kd finetune`
reads its training files with the same code, so a training row and its store row get the same id.

- Each file yields records with a `doc_id` ("<file name>:<row>") so every text can be traced back
  to the line it came from.
- Columns are picked by name when the file has a header (CSV with header, JSONL, Parquet) or by
  0-based index for header-less delimited files (e.g. STS-B: `--pair-columns 5,6 --label-column 4`).
- Every failure names the file, the line and the column, and says how to fix it.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from kd.common.errors import InputError
from kd.common.file_kinds import special_file
from kd.common.parsing import LongInteger, bounded_int
from kd.common.paths import plain_path

SUFFIXES = (".txt", ".jsonl", ".json", ".csv", ".tsv", ".parquet")
# The longest text kd reads, in UTF-8 bytes. A teacher reads at most 512 tokens (about 2-3 KB of text) and
# truncates the rest, so a longer text is a file that lost its line breaks, or not text: refused at once, where
# tokenizing a 20 MB line took minutes and gigabytes to give one truncated row. 1 MiB leaves long documents room.
MAX_TEXT_BYTES = 1 << 20


@dataclass(frozen=True)
class ColumnSpec:
    """Which fields of a row hold the text (or the pair) and the optional label."""

    text: str | None = None
    pair: tuple[str, str] | None = None
    label: str | None = None
    delimiter: str | None = None

    def __post_init__(self) -> None:
        # Python's csv takes one character other than a quote or a line break; anything else would end in its
        # TypeError, after the teacher has loaded
        d = self.delimiter
        if d == "\\t":  # `--delimiter '\t'` in a shell passes backslash-t: a tab is what it means
            d = "\t"
            object.__setattr__(self, "delimiter", d)
        if d is not None and (len(d) != 1 or d in '"\r\n'):
            raise InputError(f"--delimiter must be one character, not a quote or a line break (got {d!r})",
                             f"--delimiter {d!r}", "pass one character, e.g. --delimiter ';' or --delimiter $'\\t'")

    @classmethod
    def from_options(cls, text_column: str | None = None, pair_columns: str | None = None,
                     label_column: str | None = None, delimiter: str | None = None) -> ColumnSpec:
        """From the CLI's strings: `pair_columns` is "a,b" (names, or 0-based indices without header)."""
        return cls(text_column, parse_pair_columns(pair_columns), label_column, delimiter)

    @property
    def texts(self) -> list[str]:
        """The columns that hold text (one, or the two of a pair)."""
        return list(self.pair) if self.pair else [self.text or "text"]

    @property
    def wanted(self) -> list[str]:
        cols = list(self.pair) if self.pair else [self.text or "text"]
        return cols + ([self.label] if self.label else [])


@dataclass
class Records:
    """Column-wise records read from the inputs (texts is a list of str, or of (a, b) pairs)."""

    texts: list = field(default_factory=list)
    labels: list = field(default_factory=list)
    doc_ids: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)


def parse_pair_columns(pair_columns: str | None) -> tuple[str, str] | None:
    return None if pair_columns is None else two_columns(pair_columns.split(","), "--pair-columns")


def two_columns(columns: Sequence[str], flag: str) -> tuple[str, str]:
    """The two text columns of a pair file (precompute's --pair-columns, eval's --text-columns): two, distinct."""
    cols = [str(c).strip() for c in columns]
    given = ",".join(map(str, columns))
    if len(cols) != 2 or not all(cols):
        raise InputError(f"{flag} needs two columns, got {given!r}", None, "write it as a,b")
    if cols[0] == cols[1]:  # every pair would be a text with itself (the sixth and seventh probes)
        raise InputError(f"{flag} names the same column twice ({given!r})", None,
                         "name the two columns that hold each pair's texts, e.g. sentence1,sentence2")
    return cols[0], cols[1]


def expand_inputs(patterns: list[str]) -> list[str]:
    """Expand globs, keep the user's order, refuse missing files and unknown formats."""
    files: list[str] = []
    seen: dict[str, str] = {}  # real path -> how it was first named
    for pat in map(plain_path, patterns):  # (a Python caller's Path objects too; a file: URI as its path)
        hits = sorted(glob.glob(pat)) if any(c in pat for c in "*?[") else [pat]
        if not hits:
            raise InputError("no file matches the pattern", pat, "check the path or quote the glob")
        for path in hits:
            require_regular_file(path)
            if not path.lower().endswith(SUFFIXES):
                raise InputError(
                    "unsupported input format", path,
                    f"use one of {', '.join(SUFFIXES)} (.txt: one text a line, or delimited when columns are given)"
                )
            real = os.path.realpath(path)
            if real in seen:  # its rows would be read twice (a glob overlapping a named file, a path typed twice)
                raise InputError(f"the same input file is given twice (as {seen[real]!r} and {path!r})", path,
                                 "pass each file once (check overlapping globs)")
            seen[real] = path
            files.append(path)
    if not files:
        raise InputError("no input files given", None, "pass one or more files: kd precompute corpus.txt ...")
    return files


def require_regular_file(path: str, what: str = "the input") -> None:
    """Refuse an input that is missing, a folder, or not a regular file: a named pipe would block the read (and its
    bytes could not be hashed and then read again), a device such as /dev/zero never ends. `what`: how the message
    names the file (e.g. "--exclude-ids"); every file kd opens by a user's path goes through here first."""
    kind = special_file(path)
    if kind is not None:
        raise InputError(f"{what} is not a regular file but {kind}", path,
                         "save what it gives to a file (e.g. cat SOURCE > corpus.txt) and pass that file")
    if os.path.isdir(path):
        raise InputError(f"{what} is a folder, not a file", path,
                         "pass the files in it, e.g. 'DIR/*.txt'" if what == "the input" else "pass a file")
    if not os.path.isfile(path):
        raise InputError("input file not found" if what == "the input" else f"{what}: file not found", path,
                         "check the path")


def read_inputs(files: list[str], spec: ColumnSpec, documents: bool = False) -> Records:
    """Read every file into one Records (texts stay raw; empties are dropped later and counted).

    Each text is held to MAX_TEXT_BYTES, unless `documents`: texts that are split into sentences before a teacher
    reads them (`kd precompute --segment sentences`, whose sentences are held to it instead)."""
    rec = Records()
    for path in files:
        require_regular_file(path)
        name = os.path.basename(path)
        for row, fields in _rows(path, spec):
            text = (str(fields[0]), str(fields[1])) if spec.pair else fields[0]
            if not documents:
                require_text_size(text if spec.pair else (text,), path, row)
            rec.texts.append(text)
            rec.labels.append(fields[-1] if spec.label else None)
            rec.doc_ids.append(f"{name}:{row}")
            rec.sources.append(name)
    return rec


def require_text_size(texts: Iterable[object], where: str, row: int | None = None) -> None:
    """Refuse a text of more than MAX_TEXT_BYTES (see there) found at `where` (its file), line or row `row`."""
    for text in texts:
        # a str's UTF-8 length lies between len(text) and 4 * len(text): encoded only when that leaves a doubt
        if isinstance(text, str) and len(text) > MAX_TEXT_BYTES // 4 and (
                len(text) > MAX_TEXT_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES):
            raise InputError(f"a text of {len(text):,} characters, over kd's limit of {MAX_TEXT_BYTES >> 20} MiB of "
                             "UTF-8: a teacher reads only its first 512 tokens (a few KB), so this is a file that "
                             "lost its line breaks, or not text", where if row is None else f"{where}:{row}",
                             "split it into lines (one text a line, or --segment sentences for documents), or drop it")


def _rows(path: str, spec: ColumnSpec) -> Iterator[tuple[int, list]]:
    low = path.lower()
    _check_column_options(path, spec)
    if low.endswith(".txt") and not _has_columns(spec):
        yield from ((n, [line]) for n, line in _text_lines(path))
    elif low.endswith((".jsonl", ".json")):
        yield from _jsonl_rows(path, spec)
    elif low.endswith(".parquet"):
        yield from _parquet_rows(path, spec)
    else:
        yield from _delimited_rows(path, spec)


def _has_columns(spec: ColumnSpec) -> bool:
    return bool(spec.text or spec.pair or spec.label or spec.delimiter)


def _check_column_options(path: str, spec: ColumnSpec) -> None:
    """Refuse column options a file cannot honour, instead of silently ignoring them.

    - JSONL and Parquet have named fields, not separators: --delimiter is refused;
    - a .txt file is one text a line; with a column option it is read as delimited (MRPC's tab-separated
      .txt files), which needs a separator: --delimiter, or a tab on its first line. A .txt without
      either has no columns, so the option is refused rather than the whole line kept as the text.
    """
    low = path.lower()
    if spec.delimiter and low.endswith((".jsonl", ".json", ".parquet")):
        raise InputError("--delimiter applies to delimited files (.csv, .tsv, .txt with columns), not to "
                         f"{os.path.splitext(low)[1]} files, whose fields are named", path, "drop --delimiter")
    if not low.endswith(".txt") or not _has_columns(spec) or spec.delimiter:
        return
    if b"\t" not in _first_line(path):
        given = [flag for flag, v in (("--text-column", spec.text), ("--pair-columns", spec.pair),
                                      ("--label-column", spec.label)) if v]
        raise InputError(f"{', '.join(given)} picks columns, but this .txt file has none (no tab on its first "
                         "line): it is read as one text a line", f"{path}:1",
                         f"drop {', '.join(given)}, or pass --delimiter for a file with another separator")


def _raw_lines(f: BinaryIO) -> Iterator[bytes]:
    """The lines of a file opened in binary, without their ends: a line ends at \\n, \\r\\n or a lone \\r (old Mac
    files), as Python's text mode and the csv reader of delimited files split them."""
    for chunk in f:  # a binary file splits at \n only
        body = chunk.rstrip(b"\n")
        if b"\r" not in body:
            yield body
        else:  # (a \r ending the chunk ended its last line, alone or before the \n)
            yield from (body[:-1] if body.endswith(b"\r") else body).split(b"\r")


def _first_line(path: str) -> bytes:
    with open(path, "rb") as f:
        return next(_raw_lines(f), b"")


def _text_lines(path: str) -> Iterator[tuple[int, str]]:
    with open(path, "rb") as f:
        for n, raw in enumerate(_raw_lines(f), start=1):
            line = _decode(raw, path, n)
            # A byte-order mark is encoding, not text: kept, it would give the first line another id.
            yield n, line.removeprefix("\ufeff") if n == 1 else line


def _decode(raw: bytes, path: str, line: int) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"the file is not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})",
                         f"{path}:{line}", reencode_fix(path)) from None
    if "\0" in text:  # no text holds NUL: a binary file, or UTF-16 re-encoded as if it were latin1
        raise InputError("the line holds NUL characters: not a text file, or a UTF-16 one read as 8-bit",
                         f"{path}:{line}", "pass a text file; one written as UTF-16 converts with iconv -f utf-16 -t "
                         "utf-8 ORIGINAL > OUT (from the original file, not one re-encoded already)")
    return text


_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def reencode_fix(path: str) -> str:
    """How to make `path` UTF-8: from UTF-16 where its first bytes say so (a byte-order mark, or NULs between
    ASCII letters), else from latin1 (the usual 8-bit legacy)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        head = b""
    source = "utf-16" if head.startswith(_UTF16_BOMS) or head[1:8:2] == b"\0\0\0\0" or head[0:8:2] == b"\0\0\0\0" \
        else "latin1"
    return f"re-encode it, e.g. iconv -f {source} -t utf-8 IN > OUT"


class _DuplicateKey(ValueError):
    def __init__(self, key: str, times: int) -> None:
        super().__init__(key)
        self.key, self.times = key, times


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's dict, refusing a key named twice: json.loads keeps the last value silently, so a line
    `{"text": "a", "text": "b"}` would store "b" with no word."""
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise _DuplicateKey(dup, keys.count(dup))
    return dict(pairs)


def _jsonl_rows(path: str, spec: ColumnSpec) -> Iterator[tuple[int, list]]:
    for n, line in _text_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_unique_keys, parse_int=bounded_int)
        except LongInteger as e:
            raise InputError(f"a number on this line is too long: {e}", f"{path}:{n}",
                             "write such a number as a JSON string, or leave it out") from None
        except _DuplicateKey as e:
            raise InputError(f"key {e.key!r} appears {e.times} times in one JSON object (JSON keeps only the last)",
                             f"{path}:{n}", "name each key once per line") from None
        except json.JSONDecodeError as e:
            raise InputError(f"invalid JSON ({e.msg})", f"{path}:{n}", "each line must be one JSON object") from None
        except (ValueError, RecursionError) as e:  # a number past Python's digit limit, nesting too deep
            raise InputError(f"invalid JSON ({e})", f"{path}:{n}", "each line must be one JSON object") from None
        if not isinstance(obj, dict):
            raise InputError("a JSONL line must be an object", f"{path}:{n}", 'write lines like {"text": "..."}')
        missing = [c for c in spec.wanted if c not in obj]
        if missing:
            raise InputError(f"column {missing[0]!r} not in this line (keys: {', '.join(obj)})", f"{path}:{n}",
                             "pass --text-column / --pair-columns / --label-column with one of those keys")
        # A number, list or object as the text is a mistake worth stopping for; null is a missing text and
        # is dropped and counted like an empty one (as a Parquet null is).
        bad = [c for c in spec.texts if obj[c] is not None and not isinstance(obj[c], str)]
        if bad:
            raise InputError(f"the text field {bad[0]!r} is a {type(obj[bad[0]]).__name__}, not a string",
                             f"{path}:{n}", "quote it in the JSON, or pick the text column with --text-column")
        _refuse_surrogates(obj, spec.wanted, f"{path}:{n}")
        yield n, [obj[c] if obj[c] is not None else "" for c in spec.wanted]


def _refuse_surrogates(obj: dict, columns: list[str], where: str) -> None:
    """JSON's \\ud800-style escapes can encode half of a UTF-16 pair: a string Python holds but UTF-8 (the
    store, the tokenizer) cannot, which would fail far from this line."""
    for c in columns:
        v = obj[c]
        if not isinstance(v, str):
            continue
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"the field {c!r} holds a lone surrogate ({v[e.start]!r} at character {e.start + 1}): "
                             "half of a UTF-16 pair, which is not text", where,
                             "fix the escape on that line (a \\ud83d\\ude00-style pair, or the character itself)"
                             ) from None


def _parquet_rows(path: str, spec: ColumnSpec) -> Iterator[tuple[int, list]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"not a readable Parquet file ({e})", path, "check the file (truncated or not Parquet)") from e
    names = schema.names
    missing = [c for c in spec.wanted if c not in names]
    if missing:
        raise InputError(f"column {missing[0]!r} not found (columns: {', '.join(names)})", path,
                         "pass --text-column / --pair-columns / --label-column with one of those")
    refuse_duplicate_columns(names, spec, path)
    for c in spec.texts:
        t = schema.field(c).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)):
            raise InputError(f"the text column {c!r} has type {t}, not string", path,
                             "pick a string column with --text-column, or cast it to string first")
    cols = pq.read_table(path, columns=spec.wanted).to_pydict()
    for i in range(len(cols[spec.wanted[0]])):
        yield i + 1, [cols[c][i] if cols[c][i] is not None else "" for c in spec.wanted]


def refuse_duplicate_columns(names: list[str], spec: ColumnSpec, where: str) -> None:
    """A column kd reads must be named once: of two `text` columns, which one holds the texts cannot be told (a
    duplicate that is not read does no harm)."""
    dup = next((c for c in spec.wanted if names.count(c) > 1), None)
    if dup is not None:
        raise InputError(f"the column {dup!r} appears {names.count(dup)} times (columns: "
                         f"{', '.join(names)}): which one holds the values cannot be told", where,
                         "give each column its own name, or pick another with --text-column / --pair-columns / "
                         "--label-column")


def _delimited_rows(path: str, spec: ColumnSpec) -> Iterator[tuple[int, list]]:
    """CSV/TSV (and .txt read with columns, e.g. MRPC): header or not by whether the wanted columns are
    names or 0-based indices."""
    csv.field_size_limit(sys.maxsize)
    first = _decode(_first_line(path), path, 1)
    delim = spec.delimiter or ("\t" if ("\t" in first or path.lower().endswith(".tsv")) else ",")
    by_index = all(c.isdigit() for c in spec.wanted)
    # Tab-separated files such as STS-B contain bare quotes inside sentences: quoting off.
    quoting = csv.QUOTE_NONE if delim == "\t" else csv.QUOTE_MINIMAL
    # utf-8-sig: a byte-order mark (MRPC has one) must not become part of the first column's name
    with open(path, encoding="utf-8-sig", newline="", errors="strict") as f:
        lines = _Recorder(f)
        reader = csv.reader(lines, delimiter=delim, quoting=quoting)
        try:
            if by_index:
                idx = [int(c) for c in spec.wanted]
            else:
                header = next(reader, None)
                if header is None:
                    return
                missing = [c for c in spec.wanted if c not in header]
                if missing:
                    raise InputError(
                        f"column {missing[0]!r} not in the header (columns: {', '.join(header)})",
                        f"{path}:1",
                        _delimiter_hint(header, delim) + "pass --text-column/--pair-columns/--label-column with "
                        "a header name, or 0-based indices for files without a header",
                    )
                refuse_duplicate_columns(header, spec, f"{path}:1")
                idx = [header.index(c) for c in spec.wanted]
            ncols = len(header) if not by_index else max(idx) + 1
            start = reader.line_num + 1
            lines.take()
            for row in reader:
                raw = lines.take()
                if row:
                    _check_quoted_fields(row, idx[: len(spec.texts)], delim, ncols, path, start, reader.line_num,
                                         raw)
                    if quoting != csv.QUOTE_NONE and '"' in raw:  # cheap first: most records hold no quote
                        _check_closed_quotes(raw, delim, f"{path}:{start}")
                    if not by_index and len(row) > ncols:
                        raise extra_fields_error(len(row), ncols, delim, f"{path}:{reader.line_num}")
                    if max(idx) >= len(row):
                        raise InputError(f"row has {len(row)} fields, column {max(idx)} is missing",
                                         f"{path}:{reader.line_num}", "fix the row or choose other columns")
                    yield reader.line_num, [row[i] for i in idx]
                start = reader.line_num + 1
        except UnicodeDecodeError as e:
            raise InputError("the file is not UTF-8", f"{path} (near line {reader.line_num + 1})",
                             reencode_fix(path)) from e


MAX_QUOTED_FIELD = 100_000  # characters; far beyond any encoder's input, so only a runaway quote gets there


class _Recorder:
    """The lines a csv reader pulls from a file, kept until `take()`: the raw text of the last record.

    csv.reader asks for one line at a time and never reads ahead, so the lines taken after a row are
    exactly the ones that row was parsed from."""

    def __init__(self, f) -> None:
        self.f, self.lines = f, []

    def __iter__(self) -> _Recorder:
        return self

    def __next__(self) -> str:
        line = next(self.f)
        self.lines.append(line)
        return line

    def take(self) -> str:
        raw, self.lines = "".join(self.lines), []
        return raw


def _badly_quoted(raw: str, delim: str) -> str | None:
    """Why the raw text of one record is not well-formed CSV (strict: a quote left open at the end of the
    file, or a closing quote followed by more text), or None when it is."""
    try:
        for _ in csv.reader(io.StringIO(raw, newline=""), delimiter=delim, strict=True):
            pass
    except csv.Error as e:
        return "the quote is never closed" if "end of data" in str(e) else f"it is closed mid-field ({e})"
    return None


def _check_closed_quotes(raw: str, delim: str, where: str) -> None:
    """Refuse a record whose quoted field is closed mid-field (`"a stray "quote" inside`): the csv module keeps
    going silently and stores `a stray quote" inside`, a text the file does not hold. The same rule for one
    column as for several, and for `kd finetune`'s files, which this reader reads too."""
    why = _badly_quoted(raw, delim)
    if why:
        raise InputError(f"a quoted field on this line is not well-formed CSV ({why}): read on, its text would "
                         "lose a quote and keep what follows it", where,
                         'write a quote inside a quoted field as "" (e.g. "a ""quoted"" word"), or do not start '
                         "the field with a quote; a file without quoted fields can be saved tab-separated (.tsv: "
                         "read with quoting off)")


def extra_fields_error(fields: int, ncols: int, delim: str, where: str) -> InputError:
    """A row with more fields than its header: one field holds an unquoted delimiter (every delimited reader)."""
    return InputError(f"row has {fields} fields, the header {ncols}: a field holds an unquoted {delim!r}, and its "
                      "text would be cut there", where, _extra_fields_fix(delim))


def _extra_fields_fix(delim: str) -> str:
    if delim == "\t":  # read with quoting off (STS-B's bare quotes): a tab cannot be inside a field
        return "remove the tab from that field (or replace it by a space)"
    return (f'quote the field ("Hello{delim} world"), or pass --delimiter with the character that separates the '
            "columns")


SEPARATORS = ";|\t,"  # what a one-column header that should have been several is usually split by


def _delimiter_hint(header: list[str], delim: str) -> str:
    """'this file looks separated by X: pass --delimiter X; ' when the header read as one column holds X."""
    if len(header) != 1:
        return ""
    found = [c for c in SEPARATORS if c != delim and c in header[0]]
    if not found:
        return ""
    flag = "$'\\t'" if found[0] == "\t" else f"'{found[0]}'"
    return (f"the header is one column holding {found[0]!r}: if that separates the columns, pass --delimiter "
            f"{flag}; else ")


def _check_quoted_fields(row: list[str], text_idx: list[int], delim: str, ncols: int, path: str, start: int,
                         end: int, raw: str) -> None:
    """Refuse a text field that a stray quote made swallow the following rows (the csv module does so silently).

    - Only a quoted field can span lines, so a text field holding a newline started with a quote on
      line `start` and ran to line `end`.
    - It is a runaway quote when its record (`raw`) is not well-formed CSV: the quote never closes (it
      ran to the end of the file) or closes mid-field on a later line (at a quote that was text); when it
      is longer than MAX_QUOTED_FIELD; or, in a file of several columns, when one of its lines looks like
      a row of its own (it holds the delimiter at least ncols - 1 times). In a one-column file every line
      looks like a row and a comma is why a text is quoted, so there only the first two tell.
    - A quoted multi-line text that is well-formed and whose lines do not look like rows (a paragraph) is kept.
    """
    for i in text_idx:
        field = row[i] if i < len(row) else ""
        if "\n" not in field:
            continue
        lines = field.splitlines()
        rowlike = [ln for ln in lines if ln.count(delim) >= ncols - 1] if ncols > 1 else []
        if rowlike:
            why = f"{len(rowlike)} of its {len(lines)} lines look like rows of their own (e.g. {rowlike[0][:60]!r})"
        elif len(field) > MAX_QUOTED_FIELD:
            why = f"it is {len(field):,} characters long"
        else:
            why = _badly_quoted(raw, delim)
        if why:
            raise InputError(
                f"a quote opened on line {start} runs to line {end}: one text field swallowed those lines ({why})",
                f"{path}:{start}",
                'fix the stray quote on that line (close it, or write a literal quote as "" inside a quoted '
                "field); a file without quoted fields can be saved tab-separated (.tsv: read with quoting off), "
                "and --delimiter picks the separator",
            )
