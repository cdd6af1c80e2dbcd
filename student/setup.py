"""Training set-up: everything `kd train-student` reads before its first step, each file read once.

- `setup(cfg)` opens the store once and picks the teacher the student starts from (`source_teacher`);
  that teacher's input embeddings (read once, checked against the manifest), its tokenizer (loaded once:
  the data stream tokenizes with the same object), the transformer-init output folder (checked once) and
  the --init student's config.json and tokenizer (read once) are kept in the returned `Setup`;
- `--init DIR --init-layers 1,3,5` (transformer-init): a smaller copy of a trained student, k of its layers
  renumbered 0..k-1 with its embeddings and head, the way the teacher's `init` output copies the teacher's:
  a student already fitted to the target starts the small one (measured in docs/results.md);
- from them: the target's batch keys, the student's shape (`StudentConfig`), the objectives and the data
  stream's config. Every error here comes before any step, and before --out is written;
- `initial_student(cfg, s)` builds the student with its starting weights from what `Setup` holds: the
  --init student's, the teacher's kept layers, the vocab output (PCA, SIF-weighted for static
  students), a PCA of the teacher's input embeddings, or random.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load
from torch import nn

from kd.common.errors import InputError, KdError, StoreError
from kd.common.hardware import device_kind, gpu_free_memory
from kd.common.inputs import require_regular_file
from kd.common.layers import keep_layers, parse_layers
from kd.common.same_tokenizer import tokenizer_difference
from kd.storage.manifest import teacher_table
from kd.storage.soundness import vocab_problem
from kd.storage.store import Store, file_repair
from kd.student import data as D
from kd.student.models import Student, StudentConfig, build_student, pca_embeddings, require_memory
from kd.student.objectives import build_objectives, required_columns
from kd.student.objectives.base import Context
from kd.student.saved import CONFIG, TOKENIZER, fitted_student, read_config, student_tokenizer
from kd.student.static import sif_weights, static_init, token_counts
from kd.student.train_config import ARCH_EMBED_DIM, BASE_DEFAULTS, DEFAULT_EMBED_DIM, EmbeddingInit, TrainConfig
from kd.student.transformer_init import bert_config, load_init_weights


@dataclass
class Setup:
    """What training reads from the store (and the --init student) before its first step."""

    store: Store
    student_cfg: StudentConfig
    objectives: list[nn.Module]
    target: list[str]  # batch keys of the embedding target
    tokenizer: str  # teacher whose tokenizer is used
    data: D.DataConfig
    tok: Any = None  # that tokenizer, loaded (set-up and the data stream share it)
    embeddings: np.ndarray | None = None  # the teacher's input embeddings (None: none, or --init-embeddings random)
    init_dir: Path | None = None  # transformer-init: the teacher's init output (checked)
    init_info: dict[str, Any] | None = None  # --init: the source student's config.json
    kept_layers: list[int] | None = None  # --init with --init-layers: the source student's layers kept


def setup(cfg: TrainConfig) -> Setup:
    """Resolve target, tokenizer, student shape and objectives from the store; errors before any step."""
    if cfg.init_layers and cfg.arch != "transformer-init":
        raise KdError(f"--init-layers picks a Transformer's layers; this run asks for --arch {cfg.arch}",
                      "--init-layers", "drop --init-layers, or pass --arch transformer-init")
    store = Store.open(cfg.store, content=True)  # every table and file, not only the targets it reads
    store.require_complete("texts")
    ctx = Context.from_manifest(store.manifest, StudentConfig(), cfg.target)
    keys = _target_keys(ctx)
    target_teacher = ctx.part_teacher(keys[0]) if keys else ctx.pick_teacher("logits", False, None, "the student")
    init_info = read_config(cfg.init) if cfg.init else None
    own_tok = own_tokenizer(store, cfg, init_info)
    if own_tok is not None:  # the --init student's tokenizer, whose teacher this store lacks
        teacher, tok, emb = init_info["tokenizer"], student_tokenizer(Path(cfg.init), init_info), None
    else:
        teacher = source_teacher(store, target_teacher, cfg, init_info)
        tok, emb = _stored_tokenizer(store, teacher, cfg)
    init_dir = init_folder(store, teacher, cfg.init_layers) if cfg.arch == "transformer-init" and not cfg.init else None
    if cfg.max_length is None:  # transformer-init's default: as far as the start model reads (train_config)
        start = init_info["student"].get("max_length") if init_info else None
        cfg = dataclasses.replace(cfg, max_length=int(start or start_length(store, teacher)))
    student_cfg = _student_config(cfg, ctx, keys, tok, _table_width(store, teacher, cfg, emb), init_dir)
    kept = None
    if cfg.init:
        student_cfg, kept = init_config(cfg, init_info, tok if own_tok is None else None)
    check_training_memory(cfg, student_cfg)
    objectives = build_objectives(cfg.objectives, student_cfg, store.manifest, cfg.target)
    data = _data_config(cfg, objectives, teacher, own_tok, ctx.ensemble, student_cfg.first_ids)
    return Setup(store, student_cfg, objectives, keys, teacher, data, tok, emb, init_dir, init_info, kept)


def start_length(store: Store, teacher: str) -> int:
    """The maximum length the store's `teacher` was run at (its own limit unless --max-length cut it)."""
    return int(store.table(f"teachers/{teacher}").meta.get("max_length") or BASE_DEFAULTS["max_length"])


