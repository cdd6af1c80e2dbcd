"""`kd precompute --engine ray`: the same store, its (shard, teacher) units encoded by a pool of Ray actors.

What the driver (the `kd precompute` process) does, and what the workers do:
- The driver validates the options, reads + segments the inputs ONCE, plans shards exactly as the one-process
  engine (`plan.ShardPlan`, as writer 0 of 1: every shard) and opens the store as writer `writer-00000-of-00001`,
  the one-process writer id. It commits the `texts` shards itself, and the per-teacher files (tokenizer, input
  embeddings, `vocab`, `init`) from a CPU copy of each teacher.
- Every (teacher, shard) not yet committed is a unit (`plan.plan_units`, pure). Units go teacher-major to a pool of
  Ray actors (`UnitWorker`), one unit at a time to whichever actor is free: fast workers take more. An actor holds
  one teacher, loaded once (a retried unit of an earlier teacher may reload it). On GPU clusters each actor
  reserves `--gpus-per-worker` GPUs (Ray sets CUDA_VISIBLE_DEVICES: it runs on cuda:0 of what it sees); on CPU
  each reserves a thread budget (`plan_workers`), applied with torch.set_num_threads.
- A worker reads its unit's `texts` shard from the store (verified against the sha256 the driver passes), encodes
  it with the one-process code (`shards.encode_shard`), serialises the Parquet bytes and writes them, fsynced,
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
  must agree with what the table was declared with. --backend auto is decided once, on the driver, for every
  worker (`auto_choices`: the local rule for the workers' hardware); a worker that cannot run it fails, naming it.
- A job with no worker encoding and none starting for KD_RAY_START_TIMEOUT seconds (default 600: Ray cannot place
  the actors) stops with a clear error; what was committed stays, and the same command resumes.
- External processes, bounded: a --ray-address (or RAY_ADDRESS) that does not answer as Ray (a TCP connect and
  one gRPC call, `ray_probe.py`) within PROBE_TIMEOUT_S is refused before anything is read (ray.init would retry
  it for many minutes); SIGINT/SIGTERM stop the driver within seconds (a `StopRequest` checked after every reply
  and every WAIT_SLICE_S wait; exit 130 / 143), killing the actors and shutting down the Ray runtime it started;
  and a local runtime kd started is watched by `ray_reaper.py`, which ends its processes (Ray's agents
  otherwise outlive a killed driver by a minute or more) as soon as the driver is gone, even killed by SIGKILL.
"""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kd.common.errors import InputError, KdError, StoreError
from kd.common.progress import Bar, showing
from kd.common.stop import Stopped, StopRequest
from kd.pipeline.backends import choice as backend_choice
from kd.pipeline.backends import loading
from kd.pipeline.engines.plan import Unit, UnitPlan, plan_units
from kd.pipeline.engines.shards import (
    PrecomputeSummary,
    Prepared,
    commit_texts,
    declare_teacher,
    declare_texts,
    encode_shard,
    remove_own_temps,
    save_teacher_files,
    stored_backend,
)
from kd.pipeline.job import START_FIX, RayOptions, require_ray
from kd.pipeline.teacher.model import Output
from kd.pipeline.teacher.resolve import TeacherSpec, parse_teacher
from kd.storage import fs
from kd.storage.alignment import misaligned, shard_digest, table_digest
from kd.storage.manifest import Manifest, ShardRecord, same_settings
from kd.storage.schema import VectorDType
from kd.storage.store import Store, shard_file

