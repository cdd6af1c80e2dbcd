"""Student encoders: shapes, exact padding invariance, heads, config round trip, embedding init/PCA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from single_thread import one_thread  # noqa: F401  (autouse: this module runs on one thread)
from student_stores import tiny_bert_config

from kd.common.errors import KdError
from kd.student.models import Arch, Pooling, StudentConfig, build_student, pca_embeddings
from kd.student.pooling import AttentivePooling, masked_max, masked_mean

VOCAB = 40


def tiny(arch: Arch, pooling: Pooling = Pooling.mean, **kw) -> StudentConfig:
    base = dict(arch=arch, vocab_size=VOCAB, embed_dim=8, hidden_dim=12, num_layers=2, pooling=pooling, out_dim=10,
                dropout=0.0, max_length=32, num_heads=2, ffn_dim=16, attention_dim=6, kernel_sizes=(2, 3),
                bert=tiny_bert_config(8, 2, VOCAB, 32) if arch is Arch.transformer_init else None)
    return StudentConfig(**{**base, **kw})


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 1])
    mask = (torch.arange(7)[None] < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, (4, 7), generator=g) * mask  # pad id 0 after each row's length
    return ids, mask


@pytest.mark.parametrize("pooling", list(Pooling))
@pytest.mark.parametrize("arch", list(Arch))
def test_shapes_and_padding_invariance(arch: Arch, pooling: Pooling) -> None:
    torch.manual_seed(0)
    cfg = tiny(arch, pooling)
    model = build_student(cfg).eval()
    ids, mask = batch()
    out = model(ids, mask)
    assert out.embedding.shape == (4, 10)
    assert out.layers.shape == (4, *cfg.layers_shape) == (4, 2 if arch is Arch.static else 3, max(8, cfg.width))
    # 5 more padding columns, and a row-order shuffle, must not change any row's output
    pad_ids = torch.cat([ids, torch.zeros(4, 5, dtype=ids.dtype)], 1)
    pad_mask = torch.cat([mask, torch.zeros(4, 5, dtype=mask.dtype)], 1)
    padded = model(pad_ids, pad_mask)
    torch.testing.assert_close(padded.embedding, out.embedding, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded.layers, out.layers, atol=1e-5, rtol=1e-5)
    # a row on its own, without the batch's padding, gives the same result too
    alone = model(ids[1:2, :3], mask[1:2, :3])
    torch.testing.assert_close(alone.embedding, out.embedding[1:2], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", list(Arch))
def test_layers_are_masked_means_embeddings_first(arch: Arch) -> None:
    model = build_student(tiny(arch)).eval()
    ids, mask = batch()
    out = model(ids, mask)
    emb = model.embed(ids[1, :3]).mean(0)  # row 1 has 3 real tokens
    torch.testing.assert_close(out.layers[1, 0, :8], emb)
    assert torch.all(out.layers[:, 0, 8:] == 0)  # the narrower embeddings layer is zero-padded


@pytest.mark.parametrize("arch", list(Arch))
def test_all_padding_row_is_finite(arch: Arch) -> None:
    model = build_student(tiny(arch, Pooling.attentive)).eval()
    ids, mask = batch()
    mask[2] = 0
    out = model(ids, mask)
    assert torch.isfinite(out.embedding).all() and torch.isfinite(out.layers).all()


def test_sra_head_is_bias_free_tanh_and_default_for_bilstm() -> None:
    torch.manual_seed(0)  # the saturation check depends on the random recurrent weights
    cfg = tiny(Arch.bilstm)
    assert cfg.sra_head is True and tiny(Arch.bigru).sra_head is False
    model = build_student(cfg)
    linear = model.head[0]
    assert linear.bias is None and linear.in_features == 24 and linear.out_features == 10
    with torch.no_grad():
        linear.weight.fill_(10.0)
    out = model(*batch()).embedding
    assert out.abs().max() <= 1.0 and out.abs().max() > 0.99  # saturated tanh


def test_projection_only_when_widths_differ() -> None:
    assert isinstance(build_student(tiny(Arch.ffn, out_dim=12)).head, torch.nn.Identity)
    head = build_student(tiny(Arch.cnn, out_dim=5)).head
    assert isinstance(head, torch.nn.Linear) and (head.in_features, head.out_features) == (12, 5)


def test_poolings_by_hand() -> None:
    h = torch.tensor([[[1.0, -2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[True, True, False]])
    torch.testing.assert_close(masked_mean(h, mask), torch.tensor([[2.0, 1.0]]))
    torch.testing.assert_close(masked_max(h, mask), torch.tensor([[3.0, 4.0]]))
    attend = AttentivePooling(2, 3)
    torch.nn.init.zeros_(attend.score[2].weight)  # constant scores -> uniform weights over real tokens = mean
    torch.testing.assert_close(attend(h, mask), masked_mean(h, mask))


def test_inputs_longer_than_max_length_are_cut() -> None:
    model = build_student(tiny(Arch.transformer, max_length=4)).eval()
    ids, mask = batch()
    torch.testing.assert_close(model(ids, mask).embedding, model(ids[:, :4], mask[:, :4]).embedding)


def test_config_round_trip_and_errors() -> None:
    cfg = tiny(Arch.cnn, Pooling.max)
    d = cfg.to_dict()
    assert d["arch"] == "cnn" and d["pooling"] == "max" and d["kernel_sizes"] == [2, 3]
    assert StudentConfig.from_dict(d) == cfg
    with pytest.raises(KdError, match="unknown student config keys"):
        StudentConfig.from_dict({**d, "nope": 1})
    with pytest.raises(KdError, match="arch"):
        StudentConfig(arch="rnn")
    with pytest.raises(KdError, match="divisible"):
        tiny(Arch.transformer, hidden_dim=9)
    with pytest.raises(KdError, match=r"invalid student config: \['dropout=1.0'\]\n"):  # the bad value alone
        tiny(Arch.ffn, dropout=1.0)
    with pytest.raises(KdError) as e:  # a received config.json's bad value names that file (the sixth probe)
        StudentConfig.from_dict({**d, "dropout": 5.0}, "/x/config.json")
    assert e.value.where == "/x/config.json" and "dropout=5.0" in e.value.what


def test_init_embeddings_and_pca() -> None:
    rng = np.random.default_rng(0)
    # rank-3 data in 20 dims: PCA to 3 dims keeps every pairwise distance
    matrix = (rng.normal(size=(VOCAB, 3)) @ rng.normal(size=(3, 20))).astype(np.float32)
    reduced = pca_embeddings(matrix, 8)[:, :3]
    small = pca_embeddings(matrix, 3)
    assert small.shape == (VOCAB, 3) and small.dtype == np.float32
    np.testing.assert_allclose(small, reduced, atol=1e-3)
    d_full = np.linalg.norm(matrix[:, None] - matrix[None], axis=-1)
    d_small = np.linalg.norm(small[:, None] - small[None], axis=-1)
    np.testing.assert_allclose(d_small, d_full, rtol=1e-3, atol=1e-3)
    assert pca_embeddings(matrix, 20) is not None and pca_embeddings(matrix, 20).shape == (VOCAB, 20)
    with pytest.raises(KdError, match="cannot reduce"):
        pca_embeddings(matrix, 50)

    model = build_student(tiny(Arch.ffn))
    emb = pca_embeddings(matrix, 8)
    model.init_embeddings(emb)
    np.testing.assert_array_equal(model.embed.weight.detach().numpy(), emb)
    with pytest.raises(KdError, match="pca_embeddings"):
        model.init_embeddings(matrix)
    assert model.num_parameters() == sum(p.numel() for p in model.parameters()) > VOCAB * 8
