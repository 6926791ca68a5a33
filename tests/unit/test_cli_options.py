"""The checkpoint options shared by run, invert, plan and calibrate: parsed alike everywhere, and
turned into the library's Checkpointing with the library's defaults for what a command does not take."""

from __future__ import annotations

import pytest

from hpcadj.cli import build_parser
from hpcadj.cli.options import checkpointing

PARSER = build_parser()
SHARED = ("--schedule", "--ram", "--disk", "--pfs", "--memory", "--local-dir", "--pfs-file", "--no-async",
          "--costs", "--minimize", "--compress")


def _actions(command: str) -> dict:
    sub = next(a for a in PARSER._actions if a.dest == "command").choices[command]
    return {flag: a for a in sub._actions for flag in a.option_strings}


def _parsing(action) -> tuple:
    return (action.dest, action.default, action.const, action.choices, action.metavar, action.type, action.nargs)


@pytest.mark.parametrize("flag", SHARED)
def test_a_shared_flag_parses_alike_in_every_command_that_takes_it(flag):
    commands = [c for c in ("run", "invert", "plan", "calibrate") if flag in _actions(c)]
    assert "run" in commands and len(commands) >= 3, commands
    assert len({_parsing(_actions(c)[flag]) for c in commands}) == 1, commands


def test_run_options_become_checkpointing():
    args = PARSER.parse_args(["run", "--ram", "4", "--disk", "2GiB", "--no-async", "--keep-checkpoints",
                              "--schedule", "revolve", "--minimize", "energy", "--compress", "lossless",
                              "--compress-disk", "none", "--compress-probe", "6", "--memory", "3GiB"])
    args.memory_baseline = 123
    ck = checkpointing(args)
    assert (ck.ram, ck.disk, ck.pfs, ck.async_io, ck.keep, ck.schedule, ck.minimize) == \
        ("4", "2GiB", None, False, True, "revolve", "energy")
    assert (ck.compress, ck.compress_disk, ck.compress_ram, ck.compress_probe_steps) == ("lossless", "none", None, 6)
    assert (ck.memory, ck.memory_baseline) == ("3GiB", 123)
    assert checkpointing(PARSER.parse_args(["run", "--async"])).async_io is True
    assert checkpointing(PARSER.parse_args(["run"])).async_io is True


def test_calibrate_keeps_the_library_defaults_for_what_it_does_not_take():
    ck = checkpointing(PARSER.parse_args(["calibrate", "--pfs-file", "c.h5", "--local-dir", "scratch"]))
    assert (ck.pfs_file, ck.local_dir, ck.async_io) == ("c.h5", "scratch", True)
    assert (ck.ram, ck.disk, ck.pfs, ck.keep, ck.schedule, ck.minimize, ck.memory_baseline) == \
        (None, None, None, False, None, "time", None)
    assert checkpointing(PARSER.parse_args(["calibrate", "--no-async"])).async_io is False


def test_options_and_their_level_configuration_are_never_changed_in_place():
    import dataclasses

    ck = checkpointing(PARSER.parse_args(["run", "--ram", "4", "--pfs", "2", "--pfs-file", "a.h5"]))
    config = ck.config()
    for obj, name in ((ck, "costs"), (config, "pfs_file")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, "b.h5")
    again = dataclasses.replace(config, pfs_file="b.h5")
    assert (again.pfs_file, config.pfs_file, again.budgets) == ("b.h5", "a.h5", config.budgets)
