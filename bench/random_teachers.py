"""Teachers with random weights from the real checkpoints' folders minus their weights (the GPU scripts' bundle).

- BUNDLE/NAME-shape holds a checkpoint's config.json, tokenizer and sentence-transformers files, no weights
  (a GPU machine here takes at most 64 MiB per call, and mpnet's weights alone are 438 MB);
- OUT/NAME gets those files plus weights drawn at random (seed 0): the same architecture, tokens and FLOPs
  per row as the real teacher, so speed figures hold for it; quality figures do not.

    python bench/random_teachers.py .gpu /tmp/t mpnet minilm
"""

from __future__ import annotations

import shutil
import sys


def build(bundle: str, out: str, names: list[str]) -> None:
    import torch
    from transformers import AutoConfig, AutoModel

    for name in names:
        shutil.copytree(f"{bundle}/{name}-shape", f"{out}/{name}")
        torch.manual_seed(0)
        AutoModel.from_config(AutoConfig.from_pretrained(f"{out}/{name}")).save_pretrained(f"{out}/{name}")


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2], sys.argv[3:])
