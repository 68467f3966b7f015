"""One resolution of a weights name: a pretrained tag is a weights name in every command, found in timm's cache or
downloaded once into it; offline it is one line naming the address; a download cut short, a web page, bytes that are
not weights, an error answer or SIGTERM leave nothing behind (a server on the loopback address stands in for the
network); the file behind any name is read once, its format read from its content."""
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest
import timm
import torch

import simattn
from simattn.cli import main as simattn_main
from simattn.models import sources
from simattn.models.factory import create_model, load_initial_weights, load_model
from simattn.models.sources import read_weights_record, resolve_source, tag_cache_path

from killing import sigterm_when

pytestmark = pytest.mark.usefixtures("one_thread")

TAG = "agent_deit_tiny_patch16_224.in1k"
LAYOUT = Path(__file__).parent / "data" / "deit_released" / f"{TAG}.json"
#: every simattn tag with a download
_MODELS = set(simattn.list_models())
TAGS = sorted(t for t in timm.list_pretrained() if t.split(".")[0] in _MODELS and sources.pretrained_tag(t))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """timm's (torch.hub's) download cache in a fresh folder, and no network."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(sources, "_resolves", lambda host: False)
    return tmp_path / "torch" / "hub" / "checkpoints"


def _released_file(path: Path) -> dict:
    """Agent-DeiT-T's released layout (key names and shapes from its code), seeded values, saved as its training
    script saves it."""
    gen = torch.Generator().manual_seed(1)
    state = {k: torch.randn(shape, generator=gen) * 0.02 for k, (shape, _) in
             json.loads(LAYOUT.read_text())["keys"].items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state, "epoch": 299}, path)
    return state


def _files(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


@pytest.mark.parametrize("tag", TAGS)
def test_offline_tag_is_one_line_naming_where_it_comes_from(tag, cache, tmp_path):
    cfg = timm.models.get_pretrained_cfg(tag).to_dict()
    with pytest.raises(ValueError) as err:
        resolve_source(tag)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"weights {tag}: ")
    if cfg.get("url"):
        assert cfg["url"] in message and str(tag_cache_path(tag)) in message and "no network" in message
    else:
        assert cfg["hf_hub_id"] in message and "cannot reach the Hugging Face Hub" in message
        assert f"models--{cfg['hf_hub_id'].replace('/', '--')}" in message  # where the cached copy would be
    assert _files(tmp_path / "torch") == [] and _files(tmp_path / "hf") == []


def test_every_weights_command_gives_the_offline_line_with_exit_2(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in (["validate", "--weights", TAG], ["export", "--weights", TAG, "-o", "x.onnx"],
                 ["viz", "--weights", TAG, "--output", "x.png"], ["hub", "save", "--weights", TAG, "--output", "hub"],
                 ["train", "-c", "digits_cpu", "--initial-checkpoint", TAG, "--img-size", "32", "--output", "run"],
                 ["segment", "-c", "seg_digits_cpu", "--initial-checkpoint", TAG, "--output", "seg"],
                 ["convert", "-c", "convert_digits", "--weights", TAG, "--output", "conv"]):
        assert simattn_main(argv) == 2, argv
        # train's notes say the tag sets its model (its recipe's model options fall away)
        err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("note: ")]
        assert len(err) == 1 and "cloud.tsinghua.edu.cn cannot be reached" in err[0], (argv, err)
    assert _files(tmp_path / "torch") == [] and sorted(os.listdir(tmp_path)) == ["torch"]


# ---- downloads from a server on the loopback address ------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    """Answers each path as ``server.routes`` says: (status, headers, body, bytes to send before closing)."""

    def do_GET(self):  # noqa: N802  (http.server's name)
        status, headers, body, cut = self.server.routes[self.path]
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        sent = body[:cut]
        for i in range(0, len(sent), 4096):
            self.wfile.write(sent[i:i + 4096])
            self.wfile.flush()
            self.server.sending.set()
        if cut < len(body) and self.server.hold is not None:
            self.server.hold.wait(60)  # a connection that stalls until the test lets it go
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.routes, srv.hold, srv.sending = {}, None, threading.Event()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    if srv.hold is not None:
        srv.hold.set()
    srv.shutdown()
    srv.server_close()
    thread.join(10)


def _serve(server, monkeypatch, body: bytes, *, status=200, kind="application/octet-stream", cut=None,
           length=None) -> str:
    """TAG's download address pointed at ``server``, which answers with ``body`` (``cut``: bytes sent before it
    closes; ``length``: the Content-Length it announces)."""
    path = f"/files/{os.path.basename(urlparse(timm.models.get_pretrained_cfg(TAG).url).path)}"
    headers = {"Content-Type": kind, "Content-Length": str(len(body) if length is None else length)}
    server.routes[path] = (status, headers, body, len(body) if cut is None else cut)
    url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    real = sources._pretrained_cfg
    monkeypatch.setattr(sources, "_pretrained_cfg", lambda name: dict(real(name), url=url) if name == TAG
                        else real(name))
    monkeypatch.setattr(sources, "_resolves", lambda host: True)
    return url


def _weights_bytes(tmp_path) -> bytes:
    _released_file(tmp_path / "released.pth")
    return (tmp_path / "released.pth").read_bytes()


def test_a_download_cut_short_leaves_nothing_and_says_so(cache, server, monkeypatch, tmp_path):
    body = _weights_bytes(tmp_path)
    _serve(server, monkeypatch, body, cut=len(body) // 8)
    with pytest.raises(ValueError, match=rf"weights {TAG}: the download from 127\.0\.0\.1 stopped after "
                                         rf"{len(body) // 8:,} of {len(body):,} bytes \(nothing was kept\)"):
        resolve_source(TAG)
    assert _files(cache) == []


def test_timm_create_model_downloads_through_the_same_door(cache, server, monkeypatch, tmp_path):
    """``timm.create_model(tag, pretrained=True)`` of a simattn tag downloads as every simattn command does: a
    download cut short is one line and leaves nothing in timm's cache; a whole one is loaded from there."""
    body = _weights_bytes(tmp_path)
    _serve(server, monkeypatch, body, cut=len(body) // 8)
    with pytest.raises(ValueError, match=rf"weights {TAG}: the download from 127\.0\.0\.1 stopped after"):
        timm.create_model(TAG, pretrained=True)
    assert _files(cache) == []
    _serve(server, monkeypatch, body)
    model = timm.create_model(TAG, pretrained=True)
    assert _files(cache) == [tag_cache_path(TAG).name]
    state = torch.load(tmp_path / "released.pth", weights_only=True)["model"]
    assert torch.equal(model.state_dict()["patch_embed.proj.weight"], state["patch_embed.proj.weight"])


@pytest.mark.parametrize("kind", ["text/html; charset=utf-8", "application/octet-stream"])
def test_a_web_page_in_place_of_the_weights_is_refused(cache, server, monkeypatch, kind):
    _serve(server, monkeypatch, b"<!DOCTYPE html><html><body>Please log in</body></html>", kind=kind)
    with pytest.raises(ValueError, match=f"weights {TAG}: the server at 127.0.0.1 sent a web page, not weights"):
        resolve_source(TAG)
    assert _files(cache) == []


def test_bytes_that_are_not_weights_are_not_kept(cache, server, monkeypatch):
    _serve(server, monkeypatch, bytes(range(256)) * 40)
    with pytest.raises(ValueError, match=r"sent 10,240 bytes that are not a weights file \(nothing was kept\)"):
        resolve_source(TAG)
    assert _files(cache) == []


def test_an_error_answer_is_named(cache, server, monkeypatch):
    _serve(server, monkeypatch, b"gone", status=404, kind="text/plain")
    with pytest.raises(ValueError, match="answered HTTP 404"):
        resolve_source(TAG)
    assert _files(cache) == []


def test_a_whole_download_is_kept_where_timm_finds_it(cache, server, monkeypatch, tmp_path):
    body = _weights_bytes(tmp_path)
    _serve(server, monkeypatch, body)
    source = resolve_source(TAG)
    assert source.path == tag_cache_path(TAG) and source.path.read_bytes() == body and _files(cache) == [
        source.path.name]
    ours, _ = load_model(None, source)
    theirs = timm.create_model(TAG, pretrained=True)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))


