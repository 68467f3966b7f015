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


def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("SIMATTN_DEBUG", raising=False)

    def boom(argv):
        raise ValueError("first line\n  second line")

    monkeypatch.setattr("simattn.train.validate.main", boom)
    assert main(["validate"]) == 2
    err = capsys.readouterr().err
    assert err == "simattn validate: error: first line; second line (SIMATTN_DEBUG=1 for the traceback)\n"


def test_debug_env_keeps_the_traceback(monkeypatch):
    def boom(argv):
        raise FileNotFoundError("missing")

    monkeypatch.setattr("simattn.train.validate.main", boom)
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
