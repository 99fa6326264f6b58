"""Reading, writing and overriding the config tree, without torch or NeMo-Run.

Overrides use NeMo-Run's dotlist syntax (`parallel.tensor_model_parallel_size=4`,
`precision=bf16_mixed`, `parallel.virtual_pipeline_model_parallel_size=None`). Every value is
converted to the field's declared type and checked against the field's choices or range, and an
unknown name is rejected with the closest valid ones, so that a typo can never be silently ignored.

One override replaces a whole section: `model=<path to a Hugging Face folder>` takes the folder's
architecture (config/hf.py `model_override`) and keeps the recipe's training choices (sequence
length, dropout, recompute, MoE dispatcher). Overrides apply in the order given, so
`model=/models/Qwen3-8B model.seq_length=8192` sets the length on the folder's model.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
import uuid
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union


class ConfigError(ValueError):
    """A config that cannot run. `problems` lists (dotted field, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("\n".join(f"{field}: {message}" for field, message in problems))


@cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of every field of a config dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


@cache
def _metadata(cls: type) -> dict[str, Mapping[str, Any]]:
    return {f.name: f.metadata for f in dataclasses.fields(cls)}


def choices(cls: type, name: str) -> list[Any] | None:
    """The valid values of a field: a Literal's, or its registry's (`one_of` metadata); None
    for a field that takes any value of its type."""
    meta = _metadata(cls)[name]
    if "one_of" in meta:
        return list(meta["one_of"]())
    inner, _ = _optional_inner(field_types(cls)[name])
    if typing.get_origin(inner) is Literal:
        return list(typing.get_args(inner))
    return None


def choice_fields(cls: type, prefix: str = "") -> list[tuple[str, list[Any]]]:
    """(dotted path, valid values) of every field of the schema with a fixed set of values."""
    out = []
    for name, tp in field_types(cls).items():
        inner, _ = _optional_inner(tp)
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            out += choice_fields(inner, f"{prefix}{name}.")
        elif (values := choices(cls, name)) is not None:
            out.append((f"{prefix}{name}", values))
    return out


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[type, str, str, Any]]:
    """(section class, field name, dotted path, value) of every non-section field of a tree."""
    for f in dataclasses.fields(node):
        value, path = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from leaves(value, f"{path}.")
        else:
            yield type(node), f.name, path, value


def not_one_of(value: Any, allowed: list[Any]) -> str:
    """The message for a value outside its field's choices, with the closest valid one."""
    listed = ", ".join(str(a) for a in allowed)
    hint = suggest(str(value), [str(a) for a in allowed]) if isinstance(value, str) else ""
    return (
        f"'{value}' is not one of {listed}.{hint}" if hint else f"'{value}' is not one of {listed}"
    )


def out_of_range(cls: type, name: str, value: Any) -> str | None:
    """Why a number lies outside its field's range (`within` metadata, config/bounds.py), or
    None when it lies inside, is None where None is allowed, or the field has no range."""
    valid = _metadata(cls)[name].get("range")
    inner, optional = _optional_inner(field_types(cls)[name])
    if valid is None or (value is None and optional):
        return None
    return valid.refuses(value, integer=inner is int)


def in_range(node: Any, *names: str) -> bool:
    """Whether every named field of a config section holds a value of its range (or an allowed
    None)."""
    return not any(out_of_range(type(node), name, getattr(node, name)) for name in names)


def _check_value(cls: type, name: str, value: Any, path: str) -> Any:
    """`value`, if it is one of the field's choices and within its range; else ConfigError."""
    allowed = choices(cls, name)
    if value is not None and allowed is not None and value not in allowed:
        raise ConfigError([(path, not_one_of(value, allowed))])
    if (why := out_of_range(cls, name, value)) is not None:
        raise ConfigError([(path, why)])
    return value