def test_a_damaged_cached_file_is_named_with_the_way_to_fetch_it_again(cache):
    path = tag_cache_path(TAG)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PK\x03\x04" + b"\0" * 60)
    with pytest.raises(ValueError) as err:
        load_model(None, TAG)
    message = str(err.value)
    assert f"weights {TAG}: its cached file {path} (64 bytes) is damaged" in message
    assert f"rm '{path}'" in message and "\n" not in message


def test_a_folder_where_the_download_goes_is_named(cache, server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, _weights_bytes(tmp_path))
    tag_cache_path(TAG).mkdir(parents=True)
    with pytest.raises(ValueError, match=f"weights {TAG}: {tag_cache_path(TAG)}, where its downloaded file goes, is "
                                         "a folder"):
        resolve_source(TAG)


_DOWNLOAD_SCRIPT = """
import sys
from simattn.models import sources
real = sources._pretrained_cfg
sources._pretrained_cfg = lambda name: dict(real(name), url=sys.argv[1]) if name == sys.argv[2] else real(name)
from simattn.cli import main
sys.exit(main(["validate", "--weights", sys.argv[2], "--data-dir", sys.argv[3]]))
"""


def test_sigterm_during_a_download_leaves_nothing(cache, server, monkeypatch, tmp_path):
    """A command stopped by SIGTERM mid-download exits 143 and leaves no temporary file, as Ctrl-C does."""
    body = _weights_bytes(tmp_path)
    url = _serve(server, monkeypatch, body, cut=len(body) // 2)
    server.hold = threading.Event()
    env = dict(os.environ, TORCH_HOME=str(tmp_path / "torch"))
    proc = subprocess.Popen([sys.executable, "-c", _DOWNLOAD_SCRIPT, url, TAG, str(tmp_path)], env=env,
                            stderr=subprocess.PIPE, text=True)
    # stopped once the server has sent bytes and the temporary file is there
    err = sigterm_when(proc, lambda: server.sending.is_set() and any(p.name.endswith(".tmp") for p in cache.glob(".*")))
    assert proc.returncode == 143 and "stopped (SIGTERM)" in err, err
    assert _files(cache) == []


def test_a_cached_tag_loads_as_timm_loads_it(cache):
    _released_file(tag_cache_path(TAG))
    model, spec = load_model(None, TAG)
    assert (spec["model"], spec["num_classes"], spec["extra"]["dataset"]) == (TAG, 1000, "imagenet")
    theirs = timm.create_model(TAG, pretrained=True)  # timm's own loader finds the same cached file
    ours = create_model(TAG, pretrained=True)
    for other in (theirs, ours):
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    # a bare model name says which tags it has
    with pytest.raises(FileNotFoundError, match=f"pretrained tag\\(s\\) {TAG}"):
        resolve_source(TAG.split(".")[0])


def test_a_tag_starts_a_run_with_its_head_reset(cache):
    state = _released_file(tag_cache_path(TAG))
    model = create_model(TAG.split(".")[0], num_classes=10)
    report = load_initial_weights(model, TAG)
    assert report.missing == [] and report.reset == ["head.weight", "head.bias"]
    assert torch.equal(model.state_dict()["patch_embed.proj.weight"], state["patch_embed.proj.weight"])


def test_the_file_behind_a_name_is_read_once(tmp_path, monkeypatch):
    net = create_model("sima_deit_tiny_patch16_224", img_size=32, depth=1, num_classes=10)
    path = tmp_path / "last.pth"
    torch.save({"model": net.state_dict(), "model_name": "sima_deit_tiny_patch16_224",
                "model_kwargs": {"img_size": 32, "depth": 1, "num_classes": 10}}, path)
    reads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append(a[0]) or real_load(*a, **k))
    source = resolve_source(str(path))
    assert read_weights_record(source).model == "sima_deit_tiny_patch16_224"
    model, spec = load_model(None, source)
    assert len(reads) == 1 and spec["config"]["depth"] == 1
    assert os.fspath(source) == str(path) and str(source) == str(path)


