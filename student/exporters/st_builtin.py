"""Students rebuilt from sentence-transformers' built-in modules, the student's weights mapped in (issue 49).

Only for students `st_fit.gap` passes; pooling and head are added by st_directory.py.

- bilstm: WordEmbeddings + LSTM. kd's one bidirectional layer per module is torch's stacked LSTM split up: layer
  i's `weight_ih_l0[_reverse]` is the stacked module's `weight_ih_l{i}[_reverse]`, directions concatenated
  forward-first in both; both pack by length, so padding never enters either direction.
- cnn (one layer): WordEmbeddings + CNN + Dense(0/1 selection weight, ReLU, on token_embeddings). CNN pads every
  width k with (k-1)//2 zeros on both sides and gives each the same channels; kd pads (k-1)//2 left and k//2
  right and splits hidden_dim unevenly. So an even k becomes k+1 with a zero first tap (the same window), every
  width gets the most channels any has (extra channels all zero), and the Dense picks kd's channels back in kd's
  order and applies kd's per-token ReLU, exactly (x * 1 + 0 * y is x). Row 0 of the exported table is zero:
  WordEmbeddings pads with id 0 and the convolution reads padded positions, where kd reads zeros (so a text that
  spells out the pad token itself, "[PAD]", is the one that differs when the student's pad row is not zero).
- ffn: WordEmbeddings + one Dense(ReLU) per layer on token_embeddings: kd's per-token MLP itself.
- transformer: a BertModel for the Transformer module. kd's layers are torch's post-LN TransformerEncoderLayer
  (GELU, eps 1e-5): BERT's layer with q/k/v split out of `in_proj`; the embeddings' LayerNorm(tokens + positions)
  is BERT's with a zero token-type row, and a width-changing input map is folded into the token table.
"""

from __future__ import annotations

import torch
from torch import nn

from kd.student.models import Arch
from kd.student.saved import LoadedStudent


def word_encoder(st: LoadedStudent) -> list[nn.Module]:
    """WordEmbeddings (the student's tokenizer and token table) and the encoder's modules, for bilstm/cnn/ffn."""
    from sentence_transformers.sentence_transformer.modules import WordEmbeddings

    cfg = st.config
    table = st.model.embed.weight.detach().clone()
    if cfg.arch is Arch.cnn:
        table[0] = 0.0  # WordEmbeddings pads with id 0 (st_fit: the pad id is 0); kd's convolution sees zeros there
    # max_seq_length: WordEmbeddings keeps the first max_length ids of a longer text, as the student does
    # (StudentConfig.first_ids)
    embeddings = WordEmbeddings(st.tokenizer, table, max_seq_length=cfg.max_length)
    build = {Arch.bilstm: _lstm, Arch.cnn: _cnn, Arch.ffn: _ffn}[cfg.arch]
    return [embeddings, *build(st)]


def _lstm(st: LoadedStudent) -> list[nn.Module]:
    from sentence_transformers.sentence_transformer.modules import LSTM

    cfg = st.config
    # dropout only acts between stacked layers (and only in training); torch warns about it for one layer
    lstm = LSTM(cfg.embed_dim, cfg.hidden_dim, num_layers=cfg.num_layers,
                dropout=cfg.dropout if cfg.num_layers > 1 else 0.0)
    state = {f"encoder.{name.replace('_l0', f'_l{i}')}": value.detach().clone()
             for i, rnn in enumerate(st.model.encoder.rnns) for name, value in rnn.state_dict().items()}
    lstm.load_state_dict(state)
    return [lstm]


def _cnn(st: LoadedStudent) -> list[nn.Module]:
    from sentence_transformers.sentence_transformer.modules import CNN

    cfg = st.config
    convs = st.model.encoder.layers[0]
    most = max(conv.out_channels for conv in convs)
    widths = [k + 1 - k % 2 for k in cfg.kernel_sizes]  # odd: CNN's symmetric padding keeps the length
    cnn = CNN(cfg.embed_dim, most, widths)
    pick = torch.zeros(cfg.hidden_dim, most * len(convs))  # kd's channel c <- CNN's column
    with torch.no_grad():
        for j, (conv, target) in enumerate(zip(convs, cnn.convs)):
            target.weight.zero_()
            target.bias.zero_()
            # an even width's taps shift one right: the added first tap reads the position kd's window starts before
            target.weight[: conv.out_channels, :, target.kernel_size[0] - conv.kernel_size[0]:] = conv.weight
            target.bias[: conv.out_channels] = conv.bias
            start = sum(c.out_channels for c in convs[:j])
            pick[start + torch.arange(conv.out_channels), j * most + torch.arange(conv.out_channels)] = 1.0
    relu = _token_dense(nn.Linear(most * len(convs), cfg.hidden_dim, bias=False))
    with torch.no_grad():
        relu.linear.weight.copy_(pick)
    return [cnn, relu]


def _ffn(st: LoadedStudent) -> list[nn.Module]:
    return [_token_dense(layer) for layer in st.model.encoder.layers]


def _token_dense(linear: nn.Linear) -> nn.Module:
    """Dense over every token's state (not the sentence's), then ReLU: one kd feed-forward step."""
    from sentence_transformers.sentence_transformer.modules import Dense

    bias = linear.bias
    return Dense(linear.in_features, linear.out_features, bias=bias is not None, activation_function=nn.ReLU(),
                 init_weight=linear.weight.detach().clone(),
                 init_bias=None if bias is None else bias.detach().clone(), module_input_name="token_embeddings")


def transformer_as_bert(st: LoadedStudent):
    """kd's small transformer as a transformers BertModel giving the same token states."""
    from transformers import BertConfig, BertModel

    cfg, enc = st.config, st.model.encoder
    first = enc.layers[0]
    bert = BertModel(BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_dim, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_dim, hidden_act="gelu",
        max_position_embeddings=cfg.max_length, type_vocab_size=1, layer_norm_eps=first.norm1.eps,
        pad_token_id=cfg.pad_id, hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
    ), add_pooling_layer=False)
    with torch.no_grad():
        state = {"embeddings.word_embeddings.weight": enc.inp(st.model.embed.weight),  # folded input map
                 "embeddings.position_embeddings.weight": enc.pos.weight,
                 "embeddings.token_type_embeddings.weight": torch.zeros(1, cfg.hidden_dim),
                 "embeddings.LayerNorm.weight": enc.norm.weight, "embeddings.LayerNorm.bias": enc.norm.bias}
        for i, layer in enumerate(enc.layers):
            state |= _bert_layer(f"encoder.layer.{i}.", layer)
        bert.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    return bert


def _bert_layer(prefix: str, layer: nn.TransformerEncoderLayer) -> dict[str, torch.Tensor]:
    """One torch post-LN encoder layer's weights under BERT's names."""
    attn = layer.self_attn
    out = {}
    for name, w, b in zip(("query", "key", "value"), attn.in_proj_weight.chunk(3), attn.in_proj_bias.chunk(3)):
        out |= {f"{prefix}attention.self.{name}.weight": w, f"{prefix}attention.self.{name}.bias": b}
    pairs = {"attention.output.dense": attn.out_proj, "attention.output.LayerNorm": layer.norm1,
             "intermediate.dense": layer.linear1, "output.dense": layer.linear2, "output.LayerNorm": layer.norm2}
    for name, module in pairs.items():
        out |= {f"{prefix}{name}.weight": module.weight, f"{prefix}{name}.bias": module.bias}
    return out
