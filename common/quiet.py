"""Silence third-party exporters (torch.onnx, ONNX Runtime's quantizer, NNCF) while kd prints its own summary."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet(*loggers: str) -> Iterator[None]:
    """stdout to /dev/null, warnings ignored, and the named loggers (default: torch.onnx) at ERROR."""
    logs = [logging.getLogger(name) for name in (loggers or ("torch.onnx",))]
    levels = [log.level for log in logs]
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for log in logs:
            log.setLevel(logging.ERROR)  # e.g. "torchvision is not installed. Skipping torchvision::nms"
        try:
            yield
        finally:
            for log, level in zip(logs, levels):
                log.setLevel(level)
