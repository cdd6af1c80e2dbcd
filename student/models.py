"""Student encoders: token ids -> one sentence embedding (plus per-layer summaries for CoDIR).

Every student is the same pipeline, read top to bottom in `Student.forward`:

    ids -> embeddings -> encoder (bilstm | bigru | cnn | ffn | transformer) -> pooling -> head

- embeddings: a plain lookup table; `init_embeddings` copies a teacher's input embeddings into it
  (reduced to `embed_dim` by `pca_embeddings` first), as SRA initialises from GloVe.
- encoder: returns the token states of every layer. The recurrent ones run on packed sequences so
  that padding never enters the recurrence (news paper, sec. 5.1).
- pooling: mean / max / attentive / cls over the real tokens only (`student.pooling`).
- head: SRA's bias-free linear map to the teacher's width followed by tanh (SRA sec. 3.1), or else a
  linear map only when the encoder's width differs from `out_dim` (news paper's "mapping layer").

Alongside the embedding, `layers` holds the masked mean of every layer's token states, embeddings
layer first, which is what CoDIR's contrastive objective compares with the teacher's `layers` column.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from kd.common import hardware
from kd.common.bert_config import bert_config_problem
from kd.common.errors import KdError
from kd.student.pca import pca_embeddings
from kd.student.pooling import Pool, Pooling, masked_mean
from kd.student.static import StaticEncoder
from kd.student.train_config import BASE_DEFAULTS, DEFAULT_EMBED_DIM, DEFAULT_HIDDEN_DIM
from kd.student.transformer_init import TransformerInitEncoder

__all__ = [
    "Arch", "Pooling", "Student", "StudentConfig", "StudentOutput", "build_student", "parameter_count",
    "pca_embeddings", "require_memory",
]


class Arch(str, Enum):
    bilstm = "bilstm"
    bigru = "bigru"
    cnn = "cnn"
    ffn = "ffn"
    transformer = "transformer"
    static = "static"  # one vector per token, averaged (student.static)
    transformer_init = "transformer-init"  # k of the teacher's layers (student.transformer_init)


# The archs exported onto sentence-transformers' WordEmbeddings (student/exporters/st_builtin.py), whose cut of a
# long text they share (StudentConfig.first_ids)
WORD_ARCHS = (Arch.bilstm, Arch.cnn, Arch.ffn)

# --------------------------------------------------------------------------------------------------
# Configuration


@dataclass
class StudentConfig:
    """Everything needed to rebuild a student; stored as JSON next to its weights.

    Widths: `hidden_dim` is per direction for bilstm/bigru (so their token states are 2*hidden_dim
    wide, SRA's 512 units -> 1024), the conv channels summed over all widths for cnn, the model width for
    ffn and transformer.
    """

    arch: Arch = Arch.bilstm
    vocab_size: int = 30522
    pad_id: int = 0
    embed_dim: int = DEFAULT_EMBED_DIM
    hidden_dim: int = DEFAULT_HIDDEN_DIM
    num_layers: int = 1
    pooling: Pooling = Pooling.mean
    out_dim: int = 384
    dropout: float = BASE_DEFAULTS["dropout"]
    max_length: int = BASE_DEFAULTS["max_length"]
    sra_head: bool | None = None  # None: True for bilstm (SRA), False otherwise
    num_heads: int = 4  # transformer
    ffn_dim: int = 1024  # transformer feed-forward width (news paper: 1024)
    kernel_sizes: tuple[int, ...] = (3, 4, 5)  # cnn: one convolution per width in every layer
    attention_dim: int = 128  # attentive pooling's scorer width
    bert: dict[str, Any] | None = None  # transformer-init: the stored BERT config of the kept layers

    @property
    def first_ids(self) -> bool:
        """Whether a text longer than max_length keeps its first max_length ids, [SEP] cut off
        (`FastTokenizer.encode(first_ids=True)`), as sentence-transformers' WordEmbeddings cuts (whatever side
        the tokenizer truncates on): the archs exported onto WordEmbeddings (student/exporters/st_builtin.py),
        so that the export equals the student on texts of any length. The others keep their tokenizer's
        truncation (a Transformer keeps [SEP]; bigru's export runs kd's own module)."""
        return self.arch in WORD_ARCHS

    def __post_init__(self) -> None:
        try:
            self.arch = Arch(self.arch)
            self.pooling = Pooling(self.pooling)
        except ValueError as e:
            raise KdError(
                str(e), "student config",
                f"arch is one of {[a.value for a in Arch]}, pooling one of {[p.value for p in Pooling]}",
            ) from None
        if self.sra_head is None:
            self.sra_head = self.arch is Arch.bilstm
        self.kernel_sizes = tuple(int(k) for k in self.kernel_sizes)
        sizes = ("vocab_size", "embed_dim", "hidden_dim", "num_layers", "out_dim", "max_length", "num_heads",
                 "ffn_dim", "attention_dim")
        bad = [f"{n}={getattr(self, n)}" for n in sizes if int(getattr(self, n)) < 1]
        bad += [f"dropout={self.dropout}"] * (not 0.0 <= self.dropout < 1.0)
        bad += [f"pad_id={self.pad_id}"] * (not 0 <= self.pad_id < self.vocab_size)
        if bad:  # each value that is out of range, and only those
            raise KdError(f"invalid student config: {bad}", "student config",
                          "sizes are >= 1, 0 <= dropout < 1, 0 <= pad_id < vocab_size")
        if self.arch is Arch.transformer_init and self.bert:
            why = bert_config_problem(self.bert)  # sizes a model is built by: bounded before anything is built
            if why is not None:
                raise KdError(f"invalid student config: bert: {why}", "student config",
                              "the student folder is damaged or edited: copy it again as kd wrote it")
            # the teacher fixes the widths: token table and states are its hidden size
            self.embed_dim = self.hidden_dim = int(self.bert["hidden_size"])
            self.num_layers = int(self.bert["num_hidden_layers"])
            self.max_length = min(self.max_length, int(self.bert.get("max_position_embeddings", self.max_length)))
        if self.arch is Arch.transformer and self.hidden_dim % self.num_heads:
            raise KdError(f"hidden_dim {self.hidden_dim} is not divisible by num_heads {self.num_heads}",
                          "student config", "pick a hidden_dim that is a multiple of num_heads")
        if self.arch is Arch.cnn and (not self.kernel_sizes or min(self.kernel_sizes) < 1
                                      or self.hidden_dim < len(self.kernel_sizes)):
            raise KdError(f"cnn needs kernel sizes >= 1 and hidden_dim >= their count, got {self.kernel_sizes}",
                          "student config", "e.g. kernel_sizes=(3, 4, 5) and hidden_dim >= 3")

    @property
    def width(self) -> int:
        """Width of the encoder's token states (what pooling sees)."""
        if self.arch is Arch.static:
            return self.embed_dim
        return 2 * self.hidden_dim if self.arch in (Arch.bilstm, Arch.bigru) else self.hidden_dim

    @property
    def layers_shape(self) -> tuple[int, int]:
        """Shape of `StudentOutput.layers` per row: (num_layers + 1, max(embed_dim, width)).

        The embeddings layer and the encoder layers can differ in width; narrower ones are zero-padded on
        the right so the stack is one dense tensor (a linear map of the flattened stack, which is what
        CoDIR applies, is unaffected: padded inputs are constant zeros).
        """
        encoder_layers = 1 if self.arch is Arch.static else self.num_layers  # static: one "layer", the tokens
        return encoder_layers + 1, max(self.embed_dim, self.width)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["arch"], d["pooling"], d["kernel_sizes"] = self.arch.value, self.pooling.value, list(self.kernel_sizes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "student config") -> StudentConfig:
        """The config a JSON object describes (a student's config.json, an export's kd_student.json: `where`)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise KdError(f"unknown student config keys {unknown}", where,
                          "the student was saved by a newer kd; upgrade kd to load it")
        wrong = _json_type_error(d)
        if wrong:
            raise KdError(f"the student config's {wrong}", where, "the file was edited or damaged: copy the folder "
                          "again as kd wrote it (or write the value as the type named)")
        try:
            return cls(**d)
        except KdError as e:  # __post_init__'s checks, named by the file the values came from
            if e.where != "student config":
                raise
            raise type(e)(e.what, where, e.fix) from None


# The JSON each field's annotation reads from (`from_dict`): a string "256" would pass the size checks (int() takes
# it) and fail far away, in the model's construction, as weights that do not fit.
_JSON_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"), "float": ((int, float), "a number"), "Arch": ((str,), "a string"),
    "Pooling": ((str,), "a string"), "bool | None": ((bool, type(None)), "true, false or null"),
    "tuple[int, ...]": ((list, tuple), "a list of integers"),
    "dict[str, Any] | None": ((dict, type(None)), "an object"),
}

_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
               dict: "an object", type(None): "null"}


def _json_type_error(d: dict[str, Any]) -> str | None:
    """'KEY is VALUE (a TYPE), not EXPECTED' for the first field of `d` of another JSON type, else None."""
    for f in fields(StudentConfig):
        if f.name not in d or str(f.type) not in _JSON_TYPES:
            continue
        types, expected = _JSON_TYPES[str(f.type)]
        v = d[f.name]
        items = v if isinstance(v, (list, tuple)) else []  # a list's items: kernel_sizes' integers
        if not _is_a(v, types) or not all(_is_a(x, (int,)) for x in items):
            return f"{f.name} is {v!r} ({_JSON_NAMES.get(type(v), type(v).__name__)}), not {expected}"
    return None


def _is_a(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))  # JSON's true is no number


@dataclass
class StudentOutput:
    """embedding [B, out_dim]; layers [B, num_layers + 1, H], masked-mean state of each layer."""

    embedding: Tensor
    layers: Tensor | None


# --------------------------------------------------------------------------------------------------
# Encoders: (embedded tokens [B, T, E], mask [B, T] bool) -> token states of every layer, last = output


class RecurrentEncoder(nn.Module):
    """Stacked bidirectional LSTM/GRU, one module per layer so each layer's states can be summarised."""

    def __init__(self, cfg: StudentConfig) -> None:
        super().__init__()
        cell = nn.LSTM if cfg.arch is Arch.bilstm else nn.GRU
        widths = [cfg.embed_dim] + [2 * cfg.hidden_dim] * (cfg.num_layers - 1)
        self.rnns = nn.ModuleList(cell(w, cfg.hidden_dim, batch_first=True, bidirectional=True) for w in widths)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> list[Tensor]:
        # Packing by length keeps padding out of both directions: the backward pass starts at each row's
        # last real token, so extra padding changes nothing. Assumes right padding (what tokenizers do).
        # Rows without any token get length 1 (packing rejects 0); pooling masks them out anyway.
        lengths = mask.sum(1).clamp(min=1).cpu()
        states = []
        for i, rnn in enumerate(self.rnns):
            inp = self.drop(x) if i else x  # between layers only: the embeddings were dropped already
            packed = pack_padded_sequence(inp, lengths, batch_first=True, enforce_sorted=False)
            out, _ = rnn(packed)
            x, _ = pad_packed_sequence(out, batch_first=True, total_length=mask.shape[1])
            states.append(x)
        return states


