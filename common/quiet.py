"""Third-party output kd replaces with its own: every place that silences a library is here.

- `quiet()`: exporters (torch.onnx, ONNX Runtime's quantizer, NNCF) while kd prints its own summary;
- `hush_libraries()`: Hugging Face's own logs, warnings and bars (transformers' LOAD REPORT, "Loading weights",
  "Writing model shards", huggingface_hub's download bars) for a whole kd command, unless `--verbose` /
  KD_VERBOSE=1: kd prints its own progress and turns what a user can act on into a KdError.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
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


VERBOSE_ENV = "KD_VERBOSE"
# Read when each library is imported, and inherited by child processes (Ray workers, torchrun ranks).
_HF_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
_HF_MODULES = ("transformers", "huggingface_hub", "sentence_transformers", "safetensors", "tokenizers")


def verbose() -> bool:
    """KD_VERBOSE=1 (what `kd --verbose` sets): Hugging Face's own output is left on."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def set_verbose(on: bool) -> None:
    """`kd --verbose`: recorded in the environment, so the library code and child processes see it too."""
    if on:
        os.environ[VERBOSE_ENV] = "1"
        _loud_imported()
    else:
        hush_libraries()


def hush_libraries() -> None:
    """Hugging Face's logs, warnings and progress bars off for this process and its children, unless verbose()."""
    if verbose():
        return
    for key, value in _HF_ENV.items():
        os.environ.setdefault(key, value)  # a user's own TRANSFORMERS_VERBOSITY stands
    pattern = "|".join(_HF_MODULES)
    warnings.filterwarnings("ignore", module=rf"({pattern})(\.|$)")
    for name in _HF_MODULES:
        logging.getLogger(name).setLevel(logging.ERROR)
    _hush_imported()


def _hush_imported() -> None:
    # a library imported before this call (by a test, a notebook) has read its environment already
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars  # lazy: only where a library imported it

        disable_progress_bars()


def _loud_imported() -> None:
    # undo an earlier hush_libraries in this process (a test running kd twice), back to the libraries' defaults
    for name in _HF_MODULES:
        logging.getLogger(name).setLevel(logging.NOTSET)
    for key, value in _HF_ENV.items():
        if os.environ.get(key) == value:
            del os.environ[key]
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_warning()
        hf_logging.enable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import enable_progress_bars  # lazy: only where a library imported it

        enable_progress_bars()
