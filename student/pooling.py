"""Padding-masked poolings: a [B, T, H] sequence of token states -> one [B, H] vector per text.

- mean: average of the real tokens (the news paper's default "average aggregation", CoDIR, SBERT).
- max: element-wise max over the real tokens.
- attentive: Raffel & Ellis feed-forward attention, e_t = a(h_t), alpha = softmax(e), c = sum alpha_t h_t,
  with a = a two-layer ReLU network (news paper eq. 4); padding gets zero weight.
- cls: the first token's state (the tokenizer's [CLS]); the news paper's "CLS-aggregation".

Every pooling ignores padding exactly, so appending more padding never changes the result. A row with no
real token at all (an empty mask) pools to zeros rather than NaN.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import Tensor, nn


class Pooling(str, Enum):
    mean = "mean"
    max = "max"
    attentive = "attentive"
    cls = "cls"


def masked_mean(h: Tensor, mask: Tensor) -> Tensor:
    """Mean over the positions where `mask` is true; [B, T, H], [B, T] -> [B, H]."""
    m = mask.unsqueeze(-1)
    # masked_fill, not h * m: whatever an encoder left at padded positions (even NaN) cannot leak in;
    # clamp: an all-padding row divides 0 by 1 instead of 0 by 0
    total = h.masked_fill(~m, 0.0).sum(1)
    return total / m.sum(1).clamp(min=1).to(h.dtype)


def masked_max(h: Tensor, mask: Tensor) -> Tensor:
    m = mask.unsqueeze(-1)
    pooled = h.masked_fill(~m, float("-inf")).amax(1)
    # an all-padding row would be -inf: make it 0 like the other poolings
    return torch.where(m.any(1), pooled, torch.zeros_like(pooled))


class AttentivePooling(nn.Module):
    """Feed-forward attention (Raffel & Ellis 2016): a learned score per token, softmax over real tokens."""

    def __init__(self, width: int, attention_dim: int) -> None:
        super().__init__()
        self.score = nn.Sequential(nn.Linear(width, attention_dim), nn.ReLU(), nn.Linear(attention_dim, 1))

    def forward(self, h: Tensor, mask: Tensor) -> Tensor:
        e = self.score(h).squeeze(-1)  # [B, T]
        # finfo.min rather than -inf: exp underflows to exactly 0 for padding, and an all-padding row
        # stays finite (its weights are then zeroed by the mask below instead of becoming NaN)
        e = e.masked_fill(~mask, torch.finfo(e.dtype).min)
        alpha = torch.softmax(e, dim=-1) * mask.to(h.dtype)
        return torch.einsum("bt,bth->bh", alpha, h.masked_fill(~mask.unsqueeze(-1), 0.0))


class Pool(nn.Module):
    """One pooling chosen by name; owns the attention scorer when pooling is attentive."""

    def __init__(self, kind: Pooling, width: int, attention_dim: int = 128) -> None:
        super().__init__()
        self.kind = Pooling(kind)
        self.attend = AttentivePooling(width, attention_dim) if self.kind is Pooling.attentive else None

    def forward(self, h: Tensor, mask: Tensor) -> Tensor:
        if self.kind is Pooling.mean:
            return masked_mean(h, mask)
        if self.kind is Pooling.max:
            return masked_max(h, mask)
        if self.kind is Pooling.cls:
            return h[:, 0]
        assert self.attend is not None
        return self.attend(h, mask)
