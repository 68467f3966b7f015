"""Every shipped recipe trains. Those of ``simattn segment``, ``ssl``, ``detect`` and ``convert`` (and the
classification recipes without an auto-augment policy, which test_recipe_training leaves out) run two updates
in-process through their task's own recipe loader: on the embedded data (digits, digit scenes, shapes) where the real
dataset is absent, or on webdataset shards of the digits where the recipe reads shards; only sizes, device and output
are narrowed, and the recipe's schedule, augmentation and losses stay as shipped."""
from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
import torch

from simattn.convert import ConvertConfig, convert, load_convert_recipe
from simattn.detect import DetectConfig
from simattn.segment.config import SegmentConfig
from simattn.ssl import SslConfig
from simattn.train import TrainConfig, load_config, train
from simattn.utils.recipe import list_recipes, load_recipe

from shard_fixtures import write_digits
from test_recipe_training import RECIPES as POLICY_RECIPES

#: shipped recipes that another test already trains (its module and function)
TRAINED_ELSEWHERE = {
    "digits_cpu": "test_data_hfds.py::test_train_and_validate_on_a_saved_dataset",
    "ssl_digits": "test_ssl.py::test_short_dino_run_beats_random_init",
    "detect_shapes_cpu": "test_one_option_declaration.py::test_detect_takes_accumulation_and_ema_from_the_engine",
    "convert_digits": "test_convert.py::test_convert_timm_deit_end_to_end_with_baselines",
}


def _ours(schema: type) -> list:
    return [name for name in list_recipes(schema) if name not in TRAINED_ELSEWHERE]


CLASSIFY = [name for name in _ours(TrainConfig) if name not in POLICY_RECIPES]
SEGMENT, SSL, DETECT = (_ours(schema) for schema in (SegmentConfig, SslConfig, DetectConfig))
CONVERT = [name for name in _ours(ConvertConfig) if name not in list_recipes(TrainConfig)]  # a convert: section
RUN = {"workers": 0, "threads": 1, "device": "cpu", "amp": False, "pin_memory": False, "log_interval": 0}


def _get(config, key: str):
    """The value at a dotted key (None where a free-form mapping leaves it out)."""
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else getattr(config, part)
    return config


def assert_kept(cfg, shipped, keys) -> None:
    """The narrowed recipe still has the shipped recipe's value of each dotted key."""
    changed = {key: (_get(shipped, key), _get(cfg, key)) for key in keys if _get(cfg, key) != _get(shipped, key)}
    assert not changed, changed


def assert_finite(*values) -> None:
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values), values


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_every_shipped_recipe_has_a_test_that_trains_it():
    ours = set(CLASSIFY + SEGMENT + SSL + DETECT + CONVERT)
    assert set(list_recipes()) - ours - set(POLICY_RECIPES) - set(TRAINED_ELSEWHERE) == set()
    here = Path(__file__).parent
    for recipe, where in TRAINED_ELSEWHERE.items():
        module, function = where.split("::")
        text = (here / module).read_text()
        names = {node.name for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef)}
        assert function in names and recipe in text, where


@pytest.mark.parametrize("recipe", CLASSIFY)
def test_classification_recipe_trains_two_updates(recipe, tmp_path):
    shipped = load_config(recipe)
    cfg = load_config(recipe, {**RUN, "max_updates": 2, "output": str(tmp_path / "run")})
    assert_kept(cfg, shipped, ["epochs", "model_kwargs", "img_size", "scale", "ratio", "hflip", "smoothing",
                               "sched", "warmup_epochs", "clip_grad", "lr"])
    summary = train(cfg).summary
    assert summary["updates"] == 2 and summary["epochs"] == shipped.epochs
    assert_finite(summary["history"][-1]["train_loss"], summary["final"]["loss"])


def _released_backbone(shipped, monkeypatch, tmp_path: Path) -> bool:
    """Whether the recipe starts from a pretrained tag; if so, a stand-in file in the tag's released layout is where
    its download would be cached (no network): the recipe's backbone keeps its width, to load it."""
    from simattn.models import sources
    from test_any_size import write_stand_in
    tag = sources.pretrained_tag(shipped.initial_checkpoint) if shipped.initial_checkpoint else None
    if tag is None:
        return False
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(sources, "_resolves", lambda host: False)
    write_stand_in(tag, sources.tag_cache_path(tag))
    return True