def test_the_tag_file_is_named_by_its_url(cache):
    for tag in TAGS:
        cached = tag_cache_path(tag)
        if cached is not None:  # timm names the cached file after the URL's last path segment
            assert cached.name == os.path.basename(urlparse(timm.models.get_pretrained_cfg(tag).url).path) != ""


def test_a_safetensors_file_is_read_by_its_content_whatever_its_name(tmp_path):
    """A file simattn wrote, renamed without its suffix (a download saved as ``weights``), loads with its record."""
    from simattn.models.weights import save_weights, weights_metadata
    kwargs = {"img_size": 32, "depth": 1, "num_classes": 10}
    net = create_model("sima_deit_tiny_patch16_224", **kwargs)
    save_weights(net, tmp_path / "w.safetensors", weights_metadata("sima_deit_tiny_patch16_224", kwargs,
                                                                    producer="test"))
    renamed = tmp_path / "weights"
    (tmp_path / "w.safetensors").rename(renamed)
    model, spec = load_model(None, str(renamed))
    assert spec["model"] == "sima_deit_tiny_patch16_224" and spec["config"]["depth"] == 1
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), net.state_dict().values()))


def test_simattn_create_model_is_the_factory_the_readme_names(cache):
    _released_file(tag_cache_path(TAG))
    model = simattn.create_model(TAG, pretrained=True)
    assert simattn.create_model is create_model
    assert torch.equal(model.state_dict()["head.bias"], load_model(None, TAG)[0].state_dict()["head.bias"])


