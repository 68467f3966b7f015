"""The ``simattn`` command for Python callers: ``main(argv)`` as the console script runs it, and ``run(name, argv)``
for one subcommand. Both return the exit code; faults of the input are one line on stderr (see
:mod:`simattn.commands`)."""
from __future__ import annotations

from typing import List

from simattn_cli import COMMANDS, main

from .commands import run_command

__all__ = ["COMMANDS", "main", "run"]


def run(name: str, rest: List[str]) -> int:
    """Run subcommand ``name`` (a key of ``COMMANDS``) with arguments ``rest``; returns the exit code."""
    return run_command(name, COMMANDS[name][0], rest)
