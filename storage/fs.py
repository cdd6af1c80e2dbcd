"""Filesystem access for stores: local paths or any pyarrow filesystem URI (s3://, gs://, hdfs://).

Shards must never be seen half-written, so every write goes to a temporary name, is flushed and
fsynced (on local disks), then renamed into place. Object stores have no rename but their PUT is
atomic, so there we write the final name directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from kd.common.errors import StoreError
from kd.common.file_kinds import special_file
from kd.common.locks import try_lock
from kd.common.options import path_argument
from kd.common.paths import is_uri, plain_path
from kd.storage.names import inside, real_inside

TMP_MARK = ".tmp-"  # atomic writes go to NAME.tmp-XXXXXXXX first


@dataclass(frozen=True)
class Location:
    """A store root on a filesystem."""

    fs: pafs.FileSystem
    root: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def local_path(self, *parts: str) -> str:
        """The OS path of a file in a local store (for tools that need one, e.g. tokenizers)."""
        if not self.is_local:
            raise NotImplementedError("this operation needs a local store")
        return self.path(*parts)


def resolve(uri: str | os.PathLike | Location) -> Location:
    """Map a path or URI to a pyarrow filesystem and a root inside it (a Location is already one)."""
    if isinstance(uri, Location):
        return uri
    text = path_argument(uri, "the store", "Store.open", "a path or URI (a str or os.PathLike)")
    if is_uri(text):
        try:
            fs, root = pafs.FileSystem.from_uri(text)
        except (pa.ArrowException, OSError) as e:  # an unknown scheme (http://) was pyarrow's traceback
            raise StoreError(f"no store can be opened at this address ({e})", text, "pass a local folder, or a "
                             "URI of a filesystem pyarrow reads (s3://, gs://, hdfs://)") from None
        return Location(fs, root)
    # file: URIs by the one rule (file:/abs and file://localhost/abs were written under ./file:/ and ./localhost/)
    return Location(pafs.LocalFileSystem(), os.path.abspath(plain_path(text)))


def check_relative(rel: object, source: str, field: str) -> str:
    """`rel` if it is a plain relative path (a path that kd records in a manifest or a spec file), else a
    StoreError naming the file it was read from (`source`) and the `field` that holds it.

    - Parts separated by '/', none empty, '.' or '..'; no leading '/', no backslash, no NUL: such a path
      can only name something below the folder it is relative to (symlinks aside: see `member`).
    """
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
        raise StoreError(f"{field} is {rel!r}, not a path inside the folder (kd writes relative paths without "
                         "'..')", source, "restore this file from a copy, or re-run the kd command that wrote it")
    return rel


def member(loc: Location, rel: object, source: str, field: str) -> str:
    """The path of `rel` under `loc`, a relative path read from `source` (its `field`); refused with a
    StoreError unless it stays under the root.

    - `check_relative`: no '..', no absolute path;
    - local disks: the real path (symlinks followed) lies inside the root's real path, so a symlink that
      points out of the folder counts as outside.
    """
    check_relative(rel, source, field)
    if loc.is_local:
        target, ok = real_inside(loc.root, *str(rel).split("/"))
        if not ok:
            raise StoreError(f"{field} {rel!r} leads out of the folder (a symlink to {target})", source,
                             "replace the symlink by the file itself, or re-run the kd command that wrote it")
    path = loc.path(str(rel))
    require_regular(loc, path)  # every recorded file is read through here: a FIFO or device is refused unopened
    return path


def exists(loc: Location, *parts: str) -> bool:
    return loc.fs.get_file_info(loc.path(*parts)).type != pafs.FileType.NotFound


def makedirs(loc: Location, *parts: str) -> None:
    loc.fs.create_dir(loc.path(*parts), recursive=True)


def read_bytes(loc: Location, *parts: str) -> bytes:
    path = loc.path(*parts)
    require_regular(loc, path)
    if loc.is_local and os.path.isdir(path):  # (pyarrow's "is a directory" traceback, issue 48's probe)
        raise StoreError("a store file is a folder, not a regular file", path,
                         f"put back the file kd wrote (`kd validate {loc.root} --repair` sets a damaged record aside "
                         "and writes manifest.json again from the others), or re-run the command that wrote the store")
    with loc.fs.open_input_stream(path) as f:
        return f.read()


def require_regular(loc: Location, path: str) -> None:
    """Refuse a store file that is a named pipe or a device before opening it: a FIFO in place of a shard or
    manifest.json blocked every reader forever, /dev/zero was read until memory ran out (issue 48's probe)."""
    kind = special_file(path) if loc.is_local else None
    if kind is not None:
        raise StoreError(f"a store file is {kind}, not a regular file", path,
                         "put back the file kd wrote (kd validate STORE --repair sets damaged shards aside), or "
                         "re-run the command that wrote the store")


class FileAtFolder(StoreError):
    """A file where the store keeps a folder: no damaged record, so `kd validate --repair` has nothing to rebuild."""


def file_at_folder(rel: str, path: str) -> FileAtFolder:
    """The error naming a file at `rel`, where the store keeps a folder (`list_files`, `store.load_manifest`)."""
    if os.path.islink(path):  # (a link to a file was "a file": moving its target away left a dangling link, a probe)
        return FileAtFolder(f"the store's {rel} is a symbolic link to a file ({os.path.realpath(path)}), where kd "
                            "keeps a folder", path, "remove the link, or put back the folder kd wrote")
    return FileAtFolder(f"the store's {rel} is a file, where kd keeps a folder", path,
                        "move the file away, or put back the folder kd wrote")


def list_files(loc: Location, *parts: str) -> list[str]:
    """Names (not paths) of the files directly inside a folder; [] when it does not exist.

    pyarrow's `allow_not_found` checks whether the folder exists only after its listing failed: a folder that
    another process creates in between (two writers starting one store, `manifests/`) fails the listing with
    FileNotFoundError although it now exists (seen in CI). Listing it again is then right: it exists."""
    sel = pafs.FileSelector(loc.path(*parts), allow_not_found=True)
    try:
        infos = loc.fs.get_file_info(sel)
    except FileNotFoundError:
        infos = loc.fs.get_file_info(sel)
    except NotADirectoryError:  # (a store's manifests/ a file: "pass a folder, not a file", naming no path: a probe)
        raise file_at_folder("/".join(parts), loc.path(*parts)) from None
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)


