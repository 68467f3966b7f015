"""scripts/gpu_check.py's two device runs and scripts/triton_compile_ahead.py's kernels, without a GPU: each run's
stage limits add up to at most 270 s and its dry run walks every stage in order through the stage runner; the
stages' commands run what their kernel declarations say; every Triton launch (plan signature, kernel, constexprs)
the check asks for, listed on meta tensors, is one the compile-ahead script compiles; a carried cache is pruned to
what a hit loads, relocated, and its key compared with the Triton at hand."""
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_check
        import triton_compile_ahead
        yield gpu_check, triton_compile_ahead
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.mark.parametrize("run", [1, 2])
def test_each_run_fits_the_loan_and_its_dry_run_walks_every_stage(scripts, run, tmp_path, monkeypatch, capsys):
    gpu_check, _ = scripts
    monkeypatch.setenv("OUT", str(tmp_path))
    stages = gpu_check.stages(run, str(tmp_path))
    assert sum(s.limit for s in stages) <= gpu_check.RUN_LIMIT_S
    assert gpu_check.main(["--run", str(run), "--dry-run"]) == 0
    lines = [line for line in (tmp_path / "summary.txt").read_text().splitlines() if ": exit " in line]
    assert [line.split(": exit ")[0] for line in lines] == [s.name for s in stages]
    assert all(line.endswith(f"(limit {s.limit} s)") and " 124" not in line for line, s in zip(lines, stages))
    logs = (tmp_path / "logs.txt").read_text()
    assert all(" ".join(c[1:]) in logs for s in stages for c in s.commands)
    assert f"stage limits add up to {sum(s.limit for s in stages)} s" in capsys.readouterr().out
    limits = " + ".join(str(s.limit) for s in stages)
    assert f"Run {run} (limits: {limits} = {sum(s.limit for s in stages)} s)" in gpu_check.__doc__

    monkeypatch.setattr(gpu_check, "stages", lambda *a: [*stages, gpu_check.Stage("one more", 1, [])])
    assert gpu_check.main(["--run", str(run), "--dry-run"]) == 1, "a run past 270 s must fail the dry run"


def _values(command, flag):
    if flag not in command:
        return []
    i = command.index(flag) + 1
    values = []
    while i < len(command) and not command[i].startswith("--"):
        values.append(command[i])
        i += 1
    return values


def test_the_stages_commands_run_what_their_kernels_declare(scripts, tmp_path):
    gpu_check, _ = scripts
    for run in (1, 2):
        for stage in gpu_check.stages(run, str(tmp_path)):
            benches = [c for c in stage.commands if "bench" in c]
            for kernels in stage.kernels:
                if "sweep" in kernels:
                    (command,) = benches
                    b, tokens, kinds = kernels["sweep"]
                    assert [int(_values(command, "--batch")[0])] == [b]
                    assert [int(n) for n in _values(command, "--tokens")] == tokens
                    assert _values(command, "--kinds") == kinds
                elif kernels["batch"] != gpu_check.COMPILE_CHECK_BATCH:  # (the compile check's is its default)
                    rows = {(size, batch, head) for command in benches
                            for size, batch in zip(_values(command, "--img-size"), _values(command, "--batch-size"))
                            for head in [(_values(command, "--head") or [None])[0]]}
                    assert (str(kernels["img_size"]), str(kernels["batch"]), kernels["head"]) in rows, stage.name


def _declarations(gpu_check):
    found = []
    for run in (1, 2):
        for stage in gpu_check.stages(run, "OUT"):
            found += [k for k in stage.kernels if k not in found]
    return found


@pytest.mark.parametrize("index", range(8))
def test_every_launch_the_check_asks_for_is_compiled_ahead(scripts, index):
    gpu_check, ahead = scripts
    declarations = _declarations(gpu_check)
    assert len(declarations) == 8 and ahead.declarations() == declarations
    kernels = declarations[index]
    asked = ahead.check_requests(kernels)
    assert asked, f"{kernels}: no Triton launch listed"
    missing = asked - ahead.script_requests(kernels)
    assert not missing, f"{kernels}: {len(missing)} launches not compiled ahead, e.g. {sorted(missing)[0]}"


def test_a_launch_left_out_of_the_compile_fails_the_coverage(scripts, monkeypatch):
    """The compile's sweep calls on contiguous q, k, v instead of the fused projection's views, and its model call
    without the backward: launches the check asks for and the compile leaves out."""
    import torch

    gpu_check, ahead = scripts
    kernels = {"sweep": [8, [197], ["sima_triton"]]}
    monkeypatch.setattr(ahead, "_fused_qkv", lambda b, n, device: [
        torch.empty(b, gpu_check.HEADS, n, gpu_check.HEAD_DIM, dtype=torch.bfloat16).requires_grad_()
        for _ in range(3)])
    assert ahead.check_requests(kernels) - ahead.script_requests(kernels)

    row = {"model": gpu_check.DEIT, "head": None, "img_size": 224, "batch": 8}
    monkeypatch.setattr(torch.Tensor, "backward", lambda *args, **kwargs: None)
    compiled = ahead.script_requests(row)
    monkeypatch.undo()
    missing = ahead.check_requests(row) - compiled
    assert compiled and missing and all("backward" in m for m in missing)


def test_a_carried_cache_is_pruned_relocated_and_its_key_compared(scripts, tmp_path, capsys):
    _, ahead = scripts
    built = tmp_path / "built" / ".triton_sm90"
    entry = built / "KEY"
    entry.mkdir(parents=True)
    names = ["k.cubin", "k.json", "k.llir", "k.ptx"]
    for name in names:
        (entry / name).write_text(name)
    (entry / "__grp__k.json").write_text(json.dumps({"child_paths": {n: str(entry / n) for n in names}}))
    ahead._prune(built)
    assert sorted(p.name for p in entry.iterdir()) == ["__grp__k.json", "k.cubin", "k.json"]
    (built / ahead.MANIFEST).write_text(json.dumps({"fingerprint": ahead.fingerprint(), "requests": ["r"]}))

    carried = tmp_path / "device" / ".triton_sm90"  # the folder where the device run finds it
    carried.parent.mkdir()
    built.rename(carried)
    assert ahead.check(carried) == 0
    children = json.loads((carried / "KEY" / "__grp__k.json").read_text())["child_paths"]
    assert sorted(children) == ["k.cubin", "k.json"]
    assert all(Path(p).is_absolute() and Path(p).read_text() == c for c, p in children.items())
    assert "hits" in capsys.readouterr().out

    manifest = json.loads((carried / ahead.MANIFEST).read_text())
    manifest["fingerprint"]["ptxas"] = "Cuda compilation tools, release 0.0"
    (carried / ahead.MANIFEST).write_text(json.dumps(manifest))
    assert ahead.check(carried) == 1
    assert "differs here in ptxas" in capsys.readouterr().out
    assert ahead.check(tmp_path / "none") == 1
