"""The bundled sentences a backend is measured and calibrated on (pipeline/backends/data/calibration_sentences.txt).

- 640 sentences: the first 640 of the demo corpus's round-robin order (Leipzig news and Wikipedia, Brown,
  WordNet glosses, mixed), copied here so stage one owns its data and never imports `apps`;
- the first 2 x FIDELITY_ROWS are the fidelity sample (pairs for cross-encoders take both halves), the
  next 2 x CALIBRATION_ROWS the int8 calibration set, disjoint so a fidelity is not measured on the
  sentences the quantisation was fitted to.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

SENTENCES = Path(__file__).with_name("data") / "calibration_sentences.txt"
FIDELITY_ROWS = 64
CALIBRATION_ROWS = 256  # int8 smoothing / static-range statistics


@lru_cache(maxsize=1)
def _sentences() -> tuple[str, ...]:
    return tuple(SENTENCES.read_text(encoding="utf-8").splitlines())


def fidelity_sentences() -> list[str]:
    """2 x FIDELITY_ROWS sentences: the sample a backend's outputs are compared to torch fp32 on."""
    return list(_sentences()[: 2 * FIDELITY_ROWS])


def calibration_sentences() -> list[str]:
    """2 x CALIBRATION_ROWS sentences after the fidelity sample's, for int8 calibration."""
    return list(_sentences()[2 * FIDELITY_ROWS : 2 * FIDELITY_ROWS + 2 * CALIBRATION_ROWS])