def atomic_write_bytes(loc: Location, data: bytes, *parts: str) -> None:
    """Write bytes so that readers see either the old file or the whole new one."""
    if not loc.is_local:
        final = loc.path(*parts)
        loc.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
        with loc.fs.open_output_stream(final) as f:
            f.write(data)
        return
    publish_temp(loc, write_temp(loc, data, *parts), *parts)


def write_if_changed(loc: Location, data: bytes, *parts: str) -> bool:
    """`atomic_write_bytes` unless the file is already a regular file of exactly these bytes (a small record: a
    manifest); whether it wrote. A rerun with nothing to do then leaves the store as it found it, inode and
    mtime included, which backups, rsync and read-only snapshots see (a probe: every rerun replaced two files)."""
    if loc.is_local and _holds(loc.path(*parts), data):
        return False
    atomic_write_bytes(loc, data, *parts)
    return True


def _holds(path: str, data: bytes) -> bool:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return False
        with open(path, "rb") as f:
            return f.read() == data
    except OSError:
        return False


def write_temp(loc: Location, data: bytes, *parts: str) -> str:
    """The first half of an atomic write: `data` written (and fsynced) to `REL.tmp-XXXXXXXX` next to the final
    file `parts`, which nobody reads; returns that temp path for `publish_temp`. A failed write removes it."""
    final = loc.path(*parts)
    if loc.is_local:
        inside(loc.root, *parts)  # a name with '..' or a symlink out of the store: not even a folder made
    loc.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
    tmp = f"{final}{TMP_MARK}{uuid.uuid4().hex[:8]}"
    try:
        if loc.is_local:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        else:
            with loc.fs.open_output_stream(tmp) as f:
                f.write(data)
    except BaseException:
        # A full disk (or a kill) must not leave a half-written temp file behind taking the space.
        with contextlib.suppress(OSError):
            os.unlink(tmp) if loc.is_local else loc.fs.delete_file(tmp)
        raise
    return tmp


def publish_temp(loc: Location, tmp: str, *parts: str) -> None:
    """The second half: rename a `write_temp` file into place (atomic on local and shared POSIX disks; a
    server-side copy on object stores, whose readers see the old object or the whole new one)."""
    final = loc.path(*parts)
    if not tmp.startswith(final + TMP_MARK):
        raise ValueError(f"{tmp} is not a temp file of {final}")
    if not loc.is_local:
        loc.fs.move(tmp, final)
        return
    try:
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(os.path.dirname(final))


def remove_temps(loc: Location, owned: set[str], older_than_s: float = 3600.0) -> int:
    """Delete temp files of atomic writes that were interrupted (a kill, a full disk); returns how many.

    - A temp file `REL.tmp-XXXX` of a file `REL` this writer owns (`owned`, store-relative paths) is
      always stale: the caller holds that file's lock.
    - Any other temp file may belong to a write in progress in another process, so it is removed only
      once older than `older_than_s` (no single atomic write takes that long).
    """
    if not loc.is_local or not os.path.isdir(loc.root):
        return 0
    removed, now = 0, time.time()
    for dirpath, _, names in os.walk(loc.root):
        for name in names:
            if TMP_MARK not in name:
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, loc.root).split(TMP_MARK)[0].replace(os.sep, "/")
            with contextlib.suppress(FileNotFoundError):
                if rel in owned or now - os.path.getmtime(path) > older_than_s:
                    os.unlink(path)
                    removed += 1
    return removed


def _fsync_dir(path: str) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parquet_bytes(table: pa.Table) -> bytes:
    """Serialise a table to Parquet in memory: zstd (vectors compress poorly, ids and text well), dictionary
    encoding for every column but float vectors. Measured on an mpnet shard (3 x 768-d, 2,000 rows):
    - float vectors: a dictionary never fills before Parquet gives up on it, so trying only costs time: off,
      float32 writes in 0.071 s instead of 0.109 s and is 4 % smaller (7,120 vs 7,419 bytes a row);
    - int8 vectors (`--dtype int8`): 256 values, so the dictionary's bit-packed indices are a cheap entropy
      code: 2,102 bytes a row with it, 3,168 without."""
    plain = {f.name for f in table.schema if _float_vector(f.type)}
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", row_group_size=4096,
                   use_dictionary=[n for n in table.column_names if n not in plain])
    return sink.getvalue()


def _float_vector(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_fixed_size_list(t)):
        return False
    while pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return pa.types.is_floating(t)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a local file, streamed in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def exclusive_lock(path: str):
    """An exclusive lock on `path` (common.locks.try_lock: released when its holder dies), its folder created if
    needed; None when someone holds it. Keep the returned file open for as long as the lock is needed. A lock
    folder that is not one (a file, a link to /dev/null) is kd's error naming it."""
    folder = os.path.dirname(path) or "."
    try:
        os.makedirs(folder, exist_ok=True)
        return try_lock(path)
    except OSError as e:
        raise StoreError(f"cannot take the lock {os.path.basename(path)} ({e.strerror or e})", folder,
                         f"{folder} must be a folder kd can write in: remove what is there (kd makes it again)") \
            from None
