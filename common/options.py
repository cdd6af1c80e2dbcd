"""Each option of a command declared once, on the config field that holds it (issue 40).

`option(...)` is a `dataclasses.field` whose metadata carries the flag, help, range and choices; the CLI builds the
command's parameters from those fields (`kd.cli`), and the config checks its ranges from them (`check_ranges`), so
a flag, a help text or a bound is never written twice and the CLI and the library cannot drift.

Only the standard library and kd.common are imported here: `kd --help` reads this module.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import MISSING, Field, dataclass
from typing import Any, get_args

from kd.common import bounds as B
from kd.common.errors import InputError
from kd.common.paths import is_uri, plain_path, refuse_empty

KEY = "kd.option"  # the metadata key


@dataclass(frozen=True)
class Option:
    """How a config field appears on the command line and which values it takes."""

    help: str = ""
    flag: str | None = None  # None: --field-name
    short: str | None = None  # e.g. -o
    range: B.Range | None = None  # numbers: refused outside it, at parse time and by the config
    choices: Any = None  # a Literal of kd.common.bounds: the CLI refuses other values, listing these
    devices: tuple[str, ...] | None = None  # --device: the forms allowed (B.DEVICES, or without auto)
    argument: bool = False  # positional on the command line (precompute's INPUTS)
    comma: bool = False  # one comma-separated value on the command line, a sequence in the config
    cli: bool = True  # False: a library-only value (no flag), still range-checked
    # a local file or folder kd reads by itself: a file: URI is the path it names (common.paths), a remote address
    # is refused (`--init s3://b/s` said "no trained student here"); an empty one too (Path("") is the working folder)
    path: bool = False
    remote: bool = False  # with `path`: a remote address is taken too (a store: storage.fs opens s3://, gs://)


def option(default: Any = MISSING, *, help: str = "", flag: str | None = None, short: str | None = None,
           range: B.Range | None = None, choices: Any = None, devices: tuple[str, ...] | None = None,
           argument: bool = False, comma: bool = False, factory: Any = MISSING, path: bool = False,
           remote: bool = False) -> Any:
    """A dataclass field that is also a command-line option (`factory`: a default built per instance)."""
    meta = {KEY: Option(help, flag, short, range, choices, devices, argument, comma, path=path or remote,
                        remote=remote)}
    return dataclasses.field(default=default, default_factory=factory, metadata=meta)


def bounded(default: Any, range: B.Range) -> Any:
    """A library-only field (no flag) that is still refused outside `range`."""
    return dataclasses.field(default=default, metadata={KEY: Option(range=range, cli=False)})


def declared(cls: type) -> list[tuple[Field, Option]]:
    """The fields of dataclass `cls` that carry an Option, in declaration order."""
    return [(f, f.metadata[KEY]) for f in dataclasses.fields(cls) if KEY in f.metadata]


def saved_defaults(cls: type) -> dict[str, Any]:
    """Each option of dataclass `cls` with a plain default, as a saved config holds it (str enums by value). Saved
    options (a run's, a checkpoint's) that lack one were saved by a kd older than the option and ran as its default
    does: compare them as `saved_defaults(cls) | saved`. Adding kd distill's --seed refused to resume every run begun
    before it ("seed was None, now 0": a 30-minute teacher pass that would not resume)."""
    plain = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not MISSING}
    return {k: getattr(v, "value", v) for k, v in plain.items()}


def flag(cls: type, name: str) -> str:
    """The flag of field `name` of `cls` (a library-only field is named as it is in Python)."""
    opt = next(o for f, o in declared(cls) if f.name == name)
    return flag_of(name, opt)


def flag_of(name: str, opt: Option) -> str:
    if not opt.cli:
        return name
    return opt.flag or "--" + name.replace("_", "-")


def check_ranges(config: Any, where: str) -> None:
    """Raise InputError for the first field (in declaration order) whose value is not of its declared type, outside
    its declared range, or not one of its declared choices (the CLI refuses those itself; a recipe or a Python call
    reached the model with `arch = "evil"`: the sixth probe)."""
    check_types(config, where)
    B.check(where, *((flag_of(f.name, o), getattr(config, f.name), o.range)
                     for f, o in declared(type(config)) if o.range is not None))


def check_types(config: Any, where: str) -> None:
    """check_ranges' first half, for a __post_init__ to run before anything reads the values (a list where a name
    was declared, hashed as a dict key, was Python's TypeError), choices included. Each option declared a `path`
    becomes the path it names first (`file:///x/run` was "not found" where kd reads a file itself: a probe)."""
    for f, o in declared(type(config)):
        value = getattr(config, f.name)
        if isinstance(value, os.PathLike | list | tuple):  # a Path where a str is declared is its text (.split()
            value = type(value)(map(_text, value)) if isinstance(value, list | tuple) else _text(value)  # failed)
        if o.path and isinstance(value, str | list | tuple):
            value = type(value)(_plain(v, f.name, o) for v in value) if isinstance(value, list | tuple) else \
                _plain(value, f.name, o)
        object.__setattr__(config, f.name, value)  # (a frozen config too, before anything has read the value)
    for f, o in declared(type(config)):
        value = getattr(config, f.name)
        if value is None and f.default is None:  # not given: the config fills it in (`out` from `add_to`)
            continue
        _check_type(flag_of(f.name, o), value, str(f.type), where)
        allowed = get_args(o.choices) if o.choices is not None else ()
        if allowed and value is not None and getattr(value, "value", value) not in allowed:
            raise InputError(f"{flag_of(f.name, o)} {value!r} is not one of {', '.join(allowed)}", where,
                             f"pass one of: {', '.join(allowed)}")


def _text(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _plain(value: Any, name: str, opt: Option) -> Any:
    if not isinstance(value, str):
        return value  # (the type check below names it)
    shown = name.upper() if opt.argument else flag_of(name, opt)  # (a positional has no flag: kd export STUDENT)
    refuse_empty(value, shown)  # (`kd distill --recipe ""` ran the default recipe; `kd index ""` the working folder)
    if is_uri(value) and not opt.remote:
        raise InputError(f"{shown} {os.fspath(value)}: a remote address, where kd reads a local file or folder",
                         shown, "copy it to this machine and pass its local path")
    return plain_path(value)


# The plain annotations a config field may carry, and what a value of each is. A Python caller is not held by the
# CLI's parser: `kd.precompute(..., shard_rows=True)` or `epochs="3"` reached deep code and a TypeError (issue 48's
# probe: 107 cases). bool is an int to Python, never to kd; numpy's integers are ints.
_KINDS: dict[str, tuple[str, Any]] = {
    "int": ("a whole number", lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)),
    "bool": ("True or False", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str | os.PathLike)),
    "None": ("None", lambda v: v is None),
}


def _check_type(name: str, value: Any, annotation: str, where: str) -> None:
    """Refuse `value` unless it is one of `annotation`'s plain kinds; annotations with other kinds (enums,
    Literals, paths, sequences' items) are left to the range, choice and parsing checks."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)).bit_length() > 128:
        raise InputError(f"{name} is a number of about {int(abs(int(value)).bit_length() * 0.30103)} digits",
                         where, f"pass {name} as a number in its range")  # printed whole, it was Python's error
    kinds = [k.strip() for k in annotation.split("|")]
    seq = [k for k in kinds if k.startswith(("list[", "tuple["))]
    if any(k not in _KINDS for k in kinds if k not in seq):
        return
    if any(_KINDS[k][1](value) for k in kinds if k not in seq) or (seq and isinstance(value, list | tuple)):
        return
    wanted = " or ".join([_KINDS[k][0] for k in kinds if k not in seq] + (["a list"] if seq else []))
    raise InputError(f"{name} must be {wanted}, not {value!r} ({type(value).__name__})", where,
                     f"pass {name} as {wanted}")