def check_training_memory(cfg: TrainConfig, student_cfg: StudentConfig) -> None:
    """Refuse a student whose training state cannot fit where it trains (host memory, or the GPU's), before
    the model is built: the kernel would otherwise kill the run after minutes of allocating."""
    if device_kind(cfg.device) == "cuda":
        require_memory(student_cfg, True, gpu_free_memory(cfg.device), "free GPU memory")
    else:
        require_memory(student_cfg, True)


def _stored_tokenizer(store: Store, teacher: str, cfg: TrainConfig) -> tuple[Any, np.ndarray | None]:
    """The store's tokenizer of `teacher` (its files checked first: a damaged one names itself) and its input
    embeddings (None: not stored, or not wanted)."""
    tok_dir = store.tokenizer_dir(teacher)
    if not os.path.isdir(tok_dir):
        raise KdError(f"the store has no tokenizer for teacher {teacher!r}", tok_dir,
                      "re-run kd precompute for this teacher (it saves the tokenizer files)")
    emb = input_embeddings(store, teacher, wanted=cfg.init_embeddings is not EmbeddingInit.random)
    if emb is None and cfg.init_embeddings is EmbeddingInit.teacher:
        raise KdError(f"the store has no input embeddings for teacher {teacher!r}", store.root,
                      "use --init-embeddings random, or re-run kd precompute with this kd version")
    return store.load_tokenizer(teacher), emb


def own_tokenizer(store: Store, cfg: TrainConfig, init_info: dict[str, Any] | None) -> str | None:
    """The --init student's own tokenizer folder when the store lacks the teacher it came from (a store grown
    with the target teacher alone): the student needs only the texts and the targets, so its own tokenizer
    (which its embedding rows follow by construction) serves, its files checked against config.json. None:
    the store's tokenizer is used (and compared with the student's), as for students written before kd
    recorded those checksums."""
    if init_info is None or cfg.init_teacher is not None or not init_info.get("tokenizer_sha256"):
        return None
    teachers = store.manifest.teachers()
    name = init_info.get("tokenizer")
    return str(Path(cfg.init) / TOKENIZER) if name and name not in teachers else None


