"""A recipe checked against the models it names, before any of them loads (each role's model is found first, where
the run parses it: apps.distill.run `_Run.check_models`): the layers `[outputs] keep_layers` keeps exist in the
start model, each transformer-init stage's `init_layers` names layers its source has, and a static stage is no
wider than its role's vocab output. Found later, each of these cost a user the models' load and timing (2 min in
issue 48's probe) and named a temporary folder.

The recipe's own parse (apps.distill.recipe) checks what needs no model: forms, ranges, names.
"""

from __future__ import annotations

from pathlib import Path

from kd.apps.distill import recipe as R
from kd.common.errors import InputError, KdError
from kd.common.layers import parse_layers
from kd.common.parsing import read_config


def check_models(recipe: R.Recipe, folders: dict[str, str]) -> None:
    """The recipe against the checkpoint folder of each role's model (teacher, teacher2, ..., start)."""
    kept = {role: _kept_layers(recipe, folder) for role, folder in folders.items()
            if "init" in recipe.outputs["start" if role == "start" else "teacher"]}
    for stage in recipe.stages:
        _check_static_width(recipe, stage, folders)
    counts: dict[str, int] = {}
    for stage in recipe.stages:  # in order: a stage's source is a role or an earlier stage
        if stage.options.get("arch") != "transformer-init":
            continue
        at = f"{recipe.path} [[stage]] {stage.name}: init_layers"
        asked = stage.options.get("init_layers")
        if stage.source in R.ROLES:
            have = kept.get(stage.source)
            if have is None:
                continue  # no init output planned: train-student names what is missing
            if asked is not None and parse_layers(str(asked), 1024, at) != have:
                raise InputError(f"stage {stage.name!r} starts from init layers {asked}, which the run does not "
                                 f"store: [outputs] keep_layers keeps {_text(have)}", at,
                                 f"set init_layers = \"{_text(have)}\" (or leave it out), or keep those layers")
            counts[stage.name] = len(have)
        elif stage.source in counts:
            source = counts[stage.source]
            counts[stage.name] = len(parse_layers(str(asked), source, at)) if asked is not None else source


def _check_static_width(recipe: R.Recipe, stage: R.Stage, folders: dict[str, str]) -> None:
    """A static stage's table (any stage's with init_embeddings = "vocab") is the PCA of its role's vocab output, the
    model's `mean` of each token (hidden_size wide), which PCA cannot widen: a wider embed_dim was refused only after
    the teacher's pass (the fifth probe). Left out, the width is min(N, the teacher's): nothing to check."""
    asked, start = stage.options.get("embed_dim"), stage.options.get("init_embeddings", "auto")
    from_vocab = start == "vocab" or (stage.options.get("arch") == "static" and start == "auto")
    role_outputs = recipe.outputs["start" if stage.source == "start" else "teacher"]
    if not from_vocab or asked is None or stage.source not in folders or "vocab" not in role_outputs:
        return  # the student's table does not start from the vocab output: train-student says what does not fit
    config = read_config(Path(folders[stage.source]) / "config.json", "point the role at a Hugging Face checkpoint "
                         "folder")
    width = config.get("hidden_size")
    if isinstance(width, int) and not isinstance(width, bool) and asked > width:
        raise InputError(f"stage {stage.name!r} asks for embed_dim {asked}, wider than the {stage.source}'s vocab "
                         f"output ({width}), which a static student's table is reduced from",
                         f"{recipe.path} [[stage]] {stage.name}: embed_dim",
                         f"set embed_dim = {width} or less, or leave it out (min(256, the {stage.source}'s width))")


def _kept_layers(recipe: R.Recipe, folder: str) -> list[int] | None:
    """The layers the run's init output keeps of the model in `folder` (None: its layer count is not in its
    config, which precompute then reads from the loaded model)."""
    config = read_config(Path(folder) / "config.json", "point the role at a Hugging Face checkpoint folder")
    try:
        layers = int(config["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        return None
    where = f"{recipe.path} [outputs] keep_layers"
    try:
        return parse_layers(None if recipe.keep_layers is None else str(recipe.keep_layers), layers, where)
    except KdError as e:
        raise InputError(f"{e.what} (the model has {layers} layers)", where, e.fix) from None


def _text(layers: list[int]) -> str:
    return ",".join(map(str, layers))
