"""The one table of how large a received model config's sizes may be, and the one check of a stored BERT config (a
teacher's `init` output, `teachers/<name>/init-*/config.json`, and a transformer-init student's `bert`) before
anything is built from it: the sizes a model is allocated by, bounded, and no pointer to code.

transformers builds every layer and table a config names before any weights are read, and a transformer-init
student is built from its stored BERT config directly: a forged `num_hidden_layers: 1000000000` would allocate a
billion layers, `vocab_size: 30000000` a 4 GB table. The bounds are far past any published encoder (BERT-large:
1,024 wide, 24 layers; XLM-R's 250,002-token vocabulary; the largest LLMs ~128 layers); a teacher's config.json
is held to the same table (pipeline.teacher.model).
"""

from __future__ import annotations

from typing import Any

from kd.common.parsing import has_auto_map

# key -> (least, most); every one of them a size something is allocated by
SIZES = {"num_hidden_layers": (1, 512), "hidden_size": (1, 65_536), "intermediate_size": (1, 1 << 20),
         "num_attention_heads": (1, 4096), "vocab_size": (1, 1 << 23), "max_position_embeddings": (1, 1 << 20),
         "type_vocab_size": (0, 1 << 10)}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# the model types whose layers a transformer-init student (a BertModel: student.transformer_init) takes as they are:
# the same tensor names and shapes. MPNet's layers are named otherwise (attention.attn.q, a relative attention
# bias): its init output could never start a student.
BERT_SHAPED = ("bert", "roberta", "xlm-roberta")


def size_problem(key: str, value: Any) -> str | None:
    """What is wrong with `value` as the config size `key` (SIZES; None: nothing): the one bound both a student's
    and a teacher's config are held to before anything is built from them."""
    least, most = SIZES[key]
    if isinstance(value, int) and not isinstance(value, bool) and least <= value <= most:
        return None
    return f"{key} is {value!r}, not a whole number from {least:,} to {most:,}"


def bert_config_problem(cfg: Any) -> str | None:
    """What is wrong with a parsed BERT config kd would build a model from (None: nothing)."""
    if not isinstance(cfg, dict):
        return f"the config is a JSON {type(cfg).__name__}, not an object"
    if has_auto_map(cfg):
        return "the config has an auto_map entry (a pointer to Python code kd never runs)"
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        return f"the config lacks {', '.join(missing)}"
    for key, (least, _) in SIZES.items():
        problem = size_problem(key, cfg.get(key, least))
        if problem:
            return f"the config's {problem}"
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        return (f"the config's hidden_size {cfg['hidden_size']} is not a multiple of its num_attention_heads "
                f"{cfg['num_attention_heads']}")
    return None


def init_type_problem(cfg: dict[str, Any]) -> str | None:
    """What is wrong with the model type of a teacher's `init` output config (`BERT_SHAPED`; None: nothing)."""
    kind = cfg.get("model_type")
    return None if kind in BERT_SHAPED else f"it is a {kind!r} model's, whose layers a BertModel cannot take"


def init_weights_problem(cfg: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> str | None:
    """What is wrong with the tensors (name -> shape) of a teacher's `init` output against its config, which
    `bert_config_problem` passed: exactly the tensors of the transformer-init student's BertModel (student.
    transformer_init), each of its shape, the word table [vocab_size, hidden_size]. A tensor of another shape
    passed validate and ended training in torch's size-mismatch traceback (issue 48's probe). The config's type is
    one of BERT_SHAPED (`init_type_problem` passed)."""
    # torch and transformers take ~7.5 s to import (measured here, 2 cores): imported here, so only the check of a
    # store holding an init output pays it (once per store state: the verdict is kept, storage.soundness)
    import torch
    from transformers import BertConfig, BertModel

    with torch.device("meta"):  # shapes only: nothing is allocated, whatever the config's sizes
        model = BertModel(BertConfig(**{**cfg, "pad_token_id": 0}), add_pooling_layer=False)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for name, shape in shapes.items():
        if name not in expected:
            return f"the weights hold {name!r}, which the config's model has not"
        if tuple(shape) != expected[name]:
            return f"the weights' {name} is {list(shape)}, the config's model has {list(expected[name])}"
    missing = sorted(set(expected) - set(shapes))
    return f"the weights lack {', '.join(missing[:3])}" if missing else None