def _table_width(store: Store, teacher: str, cfg: TrainConfig, emb: np.ndarray | None) -> tuple[int, int] | None:
    """(rows, width) of the matrix the student's first table starts from: the teacher's vocab output where
    `initial_student` takes it (a static student's by default, any arch's with --init-embeddings vocab; PCA cannot
    widen it: a wider --embed-dim is refused here, before any model is built), else the teacher's input embeddings
    (None: neither)."""
    from_vocab = cfg.init_embeddings is EmbeddingInit.vocab or (cfg.arch == "static" and
                                                                cfg.init_embeddings is EmbeddingInit.auto)
    if from_vocab and not cfg.init and cfg.arch != "transformer-init" and store.loc.is_local \
            and f"{teacher_table(teacher)}/vocab.safetensors" in store.manifest.extras.get("files", {}):
        width = int(store.table(teacher_table(teacher)).meta.get("dim") or 0)
        if cfg.embed_dim is not None and not 1 <= cfg.embed_dim <= width:
            raise InputError(f"--embed-dim {cfg.embed_dim} is wider than teacher {teacher!r}'s vocab output ({width}), "
                             "which the student's table is reduced from", "--embed-dim",
                             f"pass --embed-dim {width} or less (left out: min({ARCH_EMBED_DIM['static']}, "
                             "the teacher's width))")
        return (emb.shape[0] if emb is not None else 0, width)
    return emb.shape if emb is not None else None


def _student_config(cfg: TrainConfig, ctx: Context, keys: list[str], tok: Any, table: tuple[int, int] | None,
                    init_dir: Path | None) -> StudentConfig:
    """The student's shape from the options: embed_dim at most the width of the table it starts from
    (`_table_width`), out_dim the target's width, vocabulary the tokenizer's (or the table's, if larger)."""
    extra = dict(cfg.student)
    if cfg.hidden_dim is not None:
        extra["hidden_dim"] = cfg.hidden_dim
    if init_dir is not None:  # transformer-init without --init (with --init the source student fixes the shape)
        extra["bert"] = bert_config(init_dir)
    cap = ARCH_EMBED_DIM.get(cfg.arch, DEFAULT_EMBED_DIM)
    embed_dim = cfg.embed_dim or min(cap, table[1] if table is not None else cap)
    out_dim = cfg.out_dim or (ctx.shape(keys[0])[0] if keys else None)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    student_cfg = StudentConfig(
        arch=cfg.arch, vocab_size=max(len(tok), table[0] if table is not None else 0), pad_id=pad,
        embed_dim=embed_dim, num_layers=cfg.num_layers, pooling=cfg.pooling, out_dim=out_dim or 1,
        dropout=cfg.dropout, max_length=cfg.max_length, **extra,
    )
    if out_dim is None:  # nothing fixes the width (DSE from a cross-encoder alone): the encoder's own
        student_cfg = dataclasses.replace(student_cfg, out_dim=student_cfg.width)
    return student_cfg


def _data_config(cfg: TrainConfig, objectives: list[nn.Module], teacher: str, tokenizer_dir: str | None,
                 combined: dict[str, tuple[tuple[str, float], ...]], first_ids: bool) -> D.DataConfig:
    return D.DataConfig(
        cfg.store, required_columns(objectives), teacher, tokenizer_dir, batch_size=cfg.batch_size,
        max_length=cfg.max_length,
        shuffle_buffer=cfg.shuffle_buffer, val_percent=cfg.val_percent, max_val_rows=cfg.max_val_rows,
        seed=cfg.seed, num_workers=cfg.num_workers, exclude=read_ids(cfg.exclude_ids) if cfg.exclude_ids else (),
        bucket=cfg.bucket, combined=combined, first_ids=first_ids,
    )


def input_embeddings(store: Store, teacher: str, wanted: bool = True) -> np.ndarray | None:
    """The teacher's input-embedding matrix [vocab, dim], its file read once and checked against the
    manifest (checked even when not `wanted`: a damaged store stops either way); None when the store has
    none, or is not on a local disk."""
    rel = store.table(f"teachers/{teacher}").meta.get("input_embeddings")
    matrix = None
    if wanted and rel and store.loc.is_local:
        path = store.path_of(rel, f"tables.teachers/{teacher}.meta.input_embeddings")
        if os.path.exists(path):
            matrix = load(store.read_recorded(rel))["weight"]
    store.verify_folder("teachers", teacher, "input_embeddings.safetensors")  # (once: a no-op for a file just read)
    return matrix