MAX_ATTEMPTS = 3  # a unit whose worker died this many times stops the job (it likely kills workers: memory)
# The environment a worker needs from the driver. KD_RAY_TEST_DIE_ONCE is the tests' fault hook: a worker that
# removes this file exits at once after writing its unit's temp file (exactly one worker dies, mid-unit).
FORWARD_ENV = ("KD_CPU_BF16", "KD_RAY_TEST_DIE_ONCE")
# How long the driver waits when no worker is encoding and none has become ready (started and loaded its
# teacher): an actor Ray cannot place (a lost node, a cluster without room for its CPUs/GPUs) stays pending
# forever, and the job would hang without a word. Loading a large teacher from a slow disk can take minutes.
START_TIMEOUT_ENV = "KD_RAY_START_TIMEOUT"
START_TIMEOUT_S = 600.0
WAIT_SLICE_S = 1.0  # how long the driver waits for a reply before it looks for a stop request again


def driver_load(load: dict) -> dict:
    """How the driver loads its copy of each teacher: on the CPU (the GPUs are the workers'), fp16 as fp32."""
    precision = "fp32" if load["precision"] == "fp16" else load["precision"]
    return {**load, "device": "cpu", "precision": precision}


# --- planning the pool (pure) ----------------------------------------------------------------------------------

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

def read_texts(loc: fs.Location, rec: ShardRecord, k: int) -> pa.Table:
    """Committed `texts` shard k, its bytes checked against the record (size and sha256) and its ids against the
    digest the record holds (a texts file swapped in under fixed checksums would make every unit encode others)."""
    data = Store(loc, Manifest({})).read_verified(rec)
    if rec.ids is not None and shard_digest(data) != rec.ids:
        raise misaligned("texts", k, loc.path(rec.file), loc.root)
    return pq.read_table(pa.BufferReader(data))


class UnitWorker:
    """A Ray actor (wrapped with ray.remote by the driver): encodes units of one teacher at a time."""

    def __init__(self, root: str, specs: dict[str, TeacherSpec], outputs: dict[str, list[str]], load: dict, pairs: bool,
                 dtype: str, batch_tokens: int | None, threads: int | None) -> None:
        import pyarrow.dataset  # noqa: F401
        import torch

        # pq.read_table imports pyarrow.dataset, whose pandas shim imports pandas: done at a task's first read, it
        # raced another thread of the worker and failed with "partially initialized module 'pandas'" (a CI run on a
        # loaded machine); imported here, before any task runs. (Only here: pandas costs every kd command ~0.5 s.)
        if threads:
            torch.set_num_threads(threads)
        self.loc = fs.resolve(root)
        self.specs, self.outputs, self.load, self.pairs = specs, outputs, load, pairs
        self.dtype, self.batch_tokens = dtype, batch_tokens
        self.held: tuple[str, Any, dict] | None = None  # (name, Teacher, meta)

    def _teacher(self, name: str) -> tuple[Any, dict]:
        if self.held is None or self.held[0] != name:
            self.held = None
            gc.collect()  # the previous teacher goes before the next one loads
            t = load_unit_teacher(self.specs[name], name, self.load)
            self.held = (name, t, t.meta([Output(o) for o in self.outputs[name]], self.dtype))
        return self.held[1], self.held[2]

    def ready(self, name: str) -> dict:
        """Load teacher `name`; its meta, where it runs, and the id of its Ray node."""
        import ray

        t, meta = self._teacher(name)
        device = t.device if t.backend is None else t.backend.device or "cpu"
        return {"teacher": name, "meta": meta, "where": f"{socket.gethostname()}:{os.getpid()} {device}",
                "node": ray.get_runtime_context().get_node_id()}

    def encode(self, name: str, k: int, texts: ShardRecord) -> dict:
        """Encode unit (name, k) into a temp file next to its shard; the driver commits it."""
        t, meta = self._teacher(name)
        shard = read_texts(self.loc, texts, k)
        table, truncated = encode_shard(t, [Output(o) for o in self.outputs[name]], k, shard, self.pairs,
                                        VectorDType(self.dtype), self.batch_tokens)
        data = fs.parquet_bytes(table)
        tmp = fs.write_temp(self.loc, data, shard_file(f"teachers/{name}", k))
        _die_once()
        return {"teacher": name, "shard": k, "tmp": tmp, "rows": table.num_rows, "bytes": len(data),
                "sha256": fs.sha256(data), "ids": table_digest(table), "truncated": truncated, "meta": meta}


