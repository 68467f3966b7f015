"""The README is what a new user runs first: its Python example must run as written, and the commands it lists must
exist."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    """The README's fenced code blocks opened with ```language (```` ``` ```` alone for language "")."""
    blocks, current, open_language = [], [], None
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            if open_language is None:
                open_language, current = line[3:].strip(), []
            else:
                if open_language == language:
                    blocks.append("\n".join(current) + "\n")
                open_language = None
        elif open_language is not None:
            current.append(line)
    return blocks


def test_python_example_runs_as_written(one_thread):
    blocks = _blocks("python")
    assert blocks, "README has no Python example"
    namespace: dict = {}
    exec(compile("\n".join(blocks), str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    assert tuple(namespace["out"].shape) == tuple(namespace["v"].shape)
    assert tuple(namespace["logits"].shape) == (2, 10)


def test_listed_commands_exist():
    from simattn_cli import COMMANDS

    listed = set(re.findall(r"^simattn (\w+)", "\n".join(_blocks("")), flags=re.M))
    assert listed, "README lists no simattn commands"
    unknown = listed - set(COMMANDS)
    assert not unknown, f"README lists commands the CLI does not have: {sorted(unknown)}"
