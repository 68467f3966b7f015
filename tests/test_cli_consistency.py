"""What every ``simattn`` command shares: plain-text ``--help``, ``--version``, did-you-mean for a mistyped
command, and one policy for the files a command writes (an existing target needs ``--overwrite``, which replaces only
what the command writes). Each case stops before any real work, so the module stays cheap."""
import re
from importlib.metadata import version

import pytest

from simattn.cli import COMMANDS, main as simattn_main

from cli_inputs import one_line_error

#: what reStructuredText leaves in a help text taken from a docstring
MARKUP = re.compile(r"``|:(mod|func|class|meth|data|attr):`")


def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as stop:  # argparse's --help exits; the subcommand tables return 0
        code = simattn_main([*argv, "--help"])
        raise SystemExit(code)
    assert stop.value.code in (0, None)
    return capsys.readouterr().out


def _subcommands(text: str):
    """The subcommands a help text offers: ``{a,b}`` followed by ``[options]`` (simattn's tables) or ``...``
    (argparse's subparsers)."""
    found = re.search(r"\{([\w,-]+)\}(?: \[options\]| \.\.\.)", text.split("\n\n")[0])
    return found[1].split(",") if found else []


def test_help_of_every_command_and_subcommand_is_plain_text(capsys):
    seen = {}
    for name in COMMANDS:
        text = seen[name] = _help(capsys, [name])
        for sub in _subcommands(text):
            seen[f"{name} {sub}"] = _help(capsys, [name, sub])
    assert {"bench attention", "bench paper", "hub save", "data pack", "ssl eval", "detect shapes"} <= set(seen)
    marked = {name: MARKUP.search(text)[0] for name, text in seen.items() if MARKUP.search(text)}
    assert not marked, marked
    # the text of the markup stays: export's description names the package of its formats
    assert "any format of simattn.deploy (ONNX" in seen["export"]


def test_bench_help_points_to_every_part_of_bench_paper(capsys):
    from simattn.bench.paper import PARTS

    line = next(line for line in _help(capsys, ["bench"]).splitlines() if line.strip().startswith("paper"))
    assert "--only" in line and "simattn bench paper --help" in line, line  # not a list of some of the parts
    only = re.search(r"\n +--only .*?(?=\n +-|\Z)", _help(capsys, ["bench", "paper"]), flags=re.S)[0]
    assert all(part in " ".join(only.split()) for part in PARTS), only


def test_version(capsys):
    assert simattn_main(["--version"]) == 0
    assert capsys.readouterr().out == f"simattn {version('simattn')}\n"


@pytest.mark.parametrize("argv, meant", [(["trian"], "train"), (["bench", "atention"], "attention"),
                                         (["hub", "sav"], "save"), (["data", "pak"], "pack"),
                                         (["ssl", "trian"], "train"), (["detect", "evl"], "eval")])
def test_a_mistyped_command_gets_a_did_you_mean(capsys, argv, meant):
    code = simattn_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    suggested = re.search(r"did you mean (.+)\?", err[0])[1].split(" or ")
    assert meant in suggested and len(suggested) <= 3


# ---------------------------------------------------------------- export: the format and the output
def test_export_takes_the_format_from_the_suffix(tmp_path, capsys):
    out = tmp_path / "m.pte"
    # --exporter is ONNX's: refused as an option of another format, so -o m.pte made the format ExecuTorch
    err = one_line_error(capsys, simattn_main(["export", "-o", str(out), "--exporter", "dynamo"]))
    assert "--exporter applies to --format onnx, not executorch" in err
    err = one_line_error(capsys, simattn_main(["export", "-o", str(tmp_path / "m.xyz")]))
    assert ".xyz" in err and ".pte (executorch)" in err and "--format" in err
    err = one_line_error(capsys, simattn_main(["export", "--format", "onnx", "-o", str(out)]))
    assert "a --format onnx file ends with .onnx (.pte is --format executorch's)" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", ["m.onnx", "m.onnx.json"])
def test_export_refuses_an_existing_output_or_report_without_overwrite(tmp_path, capsys, existing):
    from simattn.export.cli import build_parser, check_options

    (tmp_path / existing).write_text("the user's")
    err = one_line_error(capsys, simattn_main(["export", "-o", str(tmp_path / "m.onnx")]))
    assert f"{tmp_path / existing} exists: pass --overwrite" in err
    assert (tmp_path / existing).read_text() == "the user's"
    args = build_parser().parse_args(["-o", str(tmp_path / "m.onnx"), "--overwrite"])
    assert check_options(args)["format"].name == "onnx"  # with --overwrite the checks pass


# ---------------------------------------------------------------- hub save and viz: the same policy
def test_hub_save_overwrite_refuses_a_folder_holding_other_files(tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"checked after the output")
    out = tmp_path / "hub"
    out.mkdir()
    for name, text in (("config.json", "{}"), ("notes.txt", "mine")):
        (out / name).write_text(text)
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(weights), "--output", str(out),
                                               "--overwrite"]))
    assert "holds notes.txt, which this command does not write" in err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "notes.txt"]


def test_a_folder_written_whole_keeps_files_it_did_not_write(tmp_path):
    from simattn.utils.io import atomic_folder

    out = tmp_path / "folder"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds notes.txt"):
        with atomic_folder(out, overwrite=True) as tmp:
            (tmp / "model.safetensors").write_bytes(b"new")
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and sorted(tmp_path.iterdir()) == [out]
    (out / "notes.txt").unlink()
    (out / "model.safetensors").write_bytes(b"old")
    with atomic_folder(out, overwrite=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new")
    assert (out / "model.safetensors").read_bytes() == b"new"


def test_viz_refuses_the_folder_of_an_earlier_viz_without_overwrite(tmp_path, capsys):
    (tmp_path / "viz.json").write_text("{}")
    err = one_line_error(capsys, simattn_main(["viz", "--model", "nope", "--out", str(tmp_path)]))
    assert "viz.json exists: pass --overwrite" in err
    err = one_line_error(capsys, simattn_main(["viz", "--model", "nope", "--out", str(tmp_path), "--overwrite"]))
    assert "unknown model 'nope'" in err  # the output passed: the next check speaks
    assert (tmp_path / "viz.json").read_text() == "{}"


# ---------------------------------------------------------------- the ExecuTorch delegation report
@pytest.mark.parametrize("outside, portable", [({"getitem": 1, "Total": 1}, 0),
                                               ({"aten_select_copy_int": 1, "aten_add_Tensor": 2, "getitem": 3}, 3)])
def test_the_delegation_report_counts_one_set_of_ops(outside, portable):
    from simattn.deploy.executorch import summarize_delegation

    summary = summarize_delegation(299, 1, outside)
    assert summary["portable_ops"] == sum(summary["not_delegated"].values()) == portable
    line = summary["line"]
    assert "(299 nodes)" in line and "1 XNNPACK delegate segment" in line
    if portable:
        assert f"not delegated: {portable} ops outside XNNPACK" in line and "add_Tensor ×2" in line
    else:
        assert line.startswith("not delegated: nothing")
