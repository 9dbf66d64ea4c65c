"""The CLI turns the engine's own errors into `error: ...` and exit 2, and lets every other exception through; after a
command that succeeds it ends the process groups of a torchrun rank."""
from __future__ import annotations

import pytest

from engine import cli
from engine.checkpoint.store import CheckpointError
from engine.commands import info as info_command
from engine.kernels.runtime import KernelInputError
from engine.spec.errors import ConfigError, EngineError, InputError, MissingFileError
from engine.trace import TraceFormatError


@pytest.mark.parametrize("cls", [ConfigError, CheckpointError, KernelInputError, TraceFormatError, InputError,
                                 MissingFileError])
def test_every_bad_input_error_derives_from_one_base(cls):
    assert issubclass(cls, EngineError)


def run_with(monkeypatch, exc: BaseException) -> int:
    def failing_run(args):
        raise exc
    monkeypatch.setattr(info_command, "run", failing_run)  # main() builds its parser afresh, taking this run
    return cli.main(["info", "tiny-v4.1"])


@pytest.mark.parametrize("exc", [InputError("bad prompt"), ConfigError("bad key"), MissingFileError("no file"),
                                 PermissionError("cannot write out.json")])
def test_bad_input_exits_2_with_the_message(monkeypatch, capsys, exc):
    assert run_with(monkeypatch, exc) == 2
    assert capsys.readouterr().err == f"error: {exc}\n"


@pytest.mark.parametrize("exc", [ValueError("an internal shape bug"), KeyError("missing"), RuntimeError("bug")])
def test_a_bug_is_not_dressed_up_as_bad_input(monkeypatch, exc):
    with pytest.raises(type(exc)):
        run_with(monkeypatch, exc)


def test_a_real_bad_argument_still_exits_2(capsys):
    assert cli.main(["info", "no-such-preset"]) == 2
    assert "neither a config file nor a preset" in capsys.readouterr().err


@pytest.fixture
def process_group(tmp_path):
    """A one-rank gloo process group in this process, as torchrun's ranks hold one; destroyed afterwards if the
    test left it."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_command_that_succeeds_ends_the_process_groups_before_the_interpreter_does(process_group, capsys):
    """Left to the interpreter's teardown, gloo's threads can abort a finished rank (exit code -6), and torchrun
    then reports a successful run as failed."""
    assert cli.main(["info", "tiny-v4.1"]) == 0
    assert capsys.readouterr().out.startswith("tiny-v4.1: family v4.1")
    assert not process_group.is_initialized()


def test_a_command_that_fails_leaves_the_process_groups_to_the_launcher(process_group, monkeypatch, capsys):
    """A failing rank does not tear down its group in the middle of a run its peers may still be waiting in."""
    assert run_with(monkeypatch, InputError("bad prompt")) == 2
    assert process_group.is_initialized()