def known_options(config: type, options: dict[str, Any], call: str) -> None:
    """A keyword `config` does not declare is kd's error naming the call and the nearest option, not Python's
    TypeError from the dataclass (issue 48's probe: `kd.distill(..., bogus=1)`)."""
    import difflib

    names = [f.name for f in dataclasses.fields(config)]
    for name in options:
        if name not in names:
            near = difflib.get_close_matches(name, names, 1)
            raise InputError(f"{call}() has no option {name!r}" + (f"; did you mean {near[0]!r}?" if near else ""),
                             call, f"see help({call}) for its keywords")


def path_argument(value: Any, name: str, call: str, kind: str = "a path (a str or os.PathLike)") -> str:
    """A Python caller's path argument as a str; anything but a str or os.PathLike is kd's error."""
    if isinstance(value, str | os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise InputError(f"{call}(): {name} must be {kind}, not {value!r} ({type(value).__name__})", call,
                     f"pass {name} as {kind}")


def paths_argument(value: Any, name: str, call: str, kind: str = "a path (a str or os.PathLike)") -> list[str]:
    """One path or a list/tuple of them (a str is one path, never its characters), each as a str."""
    if isinstance(value, list | tuple):
        return [path_argument(v, f"each of {name}", call, kind) for v in value]
    return [path_argument(value, name, call, kind)]


def one_value_as_sequence(config: Any) -> None:
    """A str a Python caller gives to a field of several values is one value, never a sequence of characters:
    `teachers="minilm"` is ("minilm",), a comma option's `outputs="cls,mean"` is split as on the command line.
    Called first in every config's __post_init__ (frozen ones too: set through object.__setattr__)."""
    for f, o in declared(type(config)):
        value, kind = getattr(config, f.name), str(f.type)
        if not isinstance(value, str) or not kind.startswith(("tuple[", "list[")):
            continue
        parts = [p.strip() for p in value.split(",")] if o.comma else [value]
        object.__setattr__(config, f.name, tuple(parts) if kind.startswith("tuple[") else parts)


def with_options(fn: Any, config: type, positional: tuple[str, ...]) -> Any:
    """`fn(*positional, **options)` shown with every option of `config` as a keyword (type, default) in `help()` and
    `inspect.signature`, and listed with its help text in the docstring: the options stay declared once, on the
    config's fields, while the function's real signature keeps `**options` (model2vec's `distill()` lists its
    keywords; a Python user should not have to read the CLI's help to find kd's)."""
    import inspect

    own = inspect.signature(fn)
    params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in params}
    lines = []
    for f in dataclasses.fields(config):
        if f.name in taken or f.name in positional or f.name.isupper():
            continue
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else inspect.Parameter.empty)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=f.type))
        text = f.metadata[KEY].help if KEY in f.metadata else ""
        lines.append(f"    {f.name} ({f.type}, default {default!r}){': ' + text if text else ''}")
    fn.__signature__ = own.replace(parameters=params)
    fn.__doc__ = f"{fn.__doc__ or ''}\n\nOptions (keywords):\n" + "\n".join(lines)
    return fn