def init_teachers(store: Store) -> list[str]:
    """Teachers of the store with a stored `init` output (embeddings + kept layers)."""
    files = store.manifest.extras.get("files", {})
    return sorted(t for t in store.manifest.teachers() if any(rel.startswith(f"{teacher_table(t)}/init-")
                                                               for rel in files))


def source_teacher(store: Store, target_teacher: str, cfg: TrainConfig, init_info: dict[str, Any] | None = None) -> str:
    """The stored teacher a student starts from: tokenizer, input embeddings, `vocab` and `init` outputs.

    The target may be another teacher's output of another width (MiniLM's tokenizer and layers, mpnet's
    768-d `sentence` as the target): the student reads ids of the source's tokenizer, and the width gap is
    bridged by `out_dim` (a learned head) or the objective's projection. Rules:
    - `--init-teacher NAME`: that teacher, which must be in the store;
    - `--init STUDENT`: the teacher whose tokenizer that student was trained with (its config.json), when the
      store has it: a cross-teacher student's second stage needs no other flag;
    - transformer-init: the one teacher with an `init` output; with several, `--init-teacher` picks;
    - otherwise the target's teacher (the behaviour of single-teacher stores).
    """
    teachers = sorted(store.manifest.teachers())
    if cfg.init_teacher is not None:
        if cfg.init_teacher not in teachers:
            raise KdError(f"--init-teacher {cfg.init_teacher!r} is not a teacher of the store", store.root,
                          f"pick one of: {', '.join(teachers)}")
        return cfg.init_teacher
    if init_info is not None and init_info.get("tokenizer") in teachers:
        return init_info["tokenizer"]
    if cfg.arch != "transformer-init" or cfg.init:
        return target_teacher
    have = init_teachers(store)
    if len(have) == 1:
        return have[0]
    if not have:
        raise KdError("no teacher of the store has an init output (embeddings + layers) for transformer-init",
                      store.root, "add one (no row is recomputed): kd precompute <same inputs and options> -t "
                      f"{target_teacher} --outputs init --keep-layers 2,5")
    raise KdError(f"several teachers of the store have an init output: {', '.join(have)}", store.root,
                  f"pick the one the student starts from: --init-teacher {have[0]}")


def _target_keys(ctx: Context) -> list[str]:
    """The embedding target's batch keys; [] when no teacher has an embedding column and none was asked for
    (a store of cross-encoders only: DSE's pair objective needs no target, objectives that do say so)."""
    try:
        return ctx.embedding_target()
    except KdError:
        if ctx.target_teacher is None and not any(ctx.keys(t, c, True) for t in ctx.shapes
                                                  for c in ("sentence", "mean", "cls")):
            return []
        raise


def init_config(cfg: TrainConfig, info: dict[str, Any],
                store_tokenizer: Any | None) -> tuple[StudentConfig, list[int] | None]:
    """The --init student's config (its shape wins; dropout is this run's), checked against this run, and
    the layers it keeps of the source (--init-layers; None: all of them).

    - `info` is the --init folder's config.json (`saved.read_config`);
    - the arch must be the one asked for (--arch), else the weights would not fit;
    - its tokenizer must give the same token ids as the store's (same vocabulary, same ids for a probe
      text), else every embedding row would mean another token (`store_tokenizer` None: the student's own
      tokenizer serves, already loaded and checked by `setup`: nothing to compare);
    - --init-layers keeps k of a transformer-init source's layers: the config's layer count becomes k.
    """
    source = StudentConfig.from_dict(info["student"], str(Path(cfg.init) / CONFIG))
    if source.arch.value != cfg.arch:
        raise KdError(f"the --init student is a {source.arch.value}, this run asks for --arch {cfg.arch}", cfg.init,
                      f"pass --arch {source.arch.value} (an initialised student keeps its architecture)")
    kept = None
    if cfg.init_layers:
        kept = parse_layers(cfg.init_layers, source.num_layers, "--init-layers")
        source = dataclasses.replace(source, bert={**(source.bert or {}), "num_hidden_layers": len(kept)})
    _check_init_shape(cfg, source)
    if store_tokenizer is not None:
        _check_same_tokenizer(cfg, student_tokenizer(Path(cfg.init), info), store_tokenizer)
    return dataclasses.replace(source, dropout=cfg.dropout), kept