class ConvEncoder(nn.Module):
    """Layers of parallel 1-D convolutions of several widths (Kim 2014), concatenated, ReLU.

    Each width gets an equal share of `hidden_dim` channels. Padding is zeroed before every convolution
    and each width is "same"-padded with zeros, so a window that runs past the last real token sees
    zeros whether the batch has extra padding or not.
    """

    def __init__(self, cfg: StudentConfig) -> None:
        super().__init__()
        n = len(cfg.kernel_sizes)
        channels = [cfg.hidden_dim // n + (i < cfg.hidden_dim % n) for i in range(n)]
        self.kernel_sizes = cfg.kernel_sizes
        self.layers = nn.ModuleList(
            nn.ModuleList(nn.Conv1d(cfg.embed_dim if layer == 0 else cfg.hidden_dim, c, k)
                          for k, c in zip(cfg.kernel_sizes, channels))
            for layer in range(cfg.num_layers)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> list[Tensor]:
        keep = mask.unsqueeze(1)  # [B, 1, T], conv layout is channels first
        h = x.transpose(1, 2)
        states = []
        for i, convs in enumerate(self.layers):
            h = (self.drop(h) if i else h).masked_fill(~keep, 0.0)
            # (k-1)//2 zeros on the left, k//2 on the right: output length T for odd and even widths
            h = torch.cat([conv(F.pad(h, ((k - 1) // 2, k // 2))) for k, conv in zip(self.kernel_sizes, convs)], 1)
            h = F.relu(h)
            states.append(h.transpose(1, 2))
        return states


class FeedForwardEncoder(nn.Module):
    """A per-token MLP (Linear + ReLU per layer); with pooling on top this is a bag of embeddings.

    The news paper's FFN student: linear layers with ReLU, a mapping layer, average aggregation. Tokens
    never see each other, so it is the fastest student and order-blind. (The paper doubles the width per
    layer; here all layers have `hidden_dim` so that the per-layer summaries stack.)
    """

    def __init__(self, cfg: StudentConfig) -> None:
        super().__init__()
        widths = [cfg.embed_dim] + [cfg.hidden_dim] * cfg.num_layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> list[Tensor]:
        states = []
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(self.drop(x) if i else x))
            states.append(x)
        return states


class TransformerEncoder(nn.Module):
    """Small post-LN transformer (BERT-style): learned positions, padding masked out of attention."""

    def __init__(self, cfg: StudentConfig) -> None:
        super().__init__()
        d = cfg.hidden_dim
        # the news paper's mapping from token embeddings to the model width, when they differ
        self.inp = nn.Linear(cfg.embed_dim, d) if cfg.embed_dim != d else nn.Identity()
        self.pos = nn.Embedding(cfg.max_length, d)
        self.norm = nn.LayerNorm(d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, cfg.num_heads, cfg.ffn_dim, cfg.dropout, activation="gelu",
                                       batch_first=True)
            for _ in range(cfg.num_layers)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> list[Tensor]:
        positions = torch.arange(x.shape[1], device=x.device)
        h = self.drop(self.norm(self.inp(x) + self.pos(positions)))
        # True = ignore this key. An all-padding row keeps key 0 so softmax never sees only -inf (NaN);
        # its states are masked out by pooling anyway.
        ignore = ~mask
        ignore[:, 0] &= mask.any(1)
        states = []
        for layer in self.layers:
            h = layer(h, src_key_padding_mask=ignore)
            states.append(h)
        return states


_ENCODERS: dict[Arch, type[nn.Module]] = {
    Arch.bilstm: RecurrentEncoder,
    Arch.bigru: RecurrentEncoder,
    Arch.cnn: ConvEncoder,
    Arch.ffn: FeedForwardEncoder,
    Arch.transformer: TransformerEncoder,
    Arch.static: StaticEncoder,
    Arch.transformer_init: TransformerInitEncoder,
}


# --------------------------------------------------------------------------------------------------
# The student


class Student(nn.Module):
    def __init__(self, cfg: StudentConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim, padding_idx=cfg.pad_id)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = _ENCODERS[cfg.arch](cfg)
        self.pool = Pool(cfg.pooling, cfg.width, cfg.attention_dim)
        if cfg.sra_head:
            # SRA: bias-free linear to the teacher's width, then tanh, because >98% of BERT [CLS] values
            # lie in (-1, 1); the cosine loss tolerates the few that do not.
            self.head: nn.Module = nn.Sequential(nn.Linear(cfg.width, cfg.out_dim, bias=False), nn.Tanh())
        elif cfg.width != cfg.out_dim:
            # static students: bias-free, so a text's vector stays linear in its tokens' vectors
            self.head = nn.Linear(cfg.width, cfg.out_dim, bias=cfg.arch is not Arch.static)
        else:
            self.head = nn.Identity()

    def forward(self, input_ids: Tensor, attention_mask: Tensor, layers: bool = True) -> StudentOutput:
        """`layers=False` skips the per-layer summaries (only CoDIR's objective reads them)."""
        tokens, states, mask = self._encode(input_ids, attention_mask)
        embedding = self.head(self.pool(states[-1], mask))
        return StudentOutput(embedding, self._summarise([tokens, *states], mask) if layers else None)

    def pooled(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The pooled vector the head reads (what `student.head_fit` regresses the target on)."""
        _, states, mask = self._encode(input_ids, attention_mask)
        return self.pool(states[-1], mask)

    def _encode(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, list[Tensor], Tensor]:
        # cut to max_length so learned positions stay in range (tokenizers should already have)
        ids = input_ids[:, : self.config.max_length]
        mask = attention_mask[:, : self.config.max_length].bool()
        tokens = self.embed(ids)
        return tokens, self.encoder(self.drop(tokens), mask), mask

    def embed_bags(self, flat_ids: Tensor, offsets: Tensor) -> Tensor:
        """Static students at inference: mean of each text's token vectors with no padding at all
        (one embedding_bag over the concatenated ids), then the head. Equals `forward` without dropout."""
        assert self.config.arch is Arch.static
        return self.head(F.embedding_bag(flat_ids, self.embed.weight, offsets, mode="mean"))

    def _summarise(self, states: list[Tensor], mask: Tensor) -> Tensor:
        """Masked mean of every layer, zero-padded to a common width -> [B, L + 1, H]."""
        width = self.config.layers_shape[1]
        return torch.stack([F.pad(masked_mean(s, mask), (0, width - s.shape[-1])) for s in states], 1)

    @torch.no_grad()
    def init_embeddings(self, matrix: np.ndarray) -> None:
        """Copy a [vocab_size, embed_dim] matrix (e.g. a teacher's input embeddings after PCA) in."""
        want = (self.config.vocab_size, self.config.embed_dim)
        if tuple(matrix.shape) != want:
            raise KdError(
                f"embedding matrix has shape {tuple(matrix.shape)}, the student needs {want}",
                "Student.init_embeddings",
                "use the teacher's tokenizer vocabulary and reduce the width with pca_embeddings(matrix, embed_dim)",
            )
        self.embed.weight.copy_(torch.as_tensor(np.asarray(matrix, dtype=np.float32)))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build_student(cfg: StudentConfig) -> Student:
    """The student of `cfg`, refused before anything is allocated when its weights cannot fit in memory."""
    require_memory(cfg, training=False)
    return Student(cfg)


# --------------------------------------------------------------------------------------------------
# Size before building: a model too large for memory is refused up front, not killed by the kernel after a
# minute of allocating (a 128-layer, 16,384-wide transformer is ~1.4e11 parameters).

TRAINING_BYTES = 16  # per parameter while training: the fp32 weight, its gradient, AdamW's two moments
WEIGHT_BYTES = 4  # per parameter of a built (or loaded) model: the fp32 weight
ACTIVATION_MARGIN = 1.25  # a quarter on top for activations, batches and the allocator's slack


def parameter_count(cfg: StudentConfig) -> int:
    """The number of parameters `build_student(cfg)` creates, computed from the config alone (nothing is
    allocated); tests/student/test_bounds.py holds it equal to the built model's count for every arch."""
    e, w = cfg.embed_dim, cfg.width
    total = cfg.vocab_size * e + _encoder_parameters(cfg)
    if cfg.pooling is Pooling.attentive:  # Linear(w, a), ReLU, Linear(a, 1)
        total += w * cfg.attention_dim + 2 * cfg.attention_dim + 1
    if cfg.sra_head:
        total += w * cfg.out_dim
    elif w != cfg.out_dim:
        total += w * cfg.out_dim + (cfg.out_dim if cfg.arch is not Arch.static else 0)
    return total


def _encoder_parameters(cfg: StudentConfig) -> int:
    e, h, n = cfg.embed_dim, cfg.hidden_dim, cfg.num_layers
    # Products, never per-layer lists: a received config.json may say num_layers = 10**9 (issue 48), and the
    # count must come back (and be refused by the memory check) without building anything that long.
    if cfg.arch in (Arch.bilstm, Arch.bigru):
        gates = 4 if cfg.arch is Arch.bilstm else 3
        layer = lambda i: 2 * gates * h * (i + h + 2)  # noqa: E731  two directions; bias_ih and bias_hh
        return layer(e) + (n - 1) * layer(2 * h)
    if cfg.arch is Arch.cnn:
        k = len(cfg.kernel_sizes)
        channels = [h // k + (i < h % k) for i in range(k)]
        layer = lambda i: sum(i * size * c + c for size, c in zip(cfg.kernel_sizes, channels))  # noqa: E731
        return layer(e) + (n - 1) * layer(h)
    if cfg.arch is Arch.ffn:
        return (e * h + h) + (n - 1) * (h * h + h)
    if cfg.arch is Arch.transformer:
        inp = e * h + h if e != h else 0
        return inp + cfg.max_length * h + 2 * h + n * _attention_layer(h, cfg.ffn_dim)
    if cfg.arch is Arch.transformer_init:
        return _bert_parameters(cfg.bert or {})
    return 0  # static: the token table is the whole model


def _attention_layer(d: int, ffn: int) -> int:
    """One post-LN encoder layer (torch's and BERT's alike): q, k, v and output maps, two feed-forward maps,
    two LayerNorms, all with biases."""
    return 4 * (d * d + d) + (d * ffn + ffn) + (ffn * d + d) + 4 * d


def _bert_parameters(bert: dict[str, Any]) -> int:
    """transformer-init's BertModel without its pooler; its word table is a 1-row placeholder (the tokens
    live in `Student.embed`). Missing keys take BertConfig's defaults."""
    h = int(bert.get("hidden_size", 768))
    positions = int(bert.get("max_position_embeddings", 512))
    per_layer = _attention_layer(h, int(bert.get("intermediate_size", 3072)))
    embeddings = (1 + positions + int(bert.get("type_vocab_size", 2))) * h + 2 * h
    return embeddings + int(bert.get("num_hidden_layers", 12)) * per_layer


def memory_needed(cfg: StudentConfig, training: bool) -> int:
    """Bytes the student takes: its weights, or while training also gradients and optimizer state, with
    ACTIVATION_MARGIN on top."""
    per = TRAINING_BYTES if training else WEIGHT_BYTES
    return int(parameter_count(cfg) * per * ACTIVATION_MARGIN)


def require_memory(cfg: StudentConfig, training: bool, available: int | None = None,
                   memory: str = "available memory") -> None:
    """Refuse a student whose estimate (`memory_needed`) exceeds `available` bytes (default: the host's
    available memory; None or unknown: no check)."""
    free = hardware.available_memory() if available is None else available
    need = memory_needed(cfg, training)
    if free is None or need <= free:
        return
    gib = 1 << 30
    state = "weights, gradients and AdamW state" if training else "weights"
    raise KdError(
        f"the student would need about {need / gib:.1f} GiB ({parameter_count(cfg):,} parameters: {state}, "
        f"+{ACTIVATION_MARGIN - 1:.0%} for activations), and only {free / gib:.1f} GiB of {memory} is left",
        f"--arch {cfg.arch.value} --layers {cfg.num_layers} --hidden-dim {cfg.hidden_dim} --embed-dim "
        f"{cfg.embed_dim} (vocabulary {cfg.vocab_size:,})",
        "pass a smaller --layers or --hidden-dim (or --embed-dim), or run where more memory is free")
