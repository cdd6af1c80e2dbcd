"""Which layers a smaller copy of a BERT-style encoder keeps (DistilBERT-style layer selection), and its
weights: the teacher's `init` output (pipeline/teacher/keep_layers.py) and a student shrunk from a trained
student (`kd train-student --init DIR --init-layers 1,3,5`) both use these.

- the default keeps k = half the layers (rounded up), evenly spaced and always ending with the last one,
  because the last layer's output space is what the targets (or the student's head) are fitted to;
- the kept layers are renumbered 0..k-1 in the state dict; every key outside `encoder.layer.N.` is kept as is.
"""

from __future__ import annotations

import re
from typing import TypeVar

from kd.common.errors import InputError

T = TypeVar("T")
_LAYER = re.compile(r"encoder\.layer\.(\d+)\.")


def default_layers(num_layers: int, k: int | None = None) -> list[int]:
    """k evenly spaced layer indices ending with the last: 6 layers, k=3 -> [1, 3, 5]; k=2 -> [2, 5]."""
    k = k or (num_layers + 1) // 2
    return sorted(num_layers - 1 - round(i * num_layers / k) for i in range(k))


def parse_layers(text: str | None, num_layers: int, flag: str) -> list[int]:
    """`flag`'s comma-separated layer numbers, sorted and unique (the default when empty); an InputError
    naming the flag when one is not a number or outside 0..num_layers-1."""
    if not text:
        return default_layers(num_layers)
    example = f"e.g. {flag} {','.join(str(i) for i in default_layers(num_layers))}"
    layers = layer_numbers(text, flag, example)
    if layers[-1] >= num_layers:
        raise InputError(f"{flag} {text!r}: layers are numbered 0..{num_layers - 1}", flag, example)
    return layers


def layer_numbers(text: str, flag: str, example: str = "e.g. 0,2,4") -> list[int]:
    """`flag`'s comma-separated layer numbers (>= 0), sorted and unique: the form alone, for where the model and so
    its layer count are not known yet (a recipe when it is read)."""
    try:
        layers = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise InputError(f"{flag} must be comma-separated layer numbers, got {text!r}", flag, example) from None
    if not layers or layers[0] < 0:
        raise InputError(f"{flag} {text!r}: layers are numbered from 0", flag, example)
    return layers


def keep_layers(state: dict[str, T], layers: list[int]) -> dict[str, T]:
    """`state` with only `layers` of its `encoder.layer.N.` keys, renumbered 0..k-1 in that order."""
    new = {old: i for i, old in enumerate(layers)}
    kept = {}
    for key, value in state.items():
        m = _LAYER.search(key)
        if m is None:
            kept[key] = value
        elif int(m.group(1)) in new:
            kept[f"{key[:m.start()]}encoder.layer.{new[int(m.group(1))]}.{key[m.end():]}"] = value
    return kept
