"""One resolution of a weights name: a pretrained tag is a weights name in every command, found in timm's cache or
downloaded once by timm's code; offline it is one line naming the address, and an interrupted download leaves
nothing behind; the file behind any name is read once."""
import io
import json
import os
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
    assert _files(tmp_path / "torch") == [] and _files(tmp_path / "hf") == []


def test_every_weights_command_gives_the_offline_line_with_exit_2(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in (["validate", "--weights", TAG], ["export", "--weights", TAG, "-o", "x.onnx"],
                 ["viz", "--weights", TAG, "--output", "x.png"], ["hub", "save", "--weights", TAG, "--output", "hub"],
                 ["train", "-c", "digits_cpu", "--initial-checkpoint", TAG, "--output", "run"],
                 ["segment", "-c", "seg_digits_cpu", "--initial-checkpoint", TAG, "--output", "seg"],
                 ["convert", "-c", "convert_digits", "--weights", TAG, "--output", "conv"]):
        assert simattn_main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cloud.tsinghua.edu.cn cannot be reached" in err[0], (argv, err)
    assert _files(tmp_path / "torch") == [] and sorted(os.listdir(tmp_path)) == ["torch"]


class _BrokenResponse(io.BytesIO):
    """An HTTP response that fails half way through its body."""
    headers = {"Content-Length": "4096"}

    def read(self, n=-1):
        if self.tell() >= 1024:
            raise ConnectionResetError("connection reset by peer")
        return super().read(min(n, 1024) if n and n > 0 else 1024)

    def info(self):
        return self

    def get_all(self, name):
        return [self.headers["Content-Length"]] if name == "Content-Length" else None


def test_interrupted_download_leaves_nothing(cache, monkeypatch):
    monkeypatch.setattr(sources, "_resolves", lambda host: True)
    monkeypatch.setattr(torch.hub, "urlopen", lambda *a, **k: _BrokenResponse(b"\0" * 4096))
    with pytest.raises(ValueError, match=r"downloading https://cloud\.tsinghua\.edu\.cn/.* failed \(Connection"):
        resolve_source(TAG)
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