def load_unit_teacher(spec: TeacherSpec, name: str, load: dict) -> Any:
    """A worker's teacher: with --backend auto, the backend the driver decided for it (`load["choices"]`), and no
    other; else as the options say."""
    load = dict(load)
    choices = load.pop("choices", None)
    with showing(False):  # every worker loading at once would repeat the driver's step lines
        if choices is None:
            return loading.load(spec, **load)
        options = {k: load[k] for k in ("device", "precision", "max_length", "threads", "allow_low_fidelity")}
        return loading.load_decided(spec, choices[name], where=f"the Ray worker on {socket.gethostname()}",
                                    **options)


def _die_once() -> None:
    path = os.environ.get("KD_RAY_TEST_DIE_ONCE")
    if path:
        try:
            os.remove(path)  # only one worker wins the removal
        except FileNotFoundError:
            return
        os._exit(1)


# --- the driver -------------------------------------------------------------------------------------------------

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

    reaper.stdin.close()
    try:
        reaper.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        reaper.kill()
    reaper.stdout.close()


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


def write(ctx: Prepared, opts: RayOptions) -> PrecomputeSummary:
    """The driver's part of `kd precompute --engine ray` (see the module docstring); returns the summary.

    - declare `texts`, save each teacher's tokenizer files and input embeddings from the driver's copy;
    - `plan_units` over every shard (the driver is writer 0 of 1);
    - no unit left: commit the texts left and check the driver's teachers against the store (`check_unchanged`);
      else hand the units to the actors (`_run_units`), committing the texts while they start;
    - delete the temp files dead workers left, publish the merged manifest.
    """
    summary = ctx.summary()
    declare_texts(ctx)
    for t in ctx.teachers:
        summary.files_written += save_teacher_files(ctx.writer, t)
    todo = plan_units(ctx.existing, ctx.plan, ctx.names, ctx.owned)
    summary.shards_skipped = todo.skipped
    if not todo.units:
        _commit_texts(ctx, todo, summary)
        check_unchanged(ctx)
    else:
        _run_units(ctx, opts, todo, summary)
    summary.shards_written = todo.shards
    remove_own_temps(ctx.writer, ctx.names, ctx.owned)  # a dead worker's temp files
    ctx.writer.publish()
    summary.seconds = time.perf_counter() - ctx.t0
    return summary


def _commit_texts(ctx: Prepared, todo: UnitPlan, summary: PrecomputeSummary) -> dict[int, ShardRecord]:
    """Commit the texts shards left (while the workers load their teacher); every texts record."""
    for k in todo.texts:
        summary.bytes_written += commit_texts(ctx, k).bytes
    old = ctx.existing.tables["texts"].shards if ctx.existing and "texts" in ctx.existing.tables else {}
    return {**old, **ctx.writer.manifest.tables["texts"].shards}


def settle(ctx: Prepared, declared: dict[str, dict], name: str, meta: dict) -> None:
    """Declare teachers/<name> with the first meta a worker reports; later metas must agree with it."""
    if name not in declared:
        declare_teacher(ctx, next(t for t in ctx.teachers if t.name == name), meta)
        declared[name] = meta
    elif not same_settings(declared[name], meta):
        raise StoreError(f"two Ray workers encode teacher {name!r} with different settings (precision, "
                         "backend or device type)", "--engine ray",
                         "use --device and --precision explicitly so that every node runs the same")


# Meta keys that depend on where a teacher runs (GPU workers: fp16 autocast; the driver's copy: CPU).
DEVICE_META = ("precision", "cast")


