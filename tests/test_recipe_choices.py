"""Recipes a user can bend: switching a dataset, model, backbone or task choice on the command line drops what the
recipe set for the replaced choice (one note naming it) and the run goes on; an option the user typed for a choice it
does not apply to is a one-line error naming it; ``--print-config`` prints the resolved recipe with where each value
came from, and that output, fed back with ``-c``, is the same run config. Resolution only: nothing trains here."""
from __future__ import annotations

import dataclasses
import functools

import pytest
import yaml

from simattn.cli import main as simattn_main
from simattn.convert.cli import build_parser as convert_parser
from simattn.convert.config import ConvertConfig
from simattn.data.factory import DATASETS
from simattn.detect.cli import _parser as detect_parser
from simattn.detect.config import DetectConfig
from simattn.segment.cli import build_parser as segment_parser
from simattn.segment.config import SEGMENT_DATASETS, SegmentConfig
from simattn.ssl.cli import _parser as ssl_parser
from simattn.ssl.config import SslConfig
from simattn.train.cli import build_parser as train_parser
from simattn.classify.config import TrainConfig
from simattn.utils.recipe import (config_yaml, list_recipes, load_recipe, option_paths, print_config_if_asked,
                                  recipe_from_args, recipe_overrides, resolve_recipe)

# command → (parser, the arguments before the options, schema, the dataset flag and its choices, another choice's
# flag and two values of it)
COMMANDS = {
    "train": (train_parser, [], TrainConfig, "--dataset", list(DATASETS),
              ("--model", ["sima_small_12_p16", "soft_tiny"])),
    "convert": (convert_parser, ["--weights", "w.safetensors"], ConvertConfig, "--dataset", list(DATASETS),
                ("--to", ["xca", "relu"])),
    "segment": (segment_parser, [], SegmentConfig, "--dataset", SEGMENT_DATASETS,
                ("--eval.mode", ["whole", "slide"])),
    "ssl": (ssl_parser, ["train"], SslConfig, "--data.name", list(DATASETS),
            ("--model.name", ["sima_small_12_p16", "soft_tiny"])),
    "detect": (detect_parser, ["train"], DetectConfig, None, [],
               ("--model.backbone", ["sima_small_12_p16", "soft_tiny"])),
}


@functools.lru_cache(maxsize=None)
def _parser(command):  # built once: a parser lists the shipped recipes in its help, which reads every one
    return COMMANDS[command][0]()


def _parse(command, argv):
    _, head, schema, *_ = COMMANDS[command]
    return schema, _parser(command).parse_args([*head, *argv])


def _flat(tree, where=""):
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{where}{key}.") if isinstance(value, dict) else {f"{where}{key}": value})
    return out


def _switches(command):
    _, _, schema, data_flag, datasets, (flag, values) = COMMANDS[command]
    for recipe in list_recipes(schema):
        for value in datasets:
            yield recipe, [data_flag, value]
        for value in values:
            yield recipe, [flag, value]


def _stale(schema, cfg):
    """Options still set (away from their default) for a choice value they do not belong to."""
    values, defaults = dataclasses.asdict(cfg), dataclasses.asdict(schema())

    def leaf(tree, path):
        for part in path.split("."):
            tree = tree[part]
        return tree

    out = []
    for path, spec in option_paths(schema).items():
        if spec.belongs_to and len(spec.belongs_to) > 1:
            choice = path.rsplit(".", 1)[0] + "." + spec.belongs_to[0] if "." in path else spec.belongs_to[0]
            applies = spec.belongs_to[1]() if callable(spec.belongs_to[1]) else spec.belongs_to[1:]
            if leaf(values, choice) not in applies and leaf(values, path) != leaf(defaults, path):
                out.append(path)
    return out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_shipped_recipe_takes_every_switch_or_names_the_users_flag(command, capsys):
    resolved = refused = 0
    for recipe, switch in _switches(command):
        schema, args = _parse(command, ["-c", recipe, *switch])
        try:
            cfg = recipe_from_args(schema, args)
        except ValueError as e:
            assert switch[0] in str(e) and "\n" not in str(e), (recipe, switch, str(e))
            refused += 1
            continue
        resolved += 1
        (path, value), = _flat(recipe_overrides(schema, _parse(command, switch)[1])).items()
        chosen = dataclasses.asdict(cfg)
        for part in path.split("."):
            chosen = chosen[part]
        assert chosen == value == switch[1], (recipe, switch)
        assert not _stale(schema, cfg), (recipe, switch)
    assert resolved > refused  # most switches run; the refusals are e.g. a dataset on disk without --data-dir
    for line in capsys.readouterr().err.splitlines():
        assert line.startswith("note: --") and "dropped what belonged to that" in line, line