def _check_same_tokenizer(cfg: TrainConfig, mine: Any, store: Any) -> None:
    why = tokenizer_difference(mine, store)
    if why:
        raise KdError(f"the --init student's tokenizer differs from the store teacher's: {why}", cfg.init,
                      "precompute the store with a teacher that shares the student's tokenizer, or train from "
                      "scratch (no --init)")


def _check_init_shape(cfg: TrainConfig, source: StudentConfig) -> None:
    """Refuse a shape option that the --init student contradicts (its shape wins, so it would be ignored).

    A width counts when it was given (not None); --layers and --pooling when they differ from TrainConfig's
    defaults, since their defaults cannot be told apart from an explicit value.
    """
    defaults = TrainConfig.__dataclass_fields__
    asked = [("--embed-dim", cfg.embed_dim, source.embed_dim), ("--hidden-dim", cfg.hidden_dim, source.hidden_dim),
             ("--out-dim", cfg.out_dim, source.out_dim)]
    asked += [(flag, getattr(cfg, name), value) for flag, name, value in
              (("--layers", "num_layers", source.num_layers), ("--pooling", "pooling", source.pooling.value))
              if getattr(cfg, name) != defaults[name].default]
    for flag, mine, theirs in asked:
        if mine is not None and mine != theirs:
            raise KdError(f"{flag} {mine} contradicts the --init student, whose value is {theirs}", cfg.init,
                          f"drop {flag} (an initialised student keeps its shape), or pass {flag} {theirs}")


def read_ids(path: str) -> tuple[int, ...]:
    """Row ids, one integer a line ('#' starts a comment), as written by `kd leakage --exclude-out`.

    - read as UTF-8, a byte-order mark (an editor's) dropped;
    - every id must fit the store's int64 `id` column: one that does not cannot name a row (it would
      overflow when compared), so it is refused with its line number, as anything else not an integer is.
    """
    require_regular_file(path, "--exclude-ids")  # a named pipe would block the read
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the id file ({e})", path,
                         "write it with kd leakage STORE --exclude-out FILE") from e
    ids = [_row_id(line, n, path) for n, line in enumerate(lines, 1)]
    return tuple(sorted({i for i in ids if i is not None}))


def _row_id(line: str, n: int, path: str) -> int | None:
    """The id on line `n` of an id file; None for a blank or comment line."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    fix = "one id a line, as kd leakage --exclude-out writes"
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"line {n} is not an integer row id: {text[:40]!r}", f"{path}:{n}", fix) from None
    if not np.iinfo(np.int64).min <= value <= np.iinfo(np.int64).max:
        raise InputError(f"line {n}: {text[:40]} is outside the 64-bit range of row ids", f"{path}:{n}", fix)
    return value


def init_folder(store: Store, teacher: str, layers: str | None) -> Path:
    """The store's `init` output for `teacher` (checksums verified): the one asked for, or the only one."""
    known = sorted({rel.rsplit("/", 1)[0] for rel in store.manifest.extras.get("files", {})
                    if rel.startswith(f"teachers/{teacher}/init-")})
    if layers:  # as precompute names the folder: sorted and unique ("5,2,2" is init-2-5)
        wanted = "init-" + "-".join(map(str, parse_layers(layers, 1 << 20, "--init-layers")))
        known = [k for k in known if k.rsplit("/", 1)[1] == wanted]
    if len(known) != 1:
        have = ", ".join(k.rsplit("init-", 1)[1].replace("-", ",") for k in known) or "none"
        raise KdError(f"the store has {len(known)} matching init outputs for teacher {teacher!r} (kept layers: {have})",
                      store.root, "add one: kd precompute <same inputs and options> --outputs init --keep-layers 2,5;"
                      " pick one with --init-layers")
    store.verify_folder(*known[0].split("/"))
    return Path(store.local_dir(known[0]))


