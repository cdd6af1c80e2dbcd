"""The one check of a stored BERT config (a teacher's `init` output, `teachers/<name>/init-*/config.json`) before a
student is built from it: the sizes a model is allocated by, bounded, and no pointer to code.

A transformer-init student is built from this file's `hidden_size`, `num_hidden_layers`, ... directly (no weights
file bounds them first, as `student.saved.build_to_fit` does for a received student): a forged
`num_hidden_layers: 1000000000` would allocate a billion layers. The bounds are far past any published encoder
(BERT-large: 1,024 wide, 24 layers; XLM-R's 250,002-token vocabulary).
"""

from __future__ import annotations

from typing import Any

from kd.common.parsing import has_auto_map

# key -> (least, most); every one of them a size something is allocated by
SIZES = {"hidden_size": (1, 1 << 14), "num_hidden_layers": (1, 256), "num_attention_heads": (1, 256),
         "intermediate_size": (1, 1 << 16), "vocab_size": (1, 1 << 21), "max_position_embeddings": (1, 1 << 16),
         "type_vocab_size": (0, 1 << 10)}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def bert_config_problem(cfg: Any) -> str | None:
    """What is wrong with a parsed BERT config kd would build a model from (None: nothing)."""
    if not isinstance(cfg, dict):
        return f"the config is a JSON {type(cfg).__name__}, not an object"
    if has_auto_map(cfg):
        return "the config has an auto_map entry (a pointer to Python code kd never runs)"
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        return f"the config lacks {', '.join(missing)}"
    for key, (least, most) in SIZES.items():
        value = cfg.get(key, least)
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
            return f"the config's {key} is {value!r}, not a whole number from {least:,} to {most:,}"
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        return (f"the config's hidden_size {cfg['hidden_size']} is not a multiple of its num_attention_heads "
                f"{cfg['num_attention_heads']}")
    return None
