"""The command line the launchers share: trainer options plus their own flags, one-line errors, exit."""

import argparse
import gc
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from trainer.config import ConfigError, TrainConfig
from trainer.options import OneLineArgumentParser, build_parser, parse_args

AddFlags = Callable[[argparse.ArgumentParser], argparse.ArgumentParser]


def parse(argv: list[str] | None, prog: str, doc: str,
          add_flags: AddFlags) -> tuple[TrainConfig, argparse.Namespace]:
    """(validated TrainConfig, the launcher's own flags); --help lists both, unknown flags fail."""
    add_flags(build_parser(prog, doc)).parse_args(argv)
    own, trainer_argv = add_flags(OneLineArgumentParser(add_help=False)).parse_known_args(argv)
    return parse_args(trainer_argv, prog), own


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= low, else the flag's one-line error."""
    def integer(text: str) -> int:
        if not text.lstrip("-").isdigit() or int(text) < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text}")
        return int(text)
    return integer


def with_absolute_dirs(cfg: TrainConfig, **overrides) -> TrainConfig:
    """`cfg` with its directories absolute (a scheduler picks its workers' cwd) and `overrides` set."""
    from trainer.options import from_dict

    absolute = {key: str(Path(value).resolve()) for key in ("output_dir", "checkpoint_dir", "cache_dir",
                "platform_data_dir") if (value := getattr(cfg, key))}
    return from_dict({**cfg.as_dict(), **absolute, **overrides})


def search_plan(path: str):
    """An argparse type: the search plan at `path` (trainer/search.py), else its one-line error."""
    from trainer.search import SearchPlan

    try:
        return SearchPlan.load(path)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def reachable(address: str, what: str, flag: str = "--address", timeout_s: float = 10.0) -> str:
    """`address` (HOST:PORT, given as `flag`) once something there accepts a TCP connection, else a
    ConfigError: a client library's own connect (ray.init, Spark Connect's) retries for minutes before it
    says anything."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{flag}: must be HOST:PORT of {what}, got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ConfigError(f"{flag}: nothing answers at {address} ({error.strerror or error}); "
                          f"is {what} running there?") from None
    return address


def exit_code(prog: str, launch: Callable[[], object]) -> int:
    """0 when `launch` returns; 2 with one line on stderr for a ConfigError, before or during the run."""
    try:
        launch()
    except ConfigError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    return 0


def exit_without_final_collection(code: int) -> NoReturn:
    """Exit a finished trainer process. At exit Python collects every object that torch's and
    transformers' imports created: 2-4 s of CPU on a lab core after the result is written, which the
    unit (and the next cell) would wait for. gc.freeze() puts them beyond the collector first."""
    sys.stdout.flush()
    gc.freeze()
    sys.exit(code)