def check_unchanged(ctx: Prepared) -> None:
    """Nothing left to encode, so no worker starts to compare its settings with the store's: the driver's
    own copy of each teacher must still match what the store holds (weights, outputs, max length, backend,
    dtype), as the one-process engine checks on every run. Precision is left out: it depends on the device."""
    for t in ctx.teachers:
        old = ctx.existing.tables.get(f"teachers/{t.name}") if ctx.existing else None
        if old is None or not old.meta:
            continue
        want = {k: v for k, v in t.meta(ctx.outputs[t.name], ctx.job.vdtype.value).items() if k not in DEVICE_META}
        if not same_settings({k: v for k, v in old.meta.items() if k not in DEVICE_META}, want):
            raise StoreError(f"the store already has teacher {t.name!r} written with other settings",
                             ctx.writer.loc.root, "use another name (--teacher NEW=PATH), a new --out, or --overwrite")


def _run_units(ctx: Prepared, opts: RayOptions, todo: UnitPlan, summary: PrecomputeSummary) -> None:
    """Hand the units to Ray actors one at a time (to whichever is free), commit what they return.

    - join the cluster (or start a local runtime), size the pool from its resources (`plan_workers`);
    - start the actors (each loads the first queued teacher) and commit the texts meanwhile;
    - `_Driver.run`; SIGINT/SIGTERM are recorded (`StopRequest`, installed after ray.init, which sets a SIGTERM
      handler of its own) and end the loop at its next check with `Stopped`; a second signal goes to the
      handler that was there before;
    - finally kill the actors, stop the runtime (and its reaper) if this call started it.
    """
    ray = require_ray()
    limit = start_timeout()
    started, reaper = _connect(ray, opts.address)
    pool = None
    try:
        with StopRequest() as stop:
            res = ray.cluster_resources()
            wp, choices = plan_pool(ctx, res.get("CPU", 0.0), res.get("GPU", 0.0), opts)
            env = {k: os.environ[k] for k in FORWARD_ENV if k in os.environ}
            pool = _Pool(ray, wp, _worker_args(ctx, wp, choices), {"env_vars": env} if env else None)
            _Driver(ray, pool, wp, limit, ctx, todo, summary, stop).run()
    finally:
        if pool is not None:
            pool.close()
        if started:
            ray.shutdown()
        _stop_reaper(reaper)


def plan_pool(ctx: Prepared, cpus: float, gpus: float, opts: RayOptions) -> tuple[WorkerPlan, dict[str, dict] | None]:
    """The pool and, with --backend auto, the backend of each teacher on every worker (`auto_choices`)."""
    if ctx.job.backend != "auto":
        return plan_workers(cpus, gpus, opts, ctx.job.backend), None
    driver = {t.name: t.choice for t in ctx.teachers}
    stored = {t.name: stored_backend(ctx.existing, t.name) for t in ctx.teachers}
    on_gpu = opts.device == "cuda" or (opts.device is None and gpus > 0)
    choices = auto_choices(driver, stored, on_gpu, ctx.job.precision, ctx.job.quantize)
    exported = sorted({c["backend"] for c in choices.values()} - {"torch"})
    return plan_workers(cpus, gpus, opts, exported[0] if exported else "torch"), choices


def auto_choices(driver: dict[str, dict], stored: dict[str, str | None], on_gpu: bool, precision: str,
                 quantize: str) -> dict[str, dict]:
    """--backend auto under Ray, decided once, on the driver, for every worker: the rule a local run applies on
    the workers' hardware (backend_choice.choose), recorded in the manifest as a local run records it.

    CPU workers run what the driver's copy chose on its CPU (the same rule, with its fidelity measured once:
    a fallback to torch holds for every worker). GPU workers (--device cuda, or a cluster with GPUs) run the
    CUDA rule, torch, unless a teacher cannot: the store holds it with an exported backend, or --quantize int8
    was asked; then, without --device cuda, the workers stay on the CPU with the driver's choices.
    `driver`: each teacher's `Teacher.choice`; `stored`: the backend the store holds it with, or None."""
    cuda = _cuda_choices(stored, precision, quantize) if on_gpu else None
    if cuda is not None:
        return cuda
    if precision == "fp16":  # the driver's copy ran fp32; only torch offers fp16
        return {n: backend_choice.choose("cpu", precision, quantize, frozenset(), stored=s).record()
                for n, s in stored.items()}
    return dict(driver)


