"""Commands made of subcommands (``simattn bench model``, ``simattn data pack``, ``simattn hub save``): one line
for an unknown name, with a did-you-mean, and the list of the known ones."""
from __future__ import annotations

import difflib
import sys
from typing import Any, Callable, List, Mapping, Sequence, Tuple

__all__ = ["unknown_name", "check_subcommand", "run_subcommand"]


def unknown_name(name: str, known: Sequence[str], noun: str = "subcommand") -> str:
    """``unknown NOUN 'NAME'; did you mean A or B?`` (up to three close names), or the known names where none is
    close."""
    close = difflib.get_close_matches(name, list(known), n=3)
    hint = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(known)}"
    return f"unknown {noun} {name!r}; {hint}"


def check_subcommand(argv: Sequence[str], known: Sequence[str]) -> None:
    """For a parser with subcommands: a first argument that is neither an option nor one of ``known`` is a
    one-line ValueError with a did-you-mean, before argparse's longer message."""
    if argv and not argv[0].startswith("-") and argv[0] not in known:
        raise ValueError(unknown_name(argv[0], known))


def run_subcommand(prog: str, argv: Sequence[str], commands: Mapping[str, Tuple[Callable[[List[str]], Any], str]],
                   noun: str = "subcommand") -> int:
    """``prog NAME [options]``: calls NAME's handler with the rest of ``argv`` (an int it returns is the exit code,
    anything else is 0). Nothing, ``-h`` or ``--help`` prints the list of ``commands`` (exit 0); an unknown NAME is
    one line naming the known ones, then the list (exit 2)."""
    if argv and argv[0] in commands:
        result = commands[argv[0]][0](list(argv[1:]))
        return result if isinstance(result, int) else 0
    asked = not argv or argv[0] in ("-h", "--help")
    if not asked:
        print(f"{prog}: {unknown_name(argv[0], list(commands), noun)}", file=sys.stderr)
    print(f"usage: {prog} {{" + ",".join(commands) + "} [options]")
    for name, (_, help_) in commands.items():
        print(f"  {name:<10} {help_}")
    return 0 if asked else 2
