"""Which students sentence-transformers' own modules reproduce, and what `kd export` says of the others (issue 49).

A chain of built-in modules loads with plain `SentenceTransformer(dir)`, no `trust_remote_code`. Measured against
sentence-transformers 6.2's modules (tests/student/test_st_builtin_export.py):

- static: StaticEmbedding [+ Dense] (st_directory.py); transformer-init and transformer: Transformer (a BertModel:
  the kept teacher layers, or the student's post-LN layers mapped into BERT's) + Pooling [+ Dense]. Their tokenizer
  is the student's, with its truncation: every text gives the student's vectors.
- bilstm, cnn, ffn: WordEmbeddings (the student's WordPiece tokenizer through `TransformersTokenizerWrapper`) +
  LSTM | CNN + Dense(ReLU on tokens) | Dense(ReLU on tokens) x layers, then Pooling [+ Dense] (st_builtin.py).
  WordEmbeddings tokenizes without truncation and then keeps the first max_length ids, so a text longer than
  max_length tokens loses its final [SEP]; these students cut so in training and in kd's encode too
  (`StudentConfig.first_ids`), so texts of every length get the student's vectors.
  The CNN's widths and channels are kd's, reshaped to what CNN can hold (st_builtin.py): an even width k becomes
  k+1 with a zero first tap, every width gets the most channels any has, the extra ones zero and dropped again.
- what no built-in has: a GRU, attentive pooling, cls pooling after WordEmbeddings (it sets `cls_token_embeddings`
  to None, which Pooling then reads), a multi-layer CNN (kd zeroes padded positions before every layer; CNN
  cannot), a CNN under a pad id other than 0 (WordEmbeddings pads with id 0, which a convolution then reads).
  Those keep kd's `KdTokenEncoder` (`gap` names why) and load with `kd.student.load_exported` or as ONNX.
"""

from __future__ import annotations

from kd.student.models import WORD_ARCHS, Arch, StudentConfig
from kd.student.pooling import Pooling

PLAIN_ST = "plain SentenceTransformer(path)"


def gap(cfg: StudentConfig) -> str | None:
    """Why no chain of sentence-transformers' built-in modules reproduces this student; None when one does."""
    if cfg.arch is Arch.bigru:
        return "sentence-transformers has no GRU module (its LSTM module is an LSTM only)"
    if cfg.pooling is Pooling.attentive:
        return "sentence-transformers' Pooling has no attentive pooling"
    if cfg.arch in WORD_ARCHS and cfg.pooling is Pooling.cls:
        return ("cls pooling after sentence-transformers' WordEmbeddings fails (it sets cls_token_embeddings to "
                "None, which Pooling reads)")
    if cfg.arch is Arch.cnn:
        return _cnn_gap(cfg)
    return None


def _cnn_gap(cfg: StudentConfig) -> str | None:
    if cfg.num_layers > 1:
        return ("sentence-transformers' CNN cannot zero padded positions between layers, as kd's multi-layer cnn "
                "does")
    if cfg.pad_id != 0:
        return f"sentence-transformers' WordEmbeddings pads with id 0, the student's pad id is {cfg.pad_id}"
    return None


def export_note(cfg: StudentConfig) -> str | None:
    """What `kd export --format sentence-transformers` prints and the export's card says (None: nothing to say)."""
    why = gap(cfg)
    if why is not None:
        return (f"a {cfg.arch.value} student with {cfg.pooling.value} pooling needs kd's own module in this folder "
                f"({why}): {PLAIN_ST} refuses it without trust_remote_code, which must never be granted to a "
                "received folder. Load it with kd.student.load_exported(path), or export --format onnx "
                "(onnxruntime and tokenizers only).")
    return None
