"""What `simattn export` needs installed: a missing runtime is one line before any work, naming the format as it was
given or inferred and the line that installs its extra; the parity check needs nothing beyond the format's runtime."""
import json
import sys
from pathlib import Path

import pytest

import simattn  # noqa: F401  (registers the models)
from simattn import deploy
from simattn.cli import main as simattn_main
from simattn.deploy.base import Format
from simattn.utils import extras

DEIT = "sima_deit_tiny_patch16_224"
# the model of the digits_cpu recipe (what `simattn demo` and the README's deploy example export)
DIGITS_CPU = ["--model-kwargs", "img_size=16", "patch_size=4", "embed_dim=64", "depth=4", "num_heads=4",
              "mlp_ratio=2.0", "num_classes=10"]


def _uninstall(monkeypatch, package):
    """Imports of ``package`` and of its modules fail, as if it were not installed (a module already loaded would
    otherwise still import)."""
    for name in [name for name in sys.modules if name.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def builds(monkeypatch):
    """The models export loads, recorded; loading one stops the command with a ValueError (exit 2)."""
    import simattn.models.factory as factory

    calls = []

    def load_model(*args, **kwargs):
        calls.append(args)
        raise ValueError("stopped where the model would be built")

    monkeypatch.setattr(factory, "load_model", load_model)
    return calls


@pytest.mark.parametrize("argv, words, package, extra", [
    (["-o", "m.onnx"], "simattn export -o m.onnx (format onnx, from its suffix)", "onnx", "export"),
    (["--format", "onnx", "-o", "m.onnx"], "simattn export --format onnx needs", "onnx", "export"),
    ([], "simattn export (format onnx, the default)", "onnx", "export"),
    (["-o", "m.pte"], "simattn export -o m.pte (format executorch, from its suffix)", "executorch", "edge"),
])
def test_a_missing_runtime_is_one_line_before_any_work(argv, words, package, extra, tmp_path, monkeypatch, capsys,
                                                       builds):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SIMATTN_DEBUG", raising=False)
    _uninstall(monkeypatch, package)
    assert simattn_main(["export", "--model", DEIT, *DIGITS_CPU, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert words in err and f"optional package {package!r}" in err, err
    assert err.endswith(extras.install_line(extra)), err
    assert builds == [] and list(tmp_path.iterdir()) == []  # no model built, nothing written (runs/export neither)


class _NoPackages(Format):
    name, runtime, suffixes, extra, packages = "nopackages", "nopackages", (".nopackages",), "none", ()


def test_another_format_does_not_need_onnx(tmp_path, monkeypatch, capsys, builds):
    """ONNX's own option checks (its opset) run for every format; they must not need onnx."""
    _uninstall(monkeypatch, "onnx")
    deploy.register(_NoPackages())
    try:
        assert simattn_main(["export", "--model", DEIT, *DIGITS_CPU, "-o", str(tmp_path / "m.nopackages")]) == 2
    finally:
        deploy.unregister("nopackages")
    assert "stopped where the model would be built" in capsys.readouterr().err
    assert len(builds) == 1


@pytest.mark.parametrize("prefix, editable, expected", [
    (None, False, "pip install 'simattn[export]'"),  # from a package index
    (".venv", True, "./scripts/setup_venv.sh export"),  # the clone's own environment
    ("elsewhere", True, "{python} -m pip install -c {clone}/constraints.txt -e '{clone}[export]'"),
    ("elsewhere", False, "{python} -m pip install -c {clone}/constraints.txt '{clone}[export]'"),
])
def test_install_line_fits_the_environment(prefix, editable, expected, tmp_path, monkeypatch):
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    (clone / "scripts" / "setup_venv.sh").write_text("")
    (clone / "constraints.txt").write_text("")
    monkeypatch.chdir(clone)
    monkeypatch.setattr(extras, "_source_folder", lambda: None if prefix is None else (clone, editable))
    monkeypatch.setattr(sys, "prefix", str(clone / (prefix or ".venv")))
    monkeypatch.setattr(sys, "executable", "/env/bin/python")
    assert extras.install_line("export") == expected.format(python="/env/bin/python", clone=clone)


def test_this_install_is_found(monkeypatch):
    """The package's own install record (pip's direct_url.json) is read: a clone's gives its folder."""
    found = extras._source_folder()
    if found is None:
        pytest.skip("simattn is not installed from a folder here")
    assert (found[0] / "src" / "simattn" / "__init__.py").resolve() == Path(simattn.__file__).resolve()


def test_onnx_export_and_its_parity_check_need_no_scikit_image(tmp_path, monkeypatch, capsys, one_thread):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    _uninstall(monkeypatch, "skimage")  # the viz extra
    out = tmp_path / "m.onnx"
    # TorchScript at one size: the exporter is not what is under test here, and it is several times faster
    rc = simattn_main(["export", "--model", DEIT, *DIGITS_CPU, "--exporter", "torchscript", "--static-spatial",
                       "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert out.is_file()
    parity = json.loads(out.with_name("m.onnx.json").read_text())["parity"]
    # the check still runs on real images: digits and a photo
    assert {"digits_val_8"} < set(parity) and any(name.startswith("photo") for name in parity), parity
    assert all(r["ok"] for r in parity.values()), parity