def _segment_overrides(shipped: SegmentConfig, tmp_path: Path, released: bool = False) -> dict:
    """64 px scenes and crops (the stride-32 level of the pyramid keeps 2x2 pixels), a narrow backbone (the
    released width where the recipe starts from a tag) and head."""
    head = {"aux_channels": 16} if shipped.model == "upernet" else {"segmentation_channels": 32}  # GroupNorm: 32
    width = {} if released else {"embed_dim": 48}
    overrides = {**RUN, "dataset": "digits", "dataset_kwargs": {"canvas": 64, "num_train": 8, "num_val": 2},
                 "model_kwargs": {"img_size": 64, **width, "decoder_channels": 32, **head},
                 "crop_size": [64, 64], "img_scale": [128, 64], "batch_size": 4, "max_updates": 2,
                 "output": str(tmp_path / "run")}
    if shipped.eval.mode == "slide":
        overrides["eval"] = {"crop_size": [64, 64], "stride": [43, 43]}
    return overrides


@pytest.mark.parametrize("recipe", SEGMENT)
def test_segmentation_recipe_trains_two_updates_on_digit_scenes(recipe, tmp_path, monkeypatch):
    from simattn.segment.task import segment
    shipped = load_recipe(SegmentConfig, recipe)
    released = _released_backbone(shipped, monkeypatch, tmp_path)
    cfg = load_recipe(SegmentConfig, recipe, _segment_overrides(shipped, tmp_path, released))
    assert_kept(cfg, shipped, ["model", "model_kwargs.backbone", "model_kwargs.out_indices",
                               "model_kwargs.downstream_agents", "initial_checkpoint", "drop_path",
                               "aux_loss_weight", "ratio_range", "cat_max_ratio", "hflip", "photometric", "sched",
                               "decay_rate", "warmup_epochs", "warmup_lr", "lr", "weight_decay", "eval.mode"])
    if shipped.dataset == "digits":
        assert_kept(cfg, shipped, ["dataset_kwargs.digits_per_scene", "dataset_kwargs.digit_size"])
    summary = segment(cfg).summary
    last = summary["history"][-1]
    assert summary["updates"] == 2 and summary["model_kwargs"]["num_classes"] == 11
    assert_finite(last["train_loss"], last["val_miou"])
    if shipped.model == "upernet":  # the auxiliary head trained beside the main one, weighted as the recipe says
        assert_finite(last["loss_aux"], last["loss_seg"])
        assert last["train_loss"] == pytest.approx(last["loss_seg"] + shipped.aux_loss_weight * last["loss_aux"],
                                                   rel=1e-4)


@pytest.mark.parametrize("recipe", SSL)
def test_ssl_recipe_pretrains_two_updates_on_the_digits(recipe, tmp_path):
    from simattn.ssl import pretrain
    shipped = load_recipe(SslConfig, recipe)
    data = {"global_crop_size": 32, "local_crop_size": 16}
    if shipped.data.name == "wds":
        data["root"] = str(write_digits(tmp_path / "wds", shard_samples=32, limit=64))
    else:
        data["name"] = "digits"
    cfg = load_recipe(SslConfig, recipe, {
        **RUN, "model": {"kwargs": {"img_size": 32, "embed_dim": 48, "depth": 2}},
        "head": {"hidden_dim": 64, "bottleneck_dim": 32, "output_dim": 128}, "data": data,
        "eval": {"img_size": 32, "linear_epochs": 1}, "batch_size": 8, "max_updates": 2,
        "output": str(tmp_path / "run")})
    assert_kept(cfg, shipped, ["model.name", "model.drop_path_rate", "head.norm_last_layer", "head.batch_norm",
                               "head.freeze_last_layer_epochs", "data.global_crop_scale", "data.local_crop_scale",
                               "data.n_local_views", "data.augment", "dino", "eval.knn_k", "clip_grad", "clip_mode",
                               "lr", "warmup_epochs", "weight_decay", "sync_bn"])
    assert cfg.data.name == ("wds" if shipped.data.name == "wds" else "digits")
    summary = pretrain(cfg)
    last = summary["history"][-1]
    assert summary["updates"] == 2 and last["momentum"] == pytest.approx(shipped.dino.momentum_teacher, abs=1e-6)
    assert_finite(last["train_loss"], last["knn_top1"], last["linear_top1"])