def _cuda_choices(stored: dict[str, str | None], precision: str, quantize: str) -> dict[str, dict] | None:
    """The CUDA rule for every teacher, or None where one of them cannot run torch on a GPU."""
    if quantize == "int8" or any(s not in (None, "torch") for s in stored.values()):
        return None
    return {n: backend_choice.choose("cuda", precision, quantize, frozenset(), stored=s).record()
            for n, s in stored.items()}


def _worker_args(ctx: Prepared, wp: WorkerPlan, choices: dict[str, dict] | None) -> tuple:
    """UnitWorker's arguments: the store (its URI when remote: each node resolves it), the teachers, how to load
    them on the worker's device, and how to encode."""
    load = ctx.job.load_options()
    worker_load = {**load, "device": wp.device, "threads": load.get("threads") or wp.threads,
                   "backend": ctx.job.backend, **({"choices": choices} if choices else {})}
    root = ctx.writer.loc.root if ctx.writer.loc.is_local else ctx.job.out
    specs = {n: parse_teacher(t) for n, t in zip(ctx.names, ctx.job.specs)}  # each node finds its own files
    outputs = {n: [o.value for o in v] for n, v in ctx.outputs.items()}
    return root, specs, outputs, worker_load, ctx.pairs, ctx.job.vdtype.value, ctx.job.batch_tokens, wp.threads