def _optional_inner(tp: Any) -> tuple[Any, bool]:
    """(X, True) for Optional[X], (tp, False) otherwise."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _parse_scalar(text: str) -> Any:
    """A dotlist value as NeMo-Run reads it: None/null, true/false, numbers, or a string."""
    stripped = text.strip()
    if stripped in ("None", "null", "~"):
        return None
    if stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        return stripped[1:-1]
    for convert in (int, float):
        try:
            return convert(stripped)
        except ValueError:
            pass
    return stripped


def coerce(value: Any, tp: Any, path: str) -> Any:
    """Convert `value` to type `tp`, or raise ConfigError naming `path`."""
    inner, optional = _optional_inner(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError([(path, f"may not be None (expected {_type_name(tp)})")])
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        if isinstance(value, inner):
            return value
        if isinstance(value, dict):
            return from_dict(inner, value, path)
        raise ConfigError([(path, f"expected a {inner.__name__} section, got {value!r}")])
    if typing.get_origin(inner) is list:
        (item_tp,) = typing.get_args(inner) or (Any,)
        if not isinstance(value, list | tuple):
            raise ConfigError([(path, f"expected a list, got {value!r}")])
        return [coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if inner is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif inner is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif inner is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an int beyond 1.8e308
                raise ConfigError([(path, f"{value} is beyond any float")]) from None
    elif inner is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    elif inner is Any:
        return value
    elif typing.get_origin(inner) is Literal:
        if isinstance(value, str | int | float | bool):
            return value  # the field's choices are checked by the caller (_check_value)
    raise ConfigError([(path, f"expected {_type_name(tp)}, got {value!r}")])


def _type_name(tp: Any) -> str:
    inner, optional = _optional_inner(tp)
    if typing.get_origin(inner) is Literal:
        name = "one of " + ", ".join(str(a) for a in typing.get_args(inner))
    else:
        name = getattr(inner, "__name__", str(inner))
    return f"{name} or None" if optional else name


def suggest(name: str, choices: list[str]) -> str:
    """' Did you mean ...?' with the closest names, or '' when none is close."""
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.6)
    if not close:
        # Same words in another order or with one word changed: tensor_parallel_size.
        words = set(name.split("_"))
        close = [c for c in choices if len(words & set(c.split("_"))) >= max(2, len(words) - 1)]
    return f" Did you mean {' or '.join(repr(c) for c in close[:3])}?" if close else ""


def _unknown(path: str, name: str, cls: type) -> ConfigError:
    names = list(field_types(cls))
    hint = suggest(name, names) or f" Valid fields: {', '.join(names)}."
    return ConfigError([(path, f"unknown field '{name}' in {cls.__name__}.{hint}")])


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build a config dataclass from nested dicts (YAML, JSON), checking every name and type."""
    types_ = field_types(cls)
    kwargs: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in types_:
            problems += _unknown(path, key, cls).problems
            continue
        try:
            kwargs[key] = _check_value(cls, key, coerce(value, types_[key], path), path)
        except ConfigError as err:
            problems += err.problems
    # A section given but wrong is reported for what is wrong in it, not also as missing.
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    problems += [(f"{prefix}.{m}" if prefix else m, "is required") for m in missing]
    if problems:
        raise ConfigError(problems)
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Nested plain dicts of a config tree (for YAML, JSON and the engine's saved config)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj


def to_yaml(obj: Any) -> str:
    """A config tree as the YAML that `recipes show` prints and every rank loads."""
    import yaml

    return yaml.safe_dump(to_dict(obj), sort_keys=False)


def write_yaml(obj: Any, path: Path) -> Path:
    """Write a resolved config (e.g. <run dir>/config.yaml, what `training.entry --config` reads).

    Atomically: the text goes to a temporary file in the same folder, reaches the disk, and then
    replaces `path` in one rename, so a crash or a full disk leaves the old file or the new one,
    never half of one (a requeued job reads it back).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = to_yaml(obj)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    # 0o666 less the umask, as a plain open() would create it (mkstemp's would be 0o600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def get_path(root: Any, path: str) -> Any:
    node = root
    for part in path.split("."):
        node = getattr(node, part)
    return node


def apply_overrides(root: Any, overrides: list[str]) -> Any:
    """Apply dotlist overrides in place and return `root`. All problems are reported at once."""
    problems: list[tuple[str, str]] = []
    for item in overrides:
        try:
            _apply_one(root, item)
        except ConfigError as err:
            problems += err.problems
    if problems:
        raise ConfigError(problems)
    return root


def _apply_one(root: Any, item: str) -> None:
    if "=" not in item:
        raise ConfigError([(item, "an override needs the form field.path=value")])
    path, text = item.split("=", 1)
    path = path.strip()
    root_cls = type(root)
    if path == "model" and dataclasses.is_dataclass(root_cls) and "model" in field_types(root_cls):
        root.model = _model_from_folder(text, root.model)
        return
    parts = path.split(".")
    node: Any = root
    for depth, name in enumerate(parts):
        here = ".".join(parts[: depth + 1])
        cls = type(node)
        if not dataclasses.is_dataclass(cls):
            raise ConfigError([(here, f"'{'.'.join(parts[:depth])}' is a value, not a section")])
        types_ = field_types(cls)
        if name not in types_:
            raise _unknown(here, name, cls)
        if depth == len(parts) - 1:
            tp = types_[name]
            inner, _ = _optional_inner(tp)
            value = _parse_list(text) if typing.get_origin(inner) is list else _parse_scalar(text)
            setattr(node, name, _check_value(cls, name, coerce(value, tp, here), here))
            return
        child = getattr(node, name)
        if child is None:
            inner, _ = _optional_inner(types_[name])
            raise ConfigError(
                [(here, f"is None; set the {inner.__name__} section in the recipe first")]
            )
        node = child


def _model_from_folder(text: str, ours: Any) -> Any:
    """`model=<folder>`: the Hugging Face folder's architecture with `ours`' training choices.

    Only a local folder with config.json and safetensors weights: a path that does not exist is an
    error, never a hub id to download (the ranks could not reach a hub, and a typo must not fetch
    another model).
    """
    from config import hf  # here: config.hf imports the schema, which imports this module

    given = _parse_scalar(text)
    if not isinstance(given, str) or not given:
        raise ConfigError(
            [("model", f"{text!r} is not a path; model=<folder> takes a Hugging Face folder")]
        )
    folder = Path(os.path.expanduser(given))
    fix = (
        "model=<folder> takes the whole architecture from a local Hugging Face folder (config.json "
        "and model.safetensors or model.safetensors.index.json); set single fields with "
        "model.<field>=<value> instead"
    )
    if not folder.exists():
        why = "does not exist (nothing is downloaded from a hub: download the folder first)"
    elif not folder.is_dir():
        why = "is a file, not a folder"
    elif not (folder / hf.CONFIG_FILE).is_file():
        why = f"has no {hf.CONFIG_FILE}"
    elif not hf.is_hf_folder(folder):
        why = f"has no {hf.SINGLE_FILE} or {hf.INDEX_FILE} (only safetensors weights are read)"
    else:
        try:
            return hf.model_override(folder, ours)
        except ValueError as err:
            raise ConfigError([("model", str(err))]) from None
    raise ConfigError([("model", f"{given} {why}. {fix}")])


def _parse_list(text: str) -> Any:
    stripped = text.strip()
    if stripped in ("None", "null"):
        return None
    if stripped.startswith("[") and stripped.endswith("]"):
        body = stripped[1:-1].strip()
        return [_parse_scalar(v) for v in body.split(",")] if body else []
    return [_parse_scalar(stripped)]


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"model.num_layers": 32, ...} of a config dict (to_dict's)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= flatten(value, f"{prefix}{key}.")
    return out


def differences(saved: dict[str, Any], cfg: Any) -> dict[str, tuple[Any, Any]]:
    """field -> (saved value, value in `cfg`) for every field that differs between a config saved
    as a dict (a checkpoint's) and `cfg`; the run's name, logs and checkpoint folders left out."""
    old, new = flatten(saved), flatten(to_dict(cfg))
    ignored = ("name", "logging.", "checkpoint.save_dir", "checkpoint.load_dir")
    return {
        k: (old.get(k), new.get(k))
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k) and not k.startswith(ignored)
    }