@pytest.mark.parametrize("name,expected", [
    ("agent_deit_tiny_patch16_244.in1k", "no such file, and no model agent_deit_tiny_patch16_244; did you mean "
                                         "agent_deit_tiny_patch16_224.in1k"),
    ("agent_deit_tiny_patch16_224.in1kk", "no such file, and agent_deit_tiny_patch16_224 has pretrained tag(s) "
                                          "agent_deit_tiny_patch16_224.in1k"),
    ("relu_vit_small_patch16_224.in1k", "no weights were published for this tag"),
    ("sima_deit_tiny_patch16_224.x", "no such file, and sima_deit_tiny_patch16_224 has no pretrained tag with weights"),
    ("hf-hub:org/name@", "nothing follows the @"),
])
def test_each_odd_weights_name_gets_its_own_true_line(cache, name, expected, capsys):
    assert simattn_main(["validate", "--weights", name]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"weights {name}: {expected}" in err, err


def test_a_local_file_named_like_a_tag_is_named_as_such(cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / TAG).write_bytes(b"x")
    with pytest.raises(ValueError, match=f"weights {TAG}: both a pretrained tag and the file or folder .* have this "
                                         f"name: pass ./{TAG} for the file"):
        resolve_source(TAG)
    with pytest.raises(ValueError, match="truncated or not a checkpoint"):  # ./NAME is the file
        load_model(None, f"./{TAG}")


def test_a_folder_without_weights_is_named_as_one(tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    (tmp_path / "runs.v2").mkdir()  # named like MODEL.TAG: a folder all the same, not a tag nor a model
    monkeypatch.chdir(tmp_path)
    for argv in (["validate", "--weights", "runs.v2"],
                 ["train", "-c", "digits_cpu", "--initial-checkpoint", "runs.v2", "--output", "run"]):
        assert simattn_main(argv) == 2
        err = capsys.readouterr().err
        assert "is a folder without weights files" in err and "no such file" not in err, (argv, err)
    for argv in (["validate", "--weights", str(tmp_path / "empty")],
                 ["train", "-c", "digits_cpu", "--initial-checkpoint", str(tmp_path / "empty"), "--output",
                  str(tmp_path / "run")]):
        assert simattn_main(argv) == 2
        assert "is a folder without weights files" in capsys.readouterr().err


def test_a_classifier_of_other_data_is_named_before_its_shapes(cache, tmp_path, capsys):
    """A 1000-class stand-in validated on a 2-class folder names the class counts, not the head's shapes."""
    from PIL import Image
    for label in ("a", "b"):
        (tmp_path / "data" / "val" / label).mkdir(parents=True)
        Image.new("RGB", (32, 32), (40, 90, 160)).save(tmp_path / "data" / "val" / label / "0.png")
    _released_file(tmp_path / "standin.pth")
    assert simattn_main(["validate", "--weights", str(tmp_path / "standin.pth"), "--model", TAG, "--dataset", "folder",
                         "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert f"model {TAG} has 1000 classes but dataset 'folder' has 2" in err and "head.weight" not in err, err


def test_a_tag_as_initial_checkpoint_sets_the_model_as_the_other_commands_do(cache, capsys):
    import yaml
    assert simattn_main(["train", "-c", "digits_cpu", "--initial-checkpoint", TAG, "--img-size", "32",
                         "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["model"] == TAG and f"note: --initial-checkpoint {TAG} sets the model" in err
    assert simattn_main(["train", "-c", "digits_cpu", "--initial-checkpoint", TAG, "--model",
                         "sima_deit_tiny_patch16_224", "--print-config"]) == 0  # --model still names another
    assert yaml.safe_load(capsys.readouterr().out)["model"] == "sima_deit_tiny_patch16_224"


def test_one_file_gives_the_same_weights_through_every_door(cache, tmp_path):
    """A training script's file with ``model`` and a different ``state_dict_ema``: timm's overlay, timm's cache and
    simattn's loader all load ``model`` (the authors evaluate it), through simattn's one loader."""
    state = _released_file(tmp_path / "f.pth")
    ema = {k: v + 1 for k, v in state.items()}
    torch.save({"model": state, "state_dict_ema": ema, "epoch": 299}, tmp_path / "f.pth")
    tag_cache_path(TAG).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state, "state_dict_ema": ema}, tag_cache_path(TAG))
    overlay = dict(file=str(tmp_path / "f.pth"))
    doors = {"overlay": timm.create_model(TAG, pretrained=True, pretrained_cfg_overlay=overlay),
             "cache": timm.create_model(TAG, pretrained=True),
             "load_model": load_model(TAG, str(tmp_path / "f.pth"))[0]}
    for door, model in doors.items():
        assert torch.equal(model.state_dict()["patch_embed.proj.weight"], state["patch_embed.proj.weight"]), door
    with torch.no_grad():
        x = torch.randn(1, 3, 224, 224)
        logits = [m.eval()(x) for m in doors.values()]
    assert all(torch.equal(logits[0], other) for other in logits[1:])


def test_the_ema_beside_the_model_is_loaded_only_when_asked_and_said_so(tmp_path, capsys):
    """A file with ``model`` and a different ``model_ema``: ``model`` by default, named in the one-line summary with
    the EMA left beside it; ``use_ema=True`` (Python), ``--use-ema`` (validate) and ``--initial-checkpoint-ema``
    (train) take the EMA, and the summary and the results say which entry was loaded."""
    kwargs = {"img_size": 16, "patch_size": 4, "embed_dim": 64, "depth": 1, "num_heads": 4,
              "mlp_ratio": 2.0, "num_classes": 10}
    state = create_model("sima_deit_tiny_patch16_224", **kwargs).state_dict()
    ema = {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}
    path = tmp_path / "f.pth"
    torch.save({"model": state, "model_ema": ema, "model_name": "sima_deit_tiny_patch16_224",
                "model_kwargs": kwargs}, path)
    weight = "patch_embed.proj.weight"
    for use_ema, expected in ((False, state), (True, ema)):
        model = create_model("sima_deit_tiny_patch16_224", **kwargs)
        report = load_initial_weights(model, str(path), use_ema=use_ema)
        assert torch.equal(model.state_dict()[weight], expected[weight])
        assert torch.equal(load_model(None, str(path), use_ema=use_ema)[0].state_dict()[weight], expected[weight])
        assert report.entry == ("model_ema" if use_ema else "model")
        assert ("not the EMA 'model_ema' beside it" in report.summary()) is not use_ema
    for flag in ([], ["--use-ema"]):
        assert simattn_main(["validate", "--weights", str(path), "--img-size", "16", *flag]) == 0
        assert json.loads(capsys.readouterr().out)["use_ema"] is bool(flag)
    run = tmp_path / "run"
    assert simattn_main(["train", "-c", "digits_cpu", "--model", "sima_deit_tiny_patch16_224", "--model-kwargs",
                         "depth=1", "--initial-checkpoint", str(path), "--initial-checkpoint-ema",
                         "--epochs", "1", "--max-updates", "1", "--output", str(run)]) == 0
    assert "its 'model_ema' entry" in capsys.readouterr().out


def test_a_record_never_makes_the_build_open_another_file(tmp_path):
    """A safetensors record (or a training state) whose model kwargs ask timm for pretrained weights or an overlay
    file is refused in one line before any build: a file is data, never a reason to open another."""
    from simattn.utils.io import save_safetensors
    kwargs = {"img_size": 32, "depth": 1, "num_classes": 10}
    net = create_model("sima_deit_tiny_patch16_224", **kwargs)
    for bad in ({"pretrained": True}, {"pretrained_cfg_overlay": {"file": str(tmp_path / "other.pth")}}):
        path = tmp_path / f"{sorted(bad)[0]}.safetensors"
        save_safetensors(net, path, metadata={"format": "simattn-weights-v1", "model": "sima_deit_tiny_patch16_224",
                                              "config": {**kwargs, **bad}})
        for read in (read_weights_record, lambda p: load_model(None, p)):
            with pytest.raises(ValueError, match=f"the record's model kwargs hold {sorted(bad)[0]}, which would make "
                                                 "the build open or download another file"):
                read(path)


_TINY = {"img_size": 16, "patch_size": 4, "embed_dim": 64, "depth": 1, "num_heads": 4, "mlp_ratio": 2.0}


def _source_kinds(folder: Path, cache: Path) -> dict:
    """One weights name of each kind a command takes, all holding the same tiny digits classifier (a tag: the
    released Agent-DeiT-T layout in timm's cache)."""
    from simattn.models.weights import save_weights, weights_metadata
    net = create_model("sima_deit_tiny_patch16_224", num_classes=10, **_TINY)
    data_config = {"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 1.0,
                   "interpolation": "bilinear"}
    meta = weights_metadata("sima_deit_tiny_patch16_224", _TINY, producer="simattn train", num_classes=10,
                            data_config=data_config)
    save_weights(net, folder / "w.safetensors", meta)
    torch.save({"model": net.state_dict(), "model_name": "sima_deit_tiny_patch16_224",
                "model_kwargs": {**_TINY, "num_classes": 10}}, folder / "last.pth")
    assert simattn_main(["hub", "save", "--weights", str(folder / "w.safetensors"), "--output",
                         str(folder / "hub")]) == 0
    from simattn.deploy.onnx import export_onnx
    from simattn.models.weights import export_record
    export_onnx(net.eval(), folder / "w.onnx", export_record("sima_deit_tiny_patch16_224", _TINY, data_config,
                                                             attention="sima", num_classes=10),
                exporter="torchscript")  # the quicker exporter: the file's record is what is read here
    _released_file(tag_cache_path(TAG))
    return {"safetensors": str(folder / "w.safetensors"), "train state": str(folder / "last.pth"),
            "folder": f"local-dir:{folder / 'hub'}", "exported": str(folder / "w.onnx"), "tag": TAG}


def test_validate_reads_each_source_once(cache, tmp_path, monkeypatch, capsys):
    """``validate --weights`` of each kind of weights name: the record is read once and the file opened once (the
    exported file: its record once, then its runtime)."""
    from safetensors import torch as safetensors_torch
    names = _source_kinds(tmp_path, cache)
    capsys.readouterr()
    reads, opens = [], []
    real_record, real_open, real_load = sources.WeightsSource._read_record, sources.open_safetensors, torch.load
    monkeypatch.setattr(sources.WeightsSource, "_read_record", lambda self: reads.append(self.name) or
                        real_record(self))
    monkeypatch.setattr(sources, "open_safetensors", lambda path: opens.append(str(path)) or real_open(path))
    monkeypatch.setattr(torch, "load", lambda *a, **k: opens.append(str(a[0])) or real_load(*a, **k))
    monkeypatch.setattr(safetensors_torch, "load_file", lambda *a, **k: pytest.fail("a second reader of the file"))
    for kind, name in names.items():
        reads.clear()
        opens.clear()
        code = simattn_main(["validate", "--weights", name, "--img-size", "16", "--dataset", "digits"])
        out = capsys.readouterr()
        if kind == "tag":  # 1000 ImageNet classes against digits' 10: refused, the file read once on the way
            assert code == 2 and "1000 classes" in out.err and reads == [name] and len(opens) == 1, (reads, opens)
            continue
        assert code == 0, (kind, out.err[-500:])
        assert reads == [name], (kind, reads)
        assert len(opens) == (0 if kind == "exported" else 1), (kind, opens)
