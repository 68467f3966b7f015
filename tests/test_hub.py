"""``simattn hub save``: the folder timm shares models in. timm rebuilds a classifier of every family from it with the
same logits; every simattn command opens it as ``local-dir:DIR`` or ``hf-hub:ORG/NAME`` (the Hub replaced by a
local stand-in: no test touches the network); a segmenter scores the same mIoU through it; ``--push`` uploads it;
the folder is written whole or not at all."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main
from simattn.models.factory import create_model, load_initial_weights, load_model
from simattn.models.sources import read_weights_record
from simattn.models.weights import save_weights, weights_metadata

from cli_inputs import one_line_error

#: family → (a registered model of it, kwargs that make it tiny)
FAMILIES = {
    "deit": ("sima_deit_tiny_patch16_224", dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2)),
    "xcit": ("sima_nano_12_p8", dict(img_size=32, embed_dim=32, depth=1, num_heads=2, cls_attn_layers=1)),
    "cvt": ("sima_cvt_13", dict(img_size=32, embed_dims=(16, 32, 64), depths=(1, 1, 1), num_heads=(1, 2, 2))),
    "soft": ("soft_tiny", dict(img_size=32, embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4),
                               stem_chans=8, attn_kwargs={"num_iters": 2})),
    "ufo": ("ufo_vit_tiny", dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, cls_attn_layers=1)),
}
DATA_CONFIG = {"input_size": [3, 32, 32], "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3], "crop_pct": 0.9,
               "interpolation": "bilinear"}


def _weights(folder: Path, family: str = "deit", seed: int = 0, **extra) -> Path:
    name, kwargs = FAMILIES[family]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = create_model(name, num_classes=10, **kwargs).eval()
    path = folder / f"{family}.safetensors"
    save_weights(model, path, weights_metadata(name, kwargs, producer="simattn train", num_classes=10,
                                               data_config=DATA_CONFIG, classes=[str(i) for i in range(10)], **extra))
    return path


def _save(weights: Path, output: Path, *extra: str) -> None:
    assert simattn_main(["hub", "save", "--weights", str(weights), "--output", str(output), *extra]) == 0


def _images(folder: Path) -> Path:
    """A val split of one random 40-pixel image per digit class (a dataset that takes no time to score)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for i in range(10):
        (folder / "val" / str(i)).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(folder / "val" / str(i) / "x.png")
    return folder


def _validate(capsys, weights: str, *extra: str) -> dict:
    code = simattn_main(["validate", "--weights", weights, "--threads", "1", *extra])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    return json.loads(out.out[out.out.index("{"):])  # after what hub save printed


@pytest.mark.parametrize("family", list(FAMILIES))
def test_timm_and_simattn_rebuild_every_family_from_the_folder_with_the_same_logits(family, tmp_path):
    weights = _weights(tmp_path, family)
    _save(weights, tmp_path / "hub")
    checkpoint, _ = load_model(weights=weights)
    from_timm = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    from_simattn, _ = load_model(weights=f"local-dir:{tmp_path / 'hub'}")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = checkpoint(x)
        assert torch.equal(from_timm(x), expected) and torch.equal(from_simattn(x), expected)
    name, kwargs = FAMILIES[family]
    started = create_model(name, num_classes=10, **kwargs)  # --initial-checkpoint, model.weights, ...
    report = load_initial_weights(started, f"local-dir:{tmp_path / 'hub'}")
    assert not (report.missing or report.reset or report.unexpected)
    assert all(torch.equal(v, started.state_dict()[k]) for k, v in checkpoint.state_dict().items())
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["architecture"] == name and config["num_classes"] == 10
    assert config["num_features"] == checkpoint.num_features
    assert {k: config["model_args"][k] for k in kwargs if k != "img_size"} == \
        json.loads(json.dumps({k: v for k, v in kwargs.items() if k != "img_size"}))
    assert {k: config["pretrained_cfg"][k] for k in DATA_CONFIG} == DATA_CONFIG
    assert config["label_names"] == [str(i) for i in range(10)]


