"""`kd precompute --engine ray`: the same store, its (shard, teacher) units encoded by a pool of Ray actors.

What the driver (the `kd precompute` process) does, and what the workers do:
- The driver validates the options, reads + segments the inputs ONCE, plans shards exactly as the one-process
  engine (`plan.ShardPlan`, as writer 0 of 1: every shard) and opens the store as writer `writer-00000-of-00001`,
  the one-process writer id. It commits the `texts` shards itself, and the per-teacher files (tokenizer, input
  embeddings, `vocab`, `init`) from a CPU copy of each teacher.
- Every (teacher, shard) not yet committed is a unit (`plan_units`, pure). Units go teacher-major to a pool of
  Ray actors (`UnitWorker`), one unit at a time to whichever actor is free: fast workers take more. An actor holds
  one teacher, loaded once (a retried unit of an earlier teacher may reload it). On GPU clusters each actor
  reserves `--gpus-per-worker` GPUs (Ray sets CUDA_VISIBLE_DEVICES: it runs on cuda:0 of what it sees); on CPU
  each reserves a thread budget (`plan_workers`), applied with torch.set_num_threads.
- A worker reads its unit's `texts` shard from the store (verified against the sha256 the driver passes), encodes
  it with the one-process code (`precompute.encode_shard`), serialises the Parquet bytes and writes them, fsynced,
  to a TEMP file next to the shard (`fs.write_temp`), and returns (temp path, rows, bytes, sha256).
- The commit stays with the driver, alone: it renames the temp file into place and records the shard in its
  fragment (`StoreWriter.adopt`), the same two steps as a one-process commit. So:
  * atomicity: readers see a shard only once the driver renamed a complete, fsynced file and recorded it; a worker
    that dies mid-write leaves at most a temp file, which nobody reads and the next run (or the end of this one)
    deletes;
  * no unit is committed twice: a unit is in flight on at most one actor, it is resubmitted only once the driver
    has seen that actor die (RayActorError: killed, OOM, lost node; the actor is replaced), and a result for a unit
    already committed would be refused. Only the driver renames into final names, so a presumed-dead worker that
    still finishes cannot overwrite a committed shard;
  * the store is indistinguishable from a one-process store: same fragment, same ids, rows, Parquet bytes
    (`fs.parquet_bytes`) and checksums for equal values (equal thread counts give equal values on CPU);
  * resume: a killed driver takes its actors with it (Ray ends a job's actors); the same command resumes from
    the committed units, with either engine.
- The bulk data never goes through the driver (workers read texts and write vectors on the store), so the store
  must be reachable at the same path or URI from every node: a shared disk (NFS, Lustre) or an object store.
- Settings (precision, backend, fidelity) come from the workers' own teachers: each result carries its meta and
  must agree with what the table was declared with.
- A job with no worker encoding and none starting for KD_RAY_START_TIMEOUT seconds (default 600: Ray cannot place
  the actors) stops with a clear error; what was committed stays, and the same command resumes.
- External processes, bounded: a --ray-address (or RAY_ADDRESS) where nothing accepts a TCP connection within
  PROBE_TIMEOUT_S is refused before anything is read (ray.init would retry it for many minutes); SIGINT/SIGTERM
  stop the driver within seconds, killing the actors and shutting down the Ray runtime it started; and a local
  runtime kd started is watched by `ray_reaper.py`, which ends its processes (Ray's agents otherwise outlive a
  killed driver by a minute or more) as soon as the driver is gone, even killed by SIGKILL.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kd.common import bounds as B
from kd.common.errors import InputError, KdError, StoreError
from kd.pipeline.plan import ShardPlan
from kd.storage import fs
from kd.storage.manifest import Manifest, ShardRecord, same_settings
from kd.storage.store import Store, shard_file

ENGINES = B.choices(B.Engine)
MAX_ATTEMPTS = 3  # a unit whose worker died this many times stops the job (it likely kills workers: memory)
# The environment a worker needs from the driver. KD_RAY_TEST_DIE_ONCE is the tests' fault hook: a worker that
# removes this file exits at once after writing its unit's temp file (exactly one worker dies, mid-unit).
FORWARD_ENV = ("KD_CPU_BF16", "KD_RAY_TEST_DIE_ONCE")
# How long the driver waits when no worker is encoding and none has become ready (started and loaded its
# teacher): an actor Ray cannot place (a lost node, a cluster without room for its CPUs/GPUs) stays pending
# forever, and the job would hang without a word. Loading a large teacher from a slow disk can take minutes.
START_TIMEOUT_ENV = "KD_RAY_START_TIMEOUT"
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RayOptions:
    address: str | None
    workers: int | None
    gpus_per_worker: float | None
    device: str | None  # None (GPU when the cluster has one), cpu or cuda


def options(engine: str, address: str | None, workers: int | None, gpus_per_worker: float | None,
            num_shards: int | None, shard_index: int | None, device: str | None) -> RayOptions | None:
    """Check the engine flags before anything is read or loaded; None for the one-process engine."""
    if engine not in ENGINES:
        raise InputError(f"unknown --engine {engine!r}", "--engine", "use local (one process) or ray")
    given = [f for f, v in (("--ray-address", address), ("--workers", workers),
                            ("--gpus-per-worker", gpus_per_worker)) if v is not None]
    if engine == "local":
        if given:
            raise InputError(f"{', '.join(given)} only applies to --engine ray", given[0],
                             f"add --engine ray, or drop {', '.join(given)}")
        return None
    if num_shards is not None or shard_index is not None:
        raise InputError("--engine ray assigns shards to its workers itself; --num-shards/--shard-index split a "
                         "store between independent processes", "--engine ray",
                         "drop --num-shards/--shard-index (use --workers N), or drop --engine ray")
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise InputError("--engine ray runs one driver; this process is one rank of a torchrun job "
                         f"(WORLD_SIZE={os.environ['WORLD_SIZE']})", "--engine ray",
                         "start kd precompute --engine ray once, without torchrun")
    B.check("--engine ray", ("--workers", workers, B.RAY_WORKERS), ("--gpus-per-worker", gpus_per_worker, B.GPU_SHARE))
    if device not in (None, "cpu", "cuda"):
        raise InputError(f"--device {device} cannot be used with --engine ray: Ray gives each worker its own GPU",
                         "--device", "use --device cuda (each worker on its GPU), --device cpu, or leave it unset")
    if device == "cpu" and gpus_per_worker is not None:
        raise InputError("--gpus-per-worker with --device cpu", "--gpus-per-worker",
                         "drop --gpus-per-worker, or use --device cuda")
    require_ray()
    env = os.environ.get("RAY_ADDRESS")
    if address or env:  # before anything is read or written: a dead address would make ray.init retry for minutes
        probe_address(address or env, f"--ray-address {address}" if address else f"RAY_ADDRESS={env}")
    return RayOptions(address, workers, gpus_per_worker, device)


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise KdError("--engine ray needs ray, which is not installed", "--engine ray",
                      "pip install 'kd[ray]'") from None
    return ray


def driver_load(load: dict) -> dict:
    """How the driver loads its copy of each teacher: on the CPU (the GPUs are the workers'), fp16 as fp32."""
    precision = "fp32" if load["precision"] == "fp16" else load["precision"]
    return {**load, "device": "cpu", "precision": precision}


# --- pure planning ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Unit:
    teacher: str  # teacher name (table teachers/<name>)
    shard: int


@dataclass(frozen=True)
class UnitPlan:
    texts: list[int]  # texts shards the driver commits
    units: list[Unit]  # (teacher, shard) left to encode, teacher-major
    rows: int  # rows the units encode

    @property
    def empty(self) -> bool:
        return not self.texts and not self.units


def plan_units(existing: Manifest | None, plan: ShardPlan, teachers: list[str]) -> UnitPlan:
    """What is left: texts shards and (teacher, shard) units not committed in `existing` (merged manifest)."""
    tables = existing.tables if existing else {}

    def left(table: str) -> list[int]:
        done = tables[table].shards if table in tables else {}
        return [k for k in range(plan.num_shards) if k not in done]

    units = [Unit(t, k) for t in teachers for k in left(f"teachers/{t}")]
    rows = sum(plan.bounds(u.shard)[1] - plan.bounds(u.shard)[0] for u in units)
    return UnitPlan(left("texts"), units, rows)


@dataclass(frozen=True)
class WorkerPlan:
    count: int
    num_cpus: float  # Ray resources each actor reserves
    num_gpus: float
    threads: int | None  # torch threads of each actor (None: Ray's default, OMP_NUM_THREADS=num_cpus)
    device: str  # cpu | cuda

    def describe(self) -> str:
        each = f"{self.num_gpus:g} GPU" if self.num_gpus else f"{self.threads} thread(s)"
        return f"{self.count} Ray worker(s) on {self.device}, {each} each"


def plan_workers(cpus: float, gpus: float, opts: RayOptions, backend: str = "torch") -> WorkerPlan:
    """Actors and the resources each reserves, from the cluster's totals and the options.

    GPU workers when the cluster has GPUs (torch backend) or --device cuda: --gpus-per-worker each (default 1),
    as many as fit. CPU workers: one per cluster CPU by default (one thread each: small teachers run faster as N
    one-thread processes than as one N-thread process); --workers N gives each cpus // N threads.
    """
    use_gpu = opts.device == "cuda" or (opts.device is None and backend == "torch" and gpus > 0)
    if use_gpu:
        if gpus <= 0:
            raise InputError("GPU workers were asked for (--device cuda or --gpus-per-worker), but the Ray cluster "
                             "has no GPUs", "--engine ray", "use --device cpu, or add GPU nodes to the cluster")
        g = opts.gpus_per_worker or 1.0
        fit = int(gpus / g + 1e-9)
        n = opts.workers or fit
        if n > fit:
            raise InputError(f"--workers {n} x {g:g} GPU needs {n * g:g} GPUs; the Ray cluster has {gpus:g}",
                             "--workers", f"use --workers {fit} or fewer, or a smaller --gpus-per-worker")
        return WorkerPlan(n, 1.0, g, None, "cuda")
    if opts.gpus_per_worker is not None:
        raise InputError("--gpus-per-worker was given, but the workers run on the CPU (the Ray cluster has no "
                         f"GPUs, or --backend {backend} runs on the CPU)", "--gpus-per-worker",
                         "drop --gpus-per-worker")
    have = int(cpus)
    if have < 1:
        raise InputError("the Ray cluster has no CPUs for workers", "--engine ray", "add nodes with CPUs")
    n = opts.workers or have
    if n > have:
        raise InputError(f"--workers {n} needs {n} CPUs (one thread each); the Ray cluster has {have}", "--workers",
                         f"use --workers {have} or fewer, or add nodes")
    threads = have // n
    return WorkerPlan(n, float(threads), 0.0, threads, "cpu")


# --- the worker -------------------------------------------------------------------------------------------------

def read_texts(loc: fs.Location, rec: ShardRecord) -> pa.Table:
    """A committed `texts` shard, its bytes checked against the record (size and sha256)."""
    return pq.read_table(pa.BufferReader(Store(loc, Manifest({})).read_verified(rec)))


class UnitWorker:
    """A Ray actor (wrapped with ray.remote by the driver): encodes units of one teacher at a time."""

    def __init__(self, root: str, specs: dict[str, str], outputs: dict[str, list[str]], load: dict, pairs: bool,
                 dtype: str, batch_tokens: int | None, threads: int | None) -> None:
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.loc = fs.resolve(root)
        self.specs, self.outputs, self.load, self.pairs = specs, outputs, load, pairs
        self.dtype, self.batch_tokens = dtype, batch_tokens
        self.held: tuple[str, Any, dict] | None = None  # (name, Teacher, meta)

    def _teacher(self, name: str) -> tuple[Any, dict]:
        if self.held is None or self.held[0] != name:
            from kd.pipeline import backends
            from kd.pipeline.teacher import Output

            self.held = None
            gc.collect()  # the previous teacher goes before the next one loads
            t = backends.load(self.specs[name], **self.load)
            self.held = (name, t, t.meta([Output(o) for o in self.outputs[name]], self.dtype))
        return self.held[1], self.held[2]

    def ready(self, name: str) -> dict:
        """Load teacher `name`; its meta and where it runs."""
        t, meta = self._teacher(name)
        return {"teacher": name, "meta": meta, "where": f"{socket.gethostname()}:{os.getpid()} {t.device}"}

    def encode(self, name: str, k: int, texts: ShardRecord) -> dict:
        """Encode unit (name, k) into a temp file next to its shard; the driver commits it."""
        from kd.pipeline.precompute import encode_shard
        from kd.pipeline.teacher import Output
        from kd.storage.schema import VectorDType

        t, meta = self._teacher(name)
        shard = read_texts(self.loc, texts)
        table, truncated = encode_shard(t, [Output(o) for o in self.outputs[name]], k, shard, self.pairs,
                                        VectorDType(self.dtype), self.batch_tokens)
        data = fs.parquet_bytes(table)
        tmp = fs.write_temp(self.loc, data, shard_file(f"teachers/{name}", k))
        _die_once()
        return {"teacher": name, "shard": k, "tmp": tmp, "rows": table.num_rows, "bytes": len(data),
                "sha256": fs.sha256(data), "truncated": truncated, "meta": meta}


def _die_once() -> None:
    path = os.environ.get("KD_RAY_TEST_DIE_ONCE")
    if path:
        try:
            os.remove(path)  # only one worker wins the removal
        except FileNotFoundError:
            return
        os._exit(1)


# --- the driver -------------------------------------------------------------------------------------------------

PROBE_TIMEOUT_S = 5.0  # a head that does not accept a TCP connection in this time is not reachable
START_FIX = ("start one (`ray start --head`) and pass its address HOST:PORT (the head's GCS port, 6379 by default), "
             "or leave --ray-address and RAY_ADDRESS unset to start a local Ray runtime")


def probe_address(address: str, where: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Refuse a Ray address where nothing accepts a TCP connection within `timeout` seconds.

    ray.init retries a dead address for many minutes (and only then fails); a connect to HOST:PORT
    (`ray://HOST:PORT` too, IPv6 in brackets) answers at once when nothing listens and within `timeout`
    when the host drops packets. `auto` and `local` are left to Ray.
    """
    if address in ("auto", "local"):
        return
    host, sep, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InputError(f"the Ray address {address!r} is not HOST:PORT", where,
                         "pass the head's HOST:PORT (e.g. 10.0.0.5:6379), auto, or leave it unset")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise KdError(f"no Ray cluster answers at {address} ({e.strerror or e})", where, START_FIX) from None


def _connect(ray: Any, address: str | None) -> tuple[bool, Any]:
    """Join the cluster at `address` (or RAY_ADDRESS), else start a local Ray runtime.

    Returns (whether this call initialised Ray, the reaper process watching a local runtime or None).
    """
    if ray.is_initialized():
        return False, None
    local = address == "local" or (address is None and not os.environ.get("RAY_ADDRESS"))
    kwargs: dict[str, Any] = {"address": address, "logging_level": "WARNING"}
    if local:
        kwargs["include_dashboard"] = False
    reaper = _start_reaper() if local else None
    try:
        ray.init(**kwargs)
    except (ConnectionError, TimeoutError, RuntimeError) as e:
        _stop_reaper(reaper)
        raise KdError(f"cannot connect to the Ray cluster ({e})", f"--ray-address {address or 'auto'}",
                      START_FIX) from e
    except BaseException:
        _stop_reaper(reaper)
        raise
    return True, reaper


def _start_reaper() -> Any:
    """Start ray_reaper.py for the local runtime about to start (None where there is no /proc)."""
    import subprocess
    import sys

    if not os.path.isdir("/proc"):
        return None
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_reaper.py")
    proc = subprocess.Popen([sys.executable, script, str(os.getpid())], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    proc.stdout.readline()  # "ready": it has noted the children that are not Ray's
    return proc


def _stop_reaper(reaper: Any, wait_s: float = 10.0) -> None:
    """Close the reaper's pipe (it ends what is left of the local runtime) and wait for it to finish."""
    if reaper is None:
        return
    import subprocess

    reaper.stdin.close()
    try:
        reaper.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        reaper.kill()
    reaper.stdout.close()


class Stopped(BaseException):
    """SIGINT or SIGTERM reached the driver. A BaseException so that Ray's `except Exception` retry loops do
    not swallow it on its way to the cleanup."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _trap_signals() -> Callable[[], None]:
    """SIGINT and SIGTERM raise Stopped in the main thread from now on; returns what restores the handlers.

    The driver's loop returns to Python at least every 5 s (`ray.wait`'s timeout), so a signal stops it
    within that, and its `finally` kills the actors and shuts down the Ray runtime kd started. (Ray's own
    SIGTERM handler exits too, but says nothing of the store; SIGINT would be a KeyboardInterrupt.)
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum, frame):
        raise Stopped(signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

    return restore


class _Pool:
    """Actors of one job: started, replaced when they die, killed at the end."""

    def __init__(self, ray: Any, plan: WorkerPlan, args: tuple, runtime_env: dict | None) -> None:
        opts: dict[str, Any] = {"num_cpus": plan.num_cpus, "num_gpus": plan.num_gpus, "max_restarts": 0}
        if runtime_env:
            opts["runtime_env"] = runtime_env
        self.ray, self.cls, self.args = ray, ray.remote(UnitWorker).options(**opts), args
        self.actors: list[Any] = []
        self.labels: dict[int, str] = {}  # id(actor) -> w1, w2, ... (a replacement gets the next number)

    def start(self) -> Any:
        a = self.cls.remote(*self.args)
        self.actors.append(a)
        self.labels[id(a)] = f"w{len(self.labels) + 1}"
        return a

    def drop(self, actor: Any) -> None:
        self.actors.remove(actor)
        self.ray.kill(actor)

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []


def write(opts: RayOptions, out: str, specs: dict[str, str], load: dict, writer, loaded, touts, rows: pa.Table,
          plan: ShardPlan, pairs: bool, vdtype, batch_tokens: int | None, counts, progress: bool, t0: float):
    """The driver's part of `kd precompute --engine ray` (see the module docstring); returns the summary."""
    from kd.pipeline.precompute import PrecomputeSummary, _remove_own_temps, _save_teacher_files, _span, declare_teacher
    from kd.storage.schema import type_name
    from kd.storage.store import load_manifest

    existing = load_manifest(writer.loc)
    names = [t.name for t in loaded]
    summary = PrecomputeSummary(writer.loc.root, plan.num_rows, empty_dropped=counts.empty_dropped,
                                duplicates_dropped=counts.duplicates_dropped, teachers=names)
    writer.declare("texts", "texts", {f.name: type_name(f.type) for f in rows.schema}, {"pairs": pairs})
    for t in loaded:
        summary.files_written += _save_teacher_files(writer, t)
    todo = plan_units(existing, plan, names)
    summary.shards_skipped = plan.num_shards * (1 + len(loaded)) - len(todo.texts) - len(todo.units)

    def commit_texts() -> dict[int, ShardRecord]:
        """The texts shards left (while the workers load their teacher); every texts record."""
        for k in todo.texts:
            summary.bytes_written += writer.commit("texts", k, rows.slice(*_span(plan, k))).bytes
        summary.shards_written += len(todo.texts)
        return {**(existing.tables["texts"].shards if existing and "texts" in existing.tables else {}),
                **writer.manifest.tables["texts"].shards}

    if not todo.units:
        commit_texts()
        check_unchanged(existing, loaded, touts, vdtype, writer.loc.root)
    else:
        by_name = {t.name: t for t in loaded}

        def settle(name: str, meta: dict) -> None:
            """Declare teachers/<name> with the workers' meta once; later metas must agree with it."""
            if name not in declared:
                t = by_name[name]
                declare_teacher(writer, existing, t, touts[name], pairs, vdtype, meta)
                declared[name] = meta
            elif not same_settings(declared[name], meta):
                raise StoreError(f"two Ray workers encode teacher {name!r} with different settings (precision, "
                                 "backend or device type)", "--engine ray",
                                 "use --device and --precision explicitly so that every node runs the same")

        declared: dict[str, dict] = {}
        _run_units(opts, out, specs, load, writer, todo, commit_texts, touts, pairs, vdtype, batch_tokens, progress,
                   summary, settle)
    _remove_own_temps(writer, writer.writer_id, names, list(range(plan.num_shards)))  # a dead worker's temp files
    writer.publish()
    summary.seconds = time.perf_counter() - t0
    return summary


# Meta keys that depend on where a teacher runs (GPU workers: fp16 autocast; the driver's copy: CPU).
DEVICE_META = ("precision", "cast")


def check_unchanged(existing: Manifest | None, loaded: list, touts: dict, vdtype, root: str) -> None:
    """Nothing left to encode, so no worker starts to compare its settings with the store's: the driver's
    own copy of each teacher must still match what the store holds (weights, outputs, max length, backend,
    dtype), as the one-process engine checks on every run. Precision is left out: it depends on the device."""
    for t in loaded:
        old = existing.tables.get(f"teachers/{t.name}") if existing else None
        if old is None or not old.meta:
            continue
        want = {k: v for k, v in t.meta(touts[t.name], vdtype.value).items() if k not in DEVICE_META}
        if not same_settings({k: v for k, v in old.meta.items() if k not in DEVICE_META}, want):
            raise StoreError(f"the store already has teacher {t.name!r} written with other settings", root,
                             "use another name (--teacher NEW=PATH), a new --out, or --overwrite")


def _run_units(opts, out, specs, load, writer, todo: UnitPlan, commit_texts, touts, pairs, vdtype, batch_tokens,
               progress, summary, settle) -> None:
    """Hand the units to Ray actors one at a time (to whichever is free), commit what they return."""
    from kd.common.progress import Bar

    ray = require_ray()
    limit = start_timeout()
    started, reaper = _connect(ray, opts.address)
    restore = _trap_signals()  # (after ray.init, which installs a SIGTERM handler of its own)
    pool = None
    try:
        res = ray.cluster_resources()
        wp = plan_workers(res.get("CPU", 0.0), res.get("GPU", 0.0), opts, load["backend"])
        worker_load = {**load, "device": wp.device, "threads": load.get("threads") or wp.threads}
        root = writer.loc.root if writer.loc.is_local else out
        args = (root, specs, {n: [o.value for o in v] for n, v in touts.items()}, worker_load, pairs, vdtype.value,
                batch_tokens, wp.threads)
        env = {k: os.environ[k] for k in FORWARD_ENV if k in os.environ}
        pool = _Pool(ray, wp, args, {"env_vars": env} if env else None)
        queue = deque(todo.units)
        inflight: dict[Any, tuple[Any, Unit | None]] = {}  # ref -> (actor, unit; None for a ready() call)
        for _ in range(wp.count):
            a = pool.start()
            inflight[a.ready.remote(queue[0].teacher)] = (a, None)
        texts = commit_texts()
        idle: list[Any] = []
        committed: set[Unit] = set()
        per_worker: Counter[str] = Counter()  # rows committed per worker, shown on the bar
        attempts: Counter[Unit] = Counter()
        deaths, max_deaths = 0, 2 * wp.count + MAX_ATTEMPTS
        since = time.monotonic()
        with Bar(f"precompute ({wp.describe()})", todo.rows, "rows", progress) as bar:
            while queue or any(u is not None for _, u in inflight.values()):
                while idle and queue:
                    a, u = idle.pop(), queue.popleft()
                    inflight[a.encode.remote(u.teacher, u.shard, texts[u.shard])] = (a, u)
                done, _ = ray.wait(list(inflight), num_returns=1, timeout=min(limit, 5.0))
                if not done:
                    _check_stalled(inflight, since, limit, wp)
                    continue
                (ref,), since = done, time.monotonic()
                a, u = inflight.pop(ref)
                try:
                    got = ray.get(ref)
                except ray.exceptions.RayActorError as e:  # the worker process died: killed, OOM, node lost
                    deaths += 1
                    pool.drop(a)
                    if u is not None:
                        attempts[u] += 1
                        if attempts[u] >= MAX_ATTEMPTS:
                            raise StoreError(f"teacher {u.teacher!r} shard {u.shard} killed its Ray worker "
                                             f"{attempts[u]} times (last: {_short(e)})", "--engine ray",
                                             "lower --batch-tokens or --shard-rows (out of memory?), then rerun the "
                                             "same command: it resumes") from None
                        queue.appendleft(u)
                        summary.retried += 1
                    if deaths > max_deaths:
                        raise StoreError(f"{deaths} Ray workers died (last: {_short(e)})", "--engine ray",
                                         "check the worker logs (ray logs), then rerun the same command: it "
                                         "resumes") from None
                    if queue:
                        b = pool.start()
                        inflight[b.ready.remote(queue[0].teacher)] = (b, None)
                    continue
                except ray.exceptions.RayTaskError as e:  # a KdError or a full disk in the worker: stop, clearly
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, (KdError, OSError)):
                        raise cause from None
                    raise
                settle(got["teacher"], got["meta"])
                if u is not None:
                    if u in committed or (got["teacher"], got["shard"]) != (u.teacher, u.shard):
                        raise StoreError(f"a Ray worker returned unit {got['teacher']}/{got['shard']} twice or for "
                                         f"another unit ({u})", "--engine ray", "rerun the same command")
                    writer.adopt(f"teachers/{u.teacher}", u.shard, got["tmp"], got["rows"], got["bytes"],
                                 got["sha256"])
                    committed.add(u)
                    summary.shards_written += 1
                    summary.rows_computed += got["rows"]
                    summary.truncated += got["truncated"]
                    summary.bytes_written += got["bytes"]
                    per_worker[pool.labels[id(a)]] += got["rows"]
                    bar.advance(got["rows"], workers=" ".join(f"{w}={n:,}" for w, n in per_worker.items()))
                idle.append(a)
    except Stopped as e:
        raise StoreError(f"stopped by {signal.Signals(e.signum).name}: the Ray workers were ended (and the Ray "
                         "runtime kd started); the shards committed so far are kept", "--engine ray",
                         "rerun the same command: it resumes") from None
    finally:
        restore()
        if pool is not None:
            pool.close()
        if started:
            ray.shutdown()
        _stop_reaper(reaper)


