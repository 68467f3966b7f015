"""The ``simattn`` entry point: dispatch, and bad input as one line with exit code 2."""
import pytest

from simattn.cli import COMMANDS, main


def test_usage_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_unknown_command(capsys):
    assert main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("error, code, message", [
    (ValueError("first line\n  second line"), 2, "first line; second line"),  # bad input
    (FloatingPointError("training diverged: the loss is nan"), 1, "training diverged: the loss is nan"),
])
def test_errors_are_one_line_with_their_exit_code(capsys, monkeypatch, error, code, message):
    monkeypatch.delenv("SIMATTN_DEBUG", raising=False)

    def boom(argv):
        raise error

    monkeypatch.setattr("simattn.validate.main", boom)
    assert main(["validate"]) == code
    err = capsys.readouterr().err
    assert err == f"simattn validate: error: {message} (SIMATTN_DEBUG=1 for the traceback)\n"


def test_debug_env_keeps_the_traceback(monkeypatch):
    def boom(argv):
        raise FileNotFoundError("missing")

    monkeypatch.setattr("simattn.validate.main", boom)
    monkeypatch.setenv("SIMATTN_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="missing"):
        main(["validate"])


def test_usage_loads_without_torch():
    # `simattn --help` must answer at once: the entry point imports neither torch nor the package
    import subprocess
    import sys

    code = ("import sys, simattn_cli; simattn_cli.main(['--help']); "
            "print(sorted(m for m in ('torch', 'timm', 'simattn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert "convert" in out


@pytest.mark.parametrize("command, names", [("bench", ["attention", "data", "model", "paper"]), ("data", ["pack"]),
                                            ("hub", ["save"])])
def test_subcommands_are_listed_and_an_unknown_one_is_one_line(capsys, command, names):
    for asked in ([], ["--help"]):
        assert main([command, *asked]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: simattn {command} {{{','.join(names)}}}") and all(f"  {n} " in out for n in names)
    assert main([command, "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"simattn {command}: unknown {'benchmark' if command == 'bench' else 'subcommand'} 'nope'; "
                   f"known: {', '.join(names)}"]


def test_a_subcommand_gets_the_rest_of_the_line_and_its_exit_code(monkeypatch):
    seen = []
    monkeypatch.setattr("simattn.bench.paper.main", lambda argv: seen.append(argv) or 3)
    assert main(["bench", "paper", "--only", "table2"]) == 3
    assert seen == [["--only", "table2"]]
