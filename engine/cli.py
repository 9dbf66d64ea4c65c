"""Command-line entry: each subcommand lives in engine/commands/<name>.py with add_parser() and run()."""
from __future__ import annotations

import argparse
import importlib
import sys

from .spec.errors import EngineError

# One module per subcommand; each defines HELP, add_arguments(parser) and run(args) -> int.
COMMANDS = ("info", "tokenizer", "generate", "bench", "prepare_data", "train", "card", "train_drafter", "continuations",
            "plan", "quantize", "limits", "weights")


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand with its help line; the options only of `chosen` (none when None: the top-level help and
    an unknown command need only the help lines). Some commands' options come from torch-backed classes, so
    building only the chosen one keeps `--help`, `info`, `tokenizer` and `plan` free of torch."""
    parser = argparse.ArgumentParser(prog="python -m engine", description="DeepSeek-V4.1 engine and inspector")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f".commands.{name}", __package__)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        if name == chosen:
            module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(chosen if chosen in COMMANDS else None).parse_args(argv)
    try:
        code = args.run(args) or 0
    except EngineError as e:  # bad input; anything else is a bug and keeps its traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0
    except OSError as e:  # a file the user named could not be read or written (disk full, permissions, ...)
        print(f"error: {e}", file=sys.stderr)
        return 2
    if code == 0:
        _leave_world()
    return code


def _leave_world() -> None:
    """After a command that succeeded under torchrun: end this rank's process groups before the interpreter exits
    (engine.parallel.leave_world). Left to the interpreter's teardown, gloo's threads can abort a rank whose work
    is done (exit code -6: "terminate called without an active exception"), and torchrun then reports the run as
    failed. A failed command exits as it is (a peer may still be inside a collective with this rank). Nothing to
    do, and no torch imported, where torch.distributed never was."""
    if "torch.distributed" in sys.modules:
        # only under torchrun, where torch.distributed is loaded already
        from .parallel.world import leave_world
        leave_world()