def test_the_card_holds_the_runs_metrics_data_recipe_and_versions(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    weights = _weights(run, metrics={"top1": 61.25})
    (run / "summary.json").write_text(json.dumps({"final": {"top1": 61.25, "top5": 97.5, "samples": 360},
                                                  "best": {"top1": 63.0, "epoch": 3}}))
    (run / "config.yaml").write_text("model: sima_deit_tiny_patch16_224\ndataset: digits\nepochs: 3\n")
    _save(weights, tmp_path / "hub")
    card = (tmp_path / "hub" / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: timm" in card and "- digits" in card  # the Hub's front matter
    assert "| final top1 | 61.25 |" in card and "| best top1 | 63 |" in card
    assert "epochs: 3" in card and "**Attention:** sima" in card
    assert f"timm {timm.__version__}" in card and f"simattn {simattn.__version__}" in card


def test_commands_take_local_dir_and_hf_hub_names_with_the_checkpoints_results(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    from simattn.models import hub

    weights = _weights(tmp_path)
    _save(weights, tmp_path / "hub")
    data = ["--dataset", "folder", "--data-dir", str(_images(tmp_path / "data"))]
    expected = _validate(capsys, str(weights), *data)
    assert _validate(capsys, f"local-dir:{tmp_path / 'hub'}", *data)["loss"] == expected["loss"]
    asked = []

    def download(repo_id, filename, revision=None, **kwargs):  # the Hub, as a folder on disk
        asked.append((repo_id, filename, revision))
        return str(tmp_path / "hub" / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(hub, "_hub_reachable", lambda: True)
    hub._download.cache_clear()
    try:
        result = _validate(capsys, "hf-hub:my-org/sima-digits@v1", *data)
    finally:
        hub._download.cache_clear()
    assert (result["top1"], result["loss"]) == (expected["top1"], expected["loss"])
    assert ("my-org/sima-digits", "model.safetensors", "v1") in asked


def test_an_hf_hub_name_offline_is_one_line_naming_the_network(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    from simattn.models import hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))  # nothing cached
    hub._download.cache_clear()
    err = one_line_error(capsys, simattn_main(["validate", "--weights", "hf-hub:nobody/nothing"]))
    assert "hf-hub:nobody/nothing" in err and "huggingface.co" in err and "network" in err


def test_a_folder_that_is_not_timms_is_named_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    err = one_line_error(capsys, simattn_main(["validate", "--weights", f"local-dir:{tmp_path / 'empty'}"]))
    assert "config.json" in err and "model.safetensors" in err
    err = one_line_error(capsys, simattn_main(["export", "--weights", f"local-dir:{tmp_path / 'none'}", "-o",
                                               str(tmp_path / "m.onnx")]))
    assert "no such folder" in err


class _StandInHub:
    """``huggingface_hub.HfApi`` with the repositories kept in a dict: what was created and uploaded."""
    repos: dict = {}

    def __init__(self, *args, **kwargs) -> None:
        pass

    def create_repo(self, repo_id, private=False, exist_ok=False, **kwargs):
        self.repos.setdefault(repo_id, {"private": private, "files": {}})
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, repo_id, folder_path, **kwargs):
        files = {p.name: p.read_bytes() for p in Path(folder_path).iterdir()}
        self.repos[repo_id]["files"].update(files)


def test_push_uploads_the_folder_it_writes(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    weights = _weights(tmp_path)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(weights), "--push", "org/name"]))
    assert "HF_TOKEN" in err
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")
    monkeypatch.setattr(huggingface_hub, "HfApi", _StandInHub)
    monkeypatch.setattr(_StandInHub, "repos", {})
    _save(weights, tmp_path / "hub", "--push", "org/name", "--private")
    assert "https://huggingface.co/org/name" in capsys.readouterr().out
    repo = _StandInHub.repos["org/name"]
    assert repo["private"] and sorted(repo["files"]) == ["README.md", "config.json", "model.safetensors"]
    assert all(repo["files"][n] == (tmp_path / "hub" / n).read_bytes() for n in repo["files"])
    assert "hf-hub:org/name" in repo["files"]["README.md"].decode()
    # without --output the folder is written to a temporary place, uploaded, and removed
    assert simattn_main(["hub", "save", "--weights", str(weights), "--push", "org/other"]) == 0
    assert sorted(_StandInHub.repos["org/other"]["files"]) == ["README.md", "config.json", "model.safetensors"]
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(weights), "--push", "no-org"]))
    assert "--push" in err and "ORG/NAME" in err


