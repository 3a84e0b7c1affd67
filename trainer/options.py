"""A TrainConfig from what a user writes: a YAML file, plain data (a matrix profile, Determined's
hyperparameters) or the command line, each value turned into its field's type and every mistake one
ConfigError line. The fields, their rules and their help are trainer.config's."""

from __future__ import annotations

import argparse
import difflib
import typing
from pathlib import Path

import yaml

from trainer.config import _FIELDS, _HELP, _TYPE_HINTS, ConfigError, TrainConfig, check

_METAVARS = {int: "N", float: "X", bool: "true|false", str: "TEXT"}


def _convert(key: str, raw):
    """Turn a YAML or CLI value into the field's type; ConfigError names the key."""
    hint = _TYPE_HINTS[key]
    optional = type(None) in typing.get_args(hint)
    base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    if raw is None or (optional and isinstance(raw, str) and raw.lower() in ("none", "null", "auto", "")):
        if optional:
            return None
        raise ConfigError(f"{key}: must not be empty")
    try:
        if base is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "yes", "1", "on"):
                return True
            if str(raw).lower() in ("false", "no", "0", "off"):
                return False
            raise ValueError
        if base is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if base is float:
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {base.__name__}, got {raw!r}") from None


def load_yaml(path: str | Path) -> dict:
    """Read a config file into {field: value}; unknown keys and bad types fail with one line."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as error:
        raise ConfigError(f"{path}: cannot read ({error.strerror}); check --config") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of trainer options")
    try:
        return check(convert(data))
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are one ConfigError line (an unknown flag names the closest one),
    not the whole usage text; --help still prints everything."""

    def error(self, message: str) -> typing.NoReturn:
        unknown = message.removeprefix("unrecognized arguments: ")
        if unknown != message:
            flag = next((word for word in unknown.split() if word.startswith("-")), unknown.split()[0])
            flags = [option for action in self._actions for option in action.option_strings]
            closest = difflib.get_close_matches(flag.split("=")[0], flags, n=1, cutoff=0.6)
            hint = f"did you mean {closest[0]}?" if closest else "--help lists the valid ones"
            raise ConfigError(f"{flag}: unknown flag; {hint}")
        raise ConfigError(f"{message} (--help lists the flags)")


def build_parser(prog: str | None = None, description: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=prog, description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="FILE.yml", help="YAML file of options; flags override it")
    for name, field in _FIELDS.items():
        flags = dict.fromkeys(["--" + name.replace("_", "-"), "--" + name])  # --batch-size and --batch_size
        hint = _TYPE_HINTS[name]
        base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
        parser.add_argument(*flags, dest=name, default=argparse.SUPPRESS, metavar=_METAVARS[base],
                            help=f"{_HELP[name]} (default: {field.default})")
    return parser


def parse_args(argv: list[str] | None = None, prog: str | None = None,
               description: str | None = None) -> TrainConfig:
    """Defaults, then --config FILE, then flags; validated. ConfigError on any bad value."""
    parser = build_parser(prog, description)
    namespace = vars(parser.parse_args(argv))
    config_file = namespace.pop("config", None)
    values = load_yaml(config_file) if config_file else {}
    for key, raw in namespace.items():
        values[key] = _convert(key, raw)
    return TrainConfig(**values).validate()


def from_dict(values: dict, *, local: bool = True) -> TrainConfig:
    """Build and validate a config from plain data (Determined hyperparameters, a matrix profile).

    local=False: values only, as the harness checks a profile on the controller (see validate)."""
    return TrainConfig(**check(convert(values))).validate(local=local)


def convert(values: dict) -> dict:
    """Plain data -> typed options: each known option's value as its field's type (YAML's 1e-3 is a
    string, a flag's every value is); unknown keys are left for check() to name."""
    return {key: _convert(key, raw) if key in _FIELDS else raw for key, raw in values.items()}