def test_a_dataset_switch_drops_the_recipes_folder_with_one_note(capsys):
    cfg = recipe_from_args(*_parse("train", ["-c", "sima_deit_small_wds", "--dataset", "digits"]))
    assert cfg.dataset == "digits" and cfg.data_dir is None and cfg.aug_repeats == 0 and cfg.epochs == 300
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith("note: --dataset digits replaces dataset 'wds' (recipe sima_deit_small_wds)")
    assert "data_dir '/data/imagenet-wds' (recipe sima_deit_small_wds)" in note
    # from one dataset on disk to another: the folder still applies and stays
    assert recipe_from_args(*_parse("train", ["-c", "sima_deit_small_wds", "--dataset", "folder"])).data_dir == \
        "/data/imagenet-wds"
    # the segmentation reader's own options belong to the dataset they were written for
    cfg = recipe_from_args(*_parse("segment", ["-c", "seg_digits_cpu", "--dataset", "folder", "--data-dir", "d"]))
    assert cfg.dataset_kwargs == {} and cfg.data_dir == "d"
    assert "dataset_kwargs {'digits_per_scene'" in capsys.readouterr().err


def test_another_model_drops_the_recipes_kwargs_and_keeps_the_users():
    cfg = recipe_from_args(*_parse("train", ["-c", "digits_cpu", "--model", "soft_tiny", "--model-kwargs",
                                             "img_size=16"]))
    assert cfg.model == "soft_tiny" and cfg.model_kwargs == {"img_size": 16} and cfg.img_size == 16
    # the same model again is no switch: the recipe's kwargs stay and the user's merge into them
    cfg = recipe_from_args(*_parse("train", ["-c", "digits_cpu", "--model", "sima_deit_tiny_patch16_224",
                                             "--model-kwargs", "depth=2"]))
    assert cfg.model_kwargs["depth"] == 2 and cfg.model_kwargs["embed_dim"] == 64
    cfg = recipe_from_args(*_parse("detect", ["-c", "detect_shapes_cpu", "--model.backbone", "soft_tiny"]))
    assert cfg.model.backbone_kwargs == {} and cfg.model.fpn_channels == 32