def test_the_folder_is_new_or_replaced_whole(tmp_path, capsys):
    weights = _weights(tmp_path)
    out = tmp_path / "hub"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(weights), "--output", str(out)]))
    assert "notes.txt" in err and "--overwrite" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(weights), "--output", str(out),
                                               "--overwrite"]))
    assert "notes.txt" in err and (out / "notes.txt").read_text() == "mine"  # --overwrite deletes no one's file
    (out / "notes.txt").unlink()
    _save(weights, out)
    _save(weights, out, "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deit.safetensors", "hub"]  # no temporary folder left
    inside = out / "mine.safetensors"
    inside.write_bytes(weights.read_bytes())
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(inside), "--output", str(out),
                                               "--overwrite"]))
    assert "inside --output" in err and inside.exists()
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", f"local-dir:{out}", "--output", str(out),
                                               "--overwrite"]))
    assert "inside --output" in err
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(weights), "--output",
                                               str(tmp_path / "new"), "--private"]))
    assert "--private applies to --push only" in err and not (tmp_path / "new").exists()
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(weights), "--output",
                                               str(weights / "x")]))
    assert "is under" in err and "a file" in err
    err = one_line_error(capsys, simattn_main(["hub", "save", "--output", str(tmp_path / "x")]))
    assert "--weights is required" in err


def test_a_segmenters_folder_names_its_task_classes_and_palette_and_scores_the_same_miou(tmp_path, capsys):
    pytest.importorskip("segmentation_models_pytorch")
    from test_segment_deploy import make_weights

    weights = make_weights(tmp_path / "seg.safetensors")
    _save(weights, tmp_path / "hub")
    record = read_weights_record(weights)
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["architecture"] == "semantic_fpn" and config["task"] == "semantic_segmentation"
    assert config["label_names"] == record.extra["classes"] and config["palette"] == record.extra["palette"]
    assert read_weights_record(f"local-dir:{tmp_path / 'hub'}").extra["palette"] == record.extra["palette"]
    expected = _validate(capsys, str(weights))
    result = _validate(capsys, f"local-dir:{tmp_path / 'hub'}")
    assert result["miou"] == expected["miou"] and result["per_class"] == expected["per_class"]


def test_a_detectors_folder_names_its_task_classes_and_palette_and_rebuilds_the_same_detector(tmp_path):
    import dataclasses

    pytest.importorskip("pycocotools")
    from simattn.detect.config import DetectConfig
    from simattn.detect.model import DETECTION_TASK, build_mask_rcnn, load_detector
    section = {"backbone": "sima_deit_tiny_patch16_224", "backbone_weights": None, "drop_path_rate": 0.0,
               "backbone_kwargs": {"img_size": 64, "patch_size": 16, "embed_dim": 32, "depth": 4, "num_heads": 2},
               "out_indices": [0, 1, 2, 3], "strides": [4, 8, 16, 32], "fpn_channels": 16, "box_head_dim": 32,
               "mask_head_channels": 8, "min_size": 64, "max_size": 64, "maskrcnn": {}}
    section = {**dataclasses.asdict(DetectConfig().model), **section}  # the recipe's model section, tiny
    torch.manual_seed(0)
    detector = build_mask_rcnn(section, num_classes=3).eval()
    categories = [{"id": 1, "name": "square"}, {"id": 2, "name": "disc"}]
    torch.save({"task": "simattn detect", "model_name": section["backbone"], "model_kwargs": section,
                "model": detector.state_dict(), "task_state": {"categories": categories}}, tmp_path / "last.pth")
    _save(tmp_path / "last.pth", tmp_path / "hub")
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["task"] == DETECTION_TASK and config["label_names"] == ["background", "square", "disc"]
    assert len(config["palette"]) == 3 and config["category_ids"] == [1, 2]
    loaded, record = load_detector(f"local-dir:{tmp_path / 'hub'}")
    assert record.extra["classes"] == config["label_names"]
    image = [torch.rand(3, 64, 64)]
    with torch.no_grad():
        expected, got = detector(image)[0], loaded(image)[0]
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in detector.state_dict().items())


def test_a_save_that_fails_midway_leaves_the_old_folder_as_it_was(tmp_path, capsys, monkeypatch):
    from simattn.models import hub
    weights = _weights(tmp_path)
    _save(weights, tmp_path / "hub")
    before = {p.name: p.read_bytes() for p in (tmp_path / "hub").iterdir()}

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hub, "save_safetensors", full_disk)
    err = one_line_error(capsys, simattn_main(["hub", "save", "--weights", str(weights), "--output",
                                               str(tmp_path / "hub"), "--overwrite"]))
    assert "No space left" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "hub").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deit.safetensors", "hub"]  # no temporary folder left
