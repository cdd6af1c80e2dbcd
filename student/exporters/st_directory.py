"""`kd export STUDENT --format sentence-transformers`: a student as a sentence-transformers directory.

Built-in modules wherever they reproduce the student (st_fit.py decides and says why not), so the directory
loads with plain `SentenceTransformer(dir)`:
- static: `StaticEmbedding` (mean of token vectors) [+ bias-free `Dense`] + `Normalize`. kd averages the
  tokenizer's special tokens too ([CLS]/[SEP]), which StaticEmbedding never adds; their summed vector
  becomes one extra vocabulary entry that the tokenizer inserts once per text (a normaliser prepends a
  control character that the BERT normaliser has already removed from the text). The mean then runs over
  n+1 tokens instead of n+2: the same direction, so the output is normalised.
- transformer-init, transformer: `Transformer` (a BertModel: the kept teacher layers with the student's token
  table, or the student's own layers mapped into BERT's, st_builtin.py) + `Pooling` [+ `Dense`].
- bilstm, cnn, ffn: `WordEmbeddings` + `LSTM` | `CNN` + `Dense`(ReLU) | `Dense`(ReLU) per layer, then `Pooling`
  [+ `Dense`] (st_builtin.py), equal to the student on texts of any length (StudentConfig.first_ids).
- every arch ends in `Normalize`: its vectors are those of the student's default `encode`.
- what no built-in reproduces (a GRU, attentive pooling, a multi-layer cnn, ... : `st_fit.gap`):
  `student.st_module.KdTokenEncoder` + `Pooling` [+ `Dense`]. sentence-transformers imports a class outside
  its package only with `trust_remote_code=True`, which lets the folder choose the code that runs; so these
  load with `kd.student.load_exported(dir)` (student.st_load), which checks the folder and builds the modules
  itself (every export loads that way too), or as ONNX; `kd export` says so.
The directory is written next to its final place and renamed in, so no half-written directory remains.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from kd.common.errors import KdError
from kd.common.fast_tokenizer import FastTokenizer
from kd.student.exporters.folder import export_folder
from kd.student.exporters.st_builtin import transformer_as_bert, word_encoder
from kd.student.exporters.st_fit import gap
from kd.student.models import Arch, Student
from kd.student.saved import TOKENIZER, LoadedStudent, load

OFFSET_TOKEN = "\x00"  # removed from every text by BertNormalizer(clean_text), so only the inserted one exists


def export_sentence_transformers(student_dir: str | os.PathLike, out: str | os.PathLike,
                                 overwrite: bool = False) -> Path:
    """Write `out` as a sentence-transformers directory whose `encode` reproduces the student's."""
    with export_folder(out, student_dir, overwrite) as (target, scratch):
        st = load(student_dir)
        model = sentence_transformer(st, scratch / "work")
        model.save(str(scratch / "model"), create_model_card=False)
    return target


def sentence_transformer(st: LoadedStudent, work: Path):
    """The SentenceTransformer equivalent of a loaded student (built-in modules where they fit)."""
    from sentence_transformers import SentenceTransformer

    arch = st.config.arch
    if arch is Arch.static:
        modules = _static_modules(st)
    elif gap(st.config) is not None:
        modules = _custom_modules(st)
    elif arch is Arch.transformer_init:
        modules = [_bert_input(st, _kept_layers(st), work), *_pooling_and_head(st)]
    elif arch is Arch.transformer:
        modules = [_bert_input(st, transformer_as_bert(st), work), *_pooling_and_head(st)]
    else:
        modules = [*word_encoder(st), *_pooling_and_head(st)]
    if not isinstance(modules[-1], _normalize()):  # every export gives unit vectors, as the student's encode does
        modules.append(_normalize()())
    model = SentenceTransformer(modules=modules, device="cpu")
    model.eval()
    return model


def _normalize() -> type:
    from sentence_transformers.base.modules.normalize import Normalize

    return Normalize