@pytest.fixture
def shapes(tmp_path):
    from simattn.detect import make_shapes_dataset
    data = {}
    for split, count in (("train", 4), ("val", 2)):
        images, annotations = make_shapes_dataset(tmp_path / "shapes", split, count, 64, seed=0)
        data.update({f"{split}_images": str(images), f"{split}_annotations": str(annotations)})
    return data


@pytest.mark.parametrize("recipe", DETECT)
@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # pycocotools' own
def test_detection_recipe_trains_two_updates_on_shapes(recipe, shapes, tmp_path):
    pytest.importorskip("pycocotools")
    from simattn.detect.train import train as detect_train
    shipped = load_recipe(DetectConfig, recipe)
    heads = {"rpn_pre_nms_top_n_train": 200, "rpn_post_nms_top_n_train": 100, "rpn_pre_nms_top_n_test": 200,
             "rpn_post_nms_top_n_test": 100, "rpn_batch_size_per_image": 64, "box_batch_size_per_image": 64}
    cfg = load_recipe(DetectConfig, recipe, {
        **RUN, "model": {"backbone_kwargs": {"img_size": 64, "embed_dim": 48}, "fpn_channels": 16,
                         "box_head_dim": 32, "mask_head_channels": 8, "min_size": [56, 64], "max_size": 64,
                         "maskrcnn": heads},
        "data": shapes, "max_updates": 2, "output": str(tmp_path / "run")})
    assert_kept(cfg, shipped, ["model.backbone", "model.out_indices", "model.strides", "model.drop_path_rate",
                               "data.hflip_prob", "schedule", "opt", "lr", "weight_decay", "clip_grad", "batch_size",
                               "eval_every_epochs"])
    summary = detect_train(cfg)
    last = summary["history"][-1]
    assert summary["updates"] == 2
    assert_finite(last["train_loss"], last["loss_mask"], last["loss_classifier"], last["bbox_AP"])
    warm = shipped.schedule  # still in the recipe's linear warm-up: 2 of its warmup_steps
    assert last["lr"] == pytest.approx(shipped.lr * (warm.warmup_ratio + (1 - warm.warmup_ratio) * 2
                                                     / warm.warmup_steps), rel=1e-3)


def _tiny_teacher(path: Path, num_heads: int) -> dict:
    """A small DeiT of timm's own class (the recipes' teachers are timm's DeiT weights), saved as a state dict."""
    from timm.models.vision_transformer import VisionTransformer
    kwargs = {"img_size": 32, "patch_size": 16, "embed_dim": 48, "depth": 1, "num_heads": num_heads,
              "num_classes": 10}
    torch.manual_seed(0)
    torch.save(VisionTransformer(**kwargs).state_dict(), path)
    return kwargs


@pytest.mark.parametrize("recipe", CONVERT)
def test_convert_recipe_runs_an_update_of_each_stage(recipe, tmp_path):
    shipped = load_convert_recipe(recipe)
    overrides = {**RUN, "img_size": 32, "batch_size": 16, "max_updates": 1, "output": str(tmp_path / "run"),
                 "convert": {"transfer_batch_size": 16}}
    if shipped.dataset == "wds":
        overrides["data_dir"] = str(write_digits(tmp_path / "wds", shard_samples=32, limit=64))
    else:
        overrides["dataset"] = "digits"
    cfg = load_convert_recipe(recipe, overrides)
    assert_kept(cfg, shipped, ["epochs", "model", "aa", "reprob", "mixup", "cutmix", "smoothing", "model_ema",
                               "aug_repeats", "lr_base", "warmup_epochs", "sched", "convert.to",
                               "convert.transfer_epochs", "convert.transfer_lr", "convert.transfer_warmup_epochs",
                               "convert.transfer_params", "convert.transfer_loss", "convert.distill_alpha",
                               "convert.distill_tau"])
    teacher = tmp_path / "teacher.pth"
    kwargs = _tiny_teacher(teacher, num_heads=6)  # DeiT-S's head count
    results = convert(cfg, str(teacher), shipped.model, kwargs)
    assert results["student"]["model_kwargs"]["attn_type"] == shipped.convert.to
    assert results["distill"]["epochs"] == shipped.epochs - shipped.convert.transfer_epochs
    for stage in ("transfer", "distill"):
        summary = _summary(tmp_path / "run" / stage)
        assert summary["updates"] == 1, stage
        assert_finite(summary["history"][-1]["train_loss"], summary["final"]["loss"])