class _Driver:
    """The driver's loop over one job's units: which actor holds which unit, what is committed, who died."""

    def __init__(self, ray: Any, pool: _Pool, wp: WorkerPlan, limit: float, ctx: Prepared, todo: UnitPlan,
                 summary: PrecomputeSummary, stop: StopRequest) -> None:
        self.ray, self.pool, self.wp, self.limit = ray, pool, wp, limit
        self.ctx, self.todo, self.summary, self.stop = ctx, todo, summary, stop
        self.queue = deque(todo.units)
        self.inflight: dict[Any, tuple[Any, Unit | None]] = {}  # ref -> (actor, unit; None for a ready() call)
        self.idle: list[Any] = []
        self.committed: set[Unit] = set()
        self.per_worker: Counter[str] = Counter()  # rows committed per worker, shown on the bar
        self.nodes: dict[int, str] = {}  # id(actor) -> its Ray node id, from its ready() reply
        self.attempts: Counter[Unit] = Counter()
        self.deaths, self.max_deaths = 0, 2 * wp.count + MAX_ATTEMPTS
        self.declared: dict[str, dict] = {}  # teacher -> the meta its table was declared with
        self.texts: dict[int, ShardRecord] = {}  # every texts record, once committed: units are bound to them

    def run(self) -> None:
        """Start the actors, commit the texts, then until no unit is queued or encoding: give each idle actor
        the next unit, wait for one reply (stop when none comes for `limit` s and no worker encodes), take it.
        A stop request is honoured between two replies: every committed unit stays, nothing is half-written."""
        for _ in range(self.wp.count):
            self._start()
        texts = self.texts = _commit_texts(self.ctx, self.todo, self.summary)
        since = time.monotonic()
        with Bar(f"precompute ({self.wp.describe()})", self.todo.rows, "rows", self.ctx.job.progress) as bar:
            while self.queue or any(u is not None for _, u in self.inflight.values()):
                self._check_stop()
                while self.idle and self.queue:
                    a, u = self.idle.pop(), self.queue.popleft()
                    self.inflight[a.encode.remote(u.teacher, u.shard, texts[u.shard])] = (a, u)
                done, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=min(self.limit, WAIT_SLICE_S))
                if not done:
                    _check_stalled(self.inflight, since, self.limit, self.wp)
                    continue
                (ref,), since = done, time.monotonic()
                self._take(ref, bar)

    def _check_stop(self) -> None:
        if self.stop.signum is not None:
            done = len(self.committed)
            raise Stopped(self.stop.signum, f"stopped by {self.stop.name} after {done:,} of {len(self.todo.units):,} "
                          "units: the Ray workers were ended (and the Ray runtime kd started); the shards committed "
                          "so far are kept", "--engine ray", "rerun the same command: it resumes")

    def _start(self) -> None:
        """A new actor, loading the teacher of the next queued unit."""
        a = self.pool.start()
        self.inflight[a.ready.remote(self.queue[0].teacher)] = (a, None)

    def _take(self, ref: Any, bar: Bar) -> None:
        """One reply: a dead worker's unit goes back to the queue; a worker's error stops the job; a result is
        checked against the declared settings and, for a unit, committed."""
        a, u = self.inflight.pop(ref)
        try:
            got = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as e:  # the worker process died: killed, OOM, node lost
            self._died(a, u, e)
            return
        except self.ray.exceptions.RayTaskError as e:  # a KdError or a full disk in the worker: stop, clearly
            cause = getattr(e, "cause", None)
            if isinstance(cause, (KdError, OSError)):
                raise cause from None
            raise
        settle(self.ctx, self.declared, got["teacher"], got["meta"])
        if "node" in got:
            self.nodes[id(a)] = got["node"]
        if u is not None:
            self._commit(a, u, got, bar)
        self.idle.append(a)

    def _died(self, a: Any, u: Unit | None, e: BaseException) -> None:
        """Replace a dead actor (while units are queued); retry its unit, up to MAX_ATTEMPTS times."""
        self.deaths += 1
        self.pool.drop(a)
        if u is not None:
            self.attempts[u] += 1
            if self.attempts[u] >= MAX_ATTEMPTS:
                raise StoreError(f"teacher {u.teacher!r} shard {u.shard} killed its Ray worker {self.attempts[u]} "
                                 f"times (last: {_short(e)})", "--engine ray",
                                 "lower --batch-tokens or --shard-rows (out of memory?), then rerun the same "
                                 "command: it resumes") from None
            self.queue.appendleft(u)
            self.summary.retried += 1
        if self.deaths > self.max_deaths:
            raise StoreError(f"{self.deaths} Ray workers died (last: {_short(e)})", "--engine ray",
                             "check the worker logs (ray logs), then rerun the same command: it resumes") from None
        if self.queue:
            self._start()

    def _commit(self, a: Any, u: Unit, got: dict, bar: Bar) -> None:
        """Rename a worker's temp file into unit u's shard and record it (once per unit)."""
        if u in self.committed or (got["teacher"], got["shard"]) != (u.teacher, u.shard):
            raise StoreError(f"a Ray worker returned unit {got['teacher']}/{got['shard']} twice or for "
                             f"another unit ({u})", "--engine ray", "rerun the same command")
        want = self.texts[u.shard].ids
        if want is not None and got.get("ids") != want:  # the worker encoded rows other than texts shard k's
            raise misaligned(f"teachers/{u.teacher}", u.shard, got["tmp"], self.ctx.writer.loc.root)
        self.ctx.writer.adopt(f"teachers/{u.teacher}", u.shard, got["tmp"], got["rows"], got["bytes"], got["sha256"],
                              got.get("ids"))
        self.committed.add(u)
        s = self.summary
        s.rows_computed += got["rows"]
        s.truncated += got["truncated"]
        s.bytes_written += got["bytes"]
        self.per_worker[self.pool.labels[id(a)]] += got["rows"]
        node = self.nodes.get(id(a), "?")
        s.rows_per_node[node] = s.rows_per_node.get(node, 0) + got["rows"]
        bar.advance(got["rows"], workers=" ".join(f"{w}={n:,}" for w, n in self.per_worker.items()))


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