def _pooling_and_head(st: LoadedStudent) -> list[nn.Module]:
    """Built-in Pooling (unless attentive: done inside KdTokenEncoder) and the head as a Dense module."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    cfg = st.config
    mods: list[nn.Module] = []
    if cfg.pooling.value != "attentive":
        mods.append(Pooling(cfg.width, cfg.pooling.value))
    head = _dense(st.model)
    return mods + ([head] if head is not None else [])


def _dense(model: Student) -> nn.Module | None:
    """The student's head as Dense: SRA's bias-free linear + tanh, a plain linear map, or nothing."""
    from sentence_transformers.base.modules.dense import Dense

    head = model.head
    activation: nn.Module = nn.Identity()
    if isinstance(head, nn.Sequential):  # SRA: Linear(bias=False) then Tanh
        head, activation = head[0], nn.Tanh()
    if not isinstance(head, nn.Linear):
        return None
    return Dense(head.in_features, head.out_features, bias=head.bias is not None, activation_function=activation,
                 init_weight=head.weight.detach().clone(),
                 init_bias=None if head.bias is None else head.bias.detach().clone())


def _custom_modules(st: LoadedStudent) -> list[nn.Module]:
    from kd.student.st_module import KdTokenEncoder  # lazy: sentence-transformers (seconds), for kd's own module

    enc = KdTokenEncoder(st.config.to_dict(), pool=st.config.pooling.value == "attentive", tokenizer=st.tokenizer)
    state = {k: v for k, v in st.model.state_dict().items() if not k.startswith("head.")}
    enc.model.load_state_dict(state)
    return [enc, *_pooling_and_head(st)]


def _kept_layers(st: LoadedStudent):
    """transformer-init's kept BERT layers as a Hugging Face model, the student's token table put back."""
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(**{**st.config.bert, "vocab_size": st.config.vocab_size}), add_pooling_layer=False)
    state = st.model.encoder.bert.state_dict()
    state["embeddings.word_embeddings.weight"] = st.model.embed.weight.detach()
    bert.load_state_dict(state)
    return bert


def _bert_input(st: LoadedStudent, bert: nn.Module, work: Path) -> nn.Module:
    """A BertModel saved as a Hugging Face model, loaded by the built-in Transformer module with the student's
    tokenizer and max length."""
    from sentence_transformers.base.modules.transformer import Transformer
    from transformers import AutoTokenizer

    bert.save_pretrained(work)
    # Right-padded as the student trained (common/padding.py), whatever side the teacher's tokenizer pads on: left
    # padding would move every token's position embedding. Saved so, the module reloads it so.
    AutoTokenizer.from_pretrained(st.path / TOKENIZER, padding_side="right").save_pretrained(work)
    # transformers gives the loaded BertModel a pooler the saved one lacks, drawn from torch's global generator: the
    # export's bytes differed between two exports of one student (a resumed kd distill's from an unkilled one's: a
    # probe). Drawn from a fixed seed, without touching the caller's generator.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Transformer(str(work), max_seq_length=st.config.max_length)


def _static_modules(st: LoadedStudent) -> list[nn.Module]:
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding

    tokenizer, offset_ids = _offset_tokenizer(st)
    table = st.model.embed.weight.detach()
    table = torch.cat([table, table[offset_ids].sum(0, keepdim=True)])  # the inserted token: sum of specials
    head = _dense(st.model)
    return [StaticEmbedding(tokenizer, embedding_weights=table), *([head] if head else []), _normalize()()]


def _offset_tokenizer(st: LoadedStudent):
    """The student's tokenizer with one new token inserted before every text in place of the special
    tokens, truncated to leave room for it; returns it and the special token ids it stands for."""
    spec = json.loads(st.tokenizer.backend_tokenizer.to_str())
    norm = spec.get("normalizer") or {}
    if spec["model"].get("type") != "WordPiece" or norm.get("type") != "BertNormalizer" or not norm.get("clean_text"):
        raise KdError("static students export to sentence-transformers for BERT WordPiece tokenizers only",
                      str(st.path), "use --format onnx, or encode with kd (student.load)")
    if st.tokenizer.truncation_side != "right":
        raise KdError("a static student whose tokenizer truncates on the left has no sentence-transformers export "
                      "(the token inserted before every text would be the first cut from a long one)", str(st.path),
                      "use --format onnx, or encode with kd (student.load)")
    # the special tokens every text gets, as training and `encode` add them
    offset_ids = FastTokenizer.from_transformers(st.tokenizer, str(st.path)).encode([""])["input_ids"][0]
    vocab = spec["model"]["vocab"]
    vocab[OFFSET_TOKEN] = st.config.vocab_size  # one row past the student's table
    spec["normalizer"] = {"type": "Sequence", "normalizers": [norm, {"type": "Prepend", "prepend": OFFSET_TOKEN + " "}]}
    spec["post_processor"] = None
    spec["padding"] = None
    # kd keeps max_length tokens with the specials; here the offset token takes their place
    spec["truncation"] = {"direction": "Right", "max_length": st.config.max_length - len(offset_ids) + 1,
                          "strategy": "LongestFirst", "stride": 0}
    return Tokenizer.from_str(json.dumps(spec)), offset_ids