@pytest.mark.parametrize("argv,says", [
    (["train", "-c", "digits_cpu", "--data-dir", "d"], "--data-dir d does not apply to dataset 'digits'"),
    (["train", "-c", "sima_deit_small_wds", "--dataset", "digits", "--data-dir", "d"],
     "--data-dir d does not apply to --dataset digits"),
    (["segment", "-c", "seg_digits_cpu", "--eval.stride", "8", "8"], "--eval.stride [8, 8] does not apply to"),
    (["ssl", "train", "-c", "ssl_digits", "--data.root", "d"], "--data.root d does not apply"),
])
def test_an_option_the_user_typed_that_does_not_apply_is_a_one_line_error(argv, says, tmp_path, capsys):
    code = simattn_main([*argv, "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "run").exists()


def test_set_empty_mapping_clears_a_free_form_option():
    cfg = recipe_from_args(*_parse("segment", ["-c", "seg_digits_cpu", "--set", "dataset_kwargs={}"]))
    assert cfg.dataset_kwargs == {}
    assert recipe_from_args(*_parse("train", ["-c", "digits_cpu", "--set", "model_kwargs={}"])).model_kwargs == {}
    assert load_recipe(SslConfig, "ssl_digits", ["model.kwargs={}"]).model.kwargs == {}


def _printed(command, argv, capsys):
    schema, args = _parse(command, argv)
    assert print_config_if_asked(schema, args)
    return schema, args, capsys.readouterr().out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_print_config_is_a_recipe_for_the_same_run(command, tmp_path, capsys):
    _, _, schema, *_ = COMMANDS[command]
    for recipe, switch in [(r, []) for r in list_recipes(schema)] + list(_switches(command))[::5]:
        schema, args = _parse(command, ["-c", recipe, *switch])
        try:
            resolved = resolve_recipe(schema, recipe, recipe_overrides(schema, args))
            expected = resolved.config()
        except ValueError:
            continue
        path = tmp_path / "printed.yaml"
        path.write_text(config_yaml(resolved))
        again = load_recipe(schema, str(path))
        assert dataclasses.replace(again, recipe=None) == dataclasses.replace(expected, recipe=None), (recipe, switch)
        for line in path.read_text().splitlines()[1:]:
            if not line.rstrip().endswith(":"):
                origins = line.rsplit("  # ", 1)[1].split(" + ")
                assert all(o in ("default", "flag") or o.startswith("recipe ") for o in origins), line


def test_print_config_says_where_each_value_came_from(capsys):
    code = simattn_main(["train", "-c", "sima_deit_small_wds", "--dataset", "digits", "--epochs", "3",
                         "--model-kwargs", "depth=2", "--print-config"])
    out, err = capsys.readouterr()
    assert code == 0 and err.count("note: ") == 1
    lines = dict(line.rsplit("  # ", 1) for line in out.splitlines()[1:] if "  # " in line)
    assert lines["epochs: 3"] == "flag" and lines["dataset: digits"] == "flag"
    assert lines["data_dir: null"] == "default" and lines["grad_accum_steps: 1"] == "default"
    assert lines["aug_repeats: 0"] == "recipe sima_deit_small_wds"  # the base's 3, replaced by the variant
    assert lines["model: sima_deit_small_patch16_224"] == "recipe sima_deit_small"
    assert lines["model_kwargs: {depth: 2}"] == "flag"
    assert not any(line.startswith("recipe:") for line in out.splitlines()) and yaml.safe_load(out)["epochs"] == 3
    # a free-form mapping with items from the recipe and from the command line names both
    _, _, text = _printed("train", ["-c", "digits_cpu", "--model-kwargs", "depth=2", "--print-config"], capsys)
    assert "  # recipe digits_cpu + flag" in next(line for line in text.splitlines() if line.startswith("model_kwargs"))
    # convert prints without the teacher it would need to run
    assert simattn_main(["convert", "-c", "convert_digits", "--to", "xca", "--print-config"]) == 0
    assert "  to: xca  # flag" in capsys.readouterr().out


def test_recipe_layers_resolve_in_order_and_origins_follow_them():
    resolved = resolve_recipe(ConvertConfig, "convert_digits", {"lr": 1e-3})
    assert resolved.origins["lr"] == ["flag"] and resolved.origins["batch_size"] == ["recipe convert_digits"]
    assert resolved.origins["model"] == ["recipe digits_cpu"] and resolved.origins["drop"] == ["default"]
    assert resolved.notes == [] and recipe_overrides(TrainConfig, _parse("train", [])[1]) == {}


def test_a_recipe_bent_to_another_dataset_runs(tmp_path, capsys, one_thread):
    """A segmentation recipe written for images on disk, pointed at the embedded digit scenes: its folder and its
    reader's options are dropped (a note), the user's own reader options kept, and the run trains and scores."""
    pytest.importorskip("segmentation_models_pytorch")
    recipe = tmp_path / "my_folder_recipe.yaml"
    recipe.write_text("base: seg_digits_cpu\ndataset: folder\ndata_dir: /data/my_masks\n"
                      "dataset_kwargs: {classes_file: /data/my_masks/classes.txt}\n")
    tiny = ["--model-kwargs", "img_size=64", "patch_size=16", "embed_dim=32", "depth=4", "num_heads=2",
            "decoder_channels=16", "segmentation_channels=32", "--crop-size", "[64, 64]", "--img-scale", "[64, 64]",
            "--epochs", "1", "--max-updates", "1", "--batch-size", "4", "--threads", "1"]
    code = simattn_main(["segment", "-c", str(recipe), "--dataset", "digits", "--set",
                         "dataset_kwargs={canvas: 64, num_train: 8, num_val: 4}", *tiny,
                         "--output", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "1 updates (max_updates; the schedule's 1 epochs × 2 updates)" in out + err  # what runs is counted
    # the user's recipe replaced its base's dataset (dropping the digit scenes' options), then the flag replaced it
    base, flag = [line for line in err.splitlines() if line.startswith("note: ")]
    assert base.startswith("note: dataset 'folder' (recipe my_folder_recipe) replaces dataset 'digits' (recipe "
                           "seg_digits_cpu)") and "digits_per_scene" in base
    assert flag.startswith("note: --dataset digits replaces dataset 'folder' (recipe my_folder_recipe)")
    assert "data_dir '/data/my_masks'" in flag and "classes_file" in flag
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["dataset"] == "digits" and saved["data_dir"] is None
    assert saved["dataset_kwargs"] == {"canvas": 64, "num_train": 8, "num_val": 4}


def test_another_backbone_drops_the_recipes_backbone_options_and_keeps_the_heads(capsys):
    """seg_digits_cpu's DeiT options (patch_size, embed_dim, depth, num_heads) do not go to a PVT: dropped with a
    note; the head's (decoder_channels, segmentation_channels) and the user's own (img_size) stay; the printed
    configuration is built on the meta device first."""
    pytest.importorskip("segmentation_models_pytorch")
    assert simattn_main(["segment", "-c", "seg_digits_cpu", "--model-kwargs", "backbone=agent_pvt_tiny",
                         "img_size=64", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert "note: --model-kwargs backbone=agent_pvt_tiny replaces model_kwargs.backbone 'sima_deit_tiny_patch16_224' " \
           "(recipe seg_digits_cpu); dropped its options: patch_size=8, embed_dim=96, depth=4, num_heads=3" in err
    printed = yaml.safe_load(out)
    assert printed["model_kwargs"] == {"backbone": "agent_pvt_tiny", "img_size": 64, "decoder_channels": 64,
                                       "segmentation_channels": 32}


def test_null_empties_a_mapping_before_later_items(capsys):
    """--set model_kwargs=null, then --model-kwargs: the later items alone (later wins, null empties)."""
    assert simattn_main(["train", "-c", "digits_cpu", "--set", "model_kwargs=null", "--model-kwargs", "depth=2",
                         "patch_size=4", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model_kwargs"] == {"depth": 2, "patch_size": 4}
    assert simattn_main(["train", "-c", "digits_cpu", "--model-kwargs", "depth=2", "--set", "model_kwargs=null",
                         "--img-size", "32", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model_kwargs"] == {}


def test_print_config_exits_2_on_a_configuration_that_cannot_build(capsys):
    pytest.importorskip("segmentation_models_pytorch")
    assert simattn_main(["segment", "-c", "seg_digits_cpu", "--model-kwargs", "backbone=agent_pvt_tiny",
                         "patch_size=8", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "cannot build agent_pvt_tiny" in err and "patch_size" in err