# --------------------------------------------------------------------------------------------------
# The student's starting weights


def initial_student(cfg: TrainConfig, s: Setup) -> Student:
    """The student of `s.student_cfg` with its starting weights (see the module docstring, last bullet)."""
    student = build_student(s.student_cfg)
    if cfg.init:  # a student that starts from a student: its weights, not the teacher's embeddings
        state = fitted_student(Path(cfg.init), s.init_info).state_dict()
        student.load_state_dict(keep_layers(state, s.kept_layers) if s.kept_layers else state)
        return student
    if s.student_cfg.arch == "transformer-init":
        load_init_weights(student, s.init_dir)
        return student
    vocab = vocab_matrix(s.store, s.tokenizer) if cfg.init_embeddings in (EmbeddingInit.auto,
                                                                           EmbeddingInit.vocab) else None
    if cfg.init_embeddings is EmbeddingInit.vocab and vocab is None:
        raise KdError(f"the store has no vocab output for teacher {s.tokenizer!r}", s.store.root,
                      "add it (no row is recomputed): kd precompute <same inputs and options> --outputs vocab")
    if vocab is not None and (cfg.init_embeddings is EmbeddingInit.vocab or s.student_cfg.arch == "static"):
        weights = _sif(s, len(vocab)) if cfg.token_weights == "sif" and s.student_cfg.arch == "static" else None
        student.init_embeddings(_fit_rows(static_init(vocab, s.student_cfg.embed_dim, weights,
                                                      s.student_cfg.pad_id), s.student_cfg.vocab_size))
    elif cfg.init_embeddings is not EmbeddingInit.random and s.embeddings is not None:
        init_embeddings(student, s.embeddings, cfg.seed)
    return student


def init_embeddings(student: Student, matrix: np.ndarray, seed: int) -> None:
    """PCA of the teacher's input embeddings to embed_dim; wider students get the rest random (small)."""
    cfg = student.config
    m = pca_embeddings(matrix, min(cfg.embed_dim, matrix.shape[1], matrix.shape[0]))
    out = np.random.default_rng(seed).normal(0, float(m.std()) * 0.1, (cfg.vocab_size, cfg.embed_dim))
    out[: m.shape[0], : m.shape[1]] = m
    out[cfg.pad_id] = 0.0
    student.init_embeddings(out.astype(np.float32))


def vocab_matrix(store: Store, teacher: str) -> np.ndarray | None:
    """The teacher's `vocab` output ([vocab, dim]), read once and checked against its manifest checksum."""
    rel = f"teachers/{teacher}/vocab.safetensors"
    if rel not in store.manifest.extras.get("files", {}) or not store.loc.is_local:
        return None
    tensors = load(store.read_recorded(rel))
    why = vocab_problem(tensors, store.table(teacher_table(teacher)).meta.get("dim"))
    if why:  # else PCA of a matrix of another width, and the error blames --embed-dim
        raise StoreError(why, store.loc.path(rel), file_repair(store.root))
    return tensors["vectors"]


def _sif(s: Setup, vocab_size: int) -> np.ndarray:
    """SIF weights from token counts over every text of the store (streamed shard by shard)."""
    cols = ["text_a", "text_b"] if s.store.manifest.pairs else ["text"]
    shards = (t for k in sorted(s.store.table("texts").shards)
              for t in s.store.read_shard("texts", k, cols).to_pydict().values())
    return sif_weights(token_counts(shards, s.tok, vocab_size))


def _fit_rows(m: np.ndarray, rows: int) -> np.ndarray:
    """A matrix with exactly `rows` rows (tokens beyond the vocab output's: zeros)."""
    out = np.zeros((rows, m.shape[1]), dtype=np.float32)
    out[: min(rows, len(m))] = m[:rows]
    return out
