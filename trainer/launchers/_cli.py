"""The command line the Spark and Determined launchers share: trainer options plus their own flags."""

import argparse
import gc
import sys
from collections.abc import Callable
from typing import NoReturn

from trainer.config import ConfigError, OneLineArgumentParser, TrainConfig, build_parser, parse_args

AddFlags = Callable[[argparse.ArgumentParser], argparse.ArgumentParser]


def parse(argv: list[str] | None, prog: str, doc: str,
          add_flags: AddFlags) -> tuple[TrainConfig, argparse.Namespace]:
    """(validated TrainConfig, the launcher's own flags); --help lists both, unknown flags fail."""
    add_flags(build_parser(prog, doc)).parse_args(argv)
    own, trainer_argv = add_flags(OneLineArgumentParser(add_help=False)).parse_known_args(argv)
    return parse_args(trainer_argv, prog), own


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
