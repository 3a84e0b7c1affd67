"""JSON Schema errors as one line each: `key.path[0].name: what is wrong, got VALUE`.

The trainer's config schema (trainer.config.SCHEMA) and the harness's matrix schema share this wording.
A schema may say more than the generic wording with two annotations of its own (validators ignore them):
  x-message   on a subschema: the line for its failures (type errors excepted), `{value!r}` filled in;
  x-key-noun  on an object schema: what an unknown key is ("trainer option"; default "key"), and
  x-key-help  where its keys are listed when no known key is close to a misspelt one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

_TYPE_NAMES = {"integer": "int", "number": "float", "boolean": "bool", "string": "str", "array": "list",
               "object": "mapping", "null": "null"}


def first_error(validator: jsonschema.protocols.Validator, instance: Any) -> str | None:
    """The one line for the most useful of the instance's errors; None when it is valid."""
    errors = list(validator.iter_errors(instance))
    # A misspelt key also makes the real one "missing": name the misspelling, the likelier fix.
    unknown_keys = [error for error in errors if error.validator == "additionalProperties"]
    error = best_match(unknown_keys or errors)
    return None if error is None else describe(error)


def key_path(parts: Iterable[Any]) -> str:
    """['profiles', 'p', 'runs', 0, 'gpus'] -> 'profiles.p.runs[0].gpus'."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def describe(error: ValidationError) -> str:
    path, schema, value = list(error.absolute_path), error.schema, error.instance
    if error.validator == "additionalProperties":
        return _unknown_key(path, schema, value)
    if error.validator == "required":
        missing = next(name for name in error.validator_value if name not in value)
        needed = ", ".join(error.validator_value)
        return f"{key_path(path) or '(top level)'}: missing {missing!r} (needs {needed})"
    where = key_path(path) or "(top level)"
    if error.validator in ("anyOf", "oneOf") and error.context:
        # Say what is wrong in the alternative the value meant (a scalar or a list of them), else the types.
        specific = [branch_error for branch_error in error.context if branch_error.validator != "type"]
        if specific:
            return describe(best_match(specific))
        types = dict.fromkeys(name for branch_error in error.context
                              for name in _listed(branch_error.validator_value))
        return f"{where}: expected {_types(list(types))}, got {value!r}"
    if error.validator == "type":
        return f"{where}: expected {_types(error.validator_value)}, got {value!r}"
    if "x-message" in schema:
        return f"{where}: {schema['x-message'].format(value=value)}"
    if error.validator in ("enum", "const"):
        choices = error.validator_value if error.validator == "enum" else [error.validator_value]
        return f"{where}: must be one of {', '.join(map(str, choices))}; got {value!r}"
    if error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{where}: must be {_range(schema)}, got {value!r}"
    if error.validator == "minItems":
        return f"{where}: must be a non-empty list, got {value!r}"
    if error.validator == "minProperties":
        return f"{where}: must not be empty"
    if error.validator == "not":
        return f"{where}: not allowed here"
    return f"{where}: {' '.join(error.message.split())[:200]}"


def _unknown_key(path: list[Any], schema: dict[str, Any], value: dict[str, Any]) -> str:
    known = list(schema.get("properties", {}))
    key = next(str(name) for name in value if name not in known)
    noun = schema.get("x-key-noun", "key")
    closest = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = (f"did you mean {closest[0]}?" if closest
            else schema.get("x-key-help") or f"allowed: {', '.join(known)}")
    return f"{key_path([*path, key])}: unknown {noun}; {hint}"


def _types(json_types: str | Sequence[str]) -> str:
    names = [json_types] if isinstance(json_types, str) else json_types
    return " or ".join(_TYPE_NAMES.get(name, name) for name in names)


def _range(schema: dict[str, Any]) -> str:
    """The whole allowed range of a subschema, whichever of its bounds failed."""
    low, high = schema.get("minimum"), schema.get("maximum")
    above, below = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if low is not None and high is not None:
        return f"between {low} and {high}"
    if low is not None and below is not None:
        return f"in [{low}, {below})"
    whole = "an integer " if "integer" in _listed(schema.get("type")) else ""
    bounds = [f">= {low}" if low is not None else None, f"> {above}" if above is not None else None,
              f"<= {high}" if high is not None else None, f"< {below}" if below is not None else None]
    return whole + " and ".join(bound for bound in bounds if bound)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]