def start_timeout() -> float:
    """Seconds to wait for a worker to start (KD_RAY_START_TIMEOUT, else START_TIMEOUT_S)."""
    raw = os.environ.get(START_TIMEOUT_ENV)
    if raw is None:
        return START_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InputError(f"{START_TIMEOUT_ENV}={raw!r} is not a number of seconds > 0", START_TIMEOUT_ENV,
                         f"set it to e.g. 1200, or unset it (default {START_TIMEOUT_S:g})")
    return value


def _check_stalled(inflight: dict, since: float, limit: float, wp: WorkerPlan) -> None:
    """Stop when nothing has come back for `limit` seconds and no worker is encoding (only start-ups pending)."""
    encoding = any(u is not None for _, u in inflight.values())
    if encoding or time.monotonic() - since < limit:
        return
    need = f"{wp.num_gpus:g} GPU" if wp.num_gpus else f"{wp.num_cpus:g} CPU"
    raise StoreError(f"no Ray worker started within {limit:g} s: {len(inflight)} worker(s) of {need} each are "
                     "still pending (the cluster has no room for them, or a node was lost), or loading the "
                     "teacher takes longer", "--engine ray",
                     f"check `ray status`, add nodes or lower --workers/--gpus-per-worker (or raise "
                     f"{START_TIMEOUT_ENV}), then rerun the same command: it resumes")


def _short(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
