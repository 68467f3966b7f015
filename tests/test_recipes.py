"""Recipes: one typed schema per task, every option range-checked in one line, shipped names in every command,
--set everywhere, and the shipped files in the package."""
from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

import pytest
import yaml

from simattn.cli import main as simattn_main
from simattn.convert.config import ConvertConfig
from simattn.detect.config import DetectConfig
from simattn.segment.config import SegmentConfig
from simattn.ssl.config import SslConfig
from simattn.classify.config import TrainConfig
from simattn.utils.recipe import list_recipes, load_recipe, merge_recipe, recipe_to_save

# option, bad value, what the message must say is allowed
BAD_TRAIN = [
    ("clip_grad", -1, "a number > 0, or null"),
    ("cooldown_epochs", -5, "an integer >= 0"),
    ("model_ema_decay", 2, r"a number in \(0, 1\)"),
    ("model_ema_decay", 1.0, r"a number in \(0, 1\)"),
    ("warmup_epochs", -3, "a number >= 0"),
    ("mixup", -1, "a number >= 0"),
    ("hflip", 2, r"a number in \[0, 1\]"),
    ("reprob", 2, r"a number in \[0, 1\]"),
    ("crop_pct", 0, r"a number in \(0, 1\], or null"),
    ("epochs", True, "an integer >= 1"),
    ("epochs", 2.5, "an integer >= 1"),
    ("model_ema", 1, "true or false"),
    ("smoothing", 1.5, r"a number in \[0, 1\)"),
    ("drop_path", 1.5, r"a number in \[0, 1\)"),
    ("min_lr", -5, "a number >= 0"),
    ("lr", float("nan"), "a number > 0, or null"),
    ("threads", -1, "an integer >= 1, or null"),
    ("clip_mode", "nrom", "one of norm, value, agc, param_norm .*did you mean 'norm'"),
    ("interpolation", "bicubc", "one of bicubic, .*did you mean 'bicubic'"),
    ("sched", "cosin", "one of cosine, .*did you mean 'cosine'"),
    ("amp_dtype", "fp16", "one of float16, bfloat16"),
    ("aa", "rand-m9-zz1", "a timm auto-augment string"),
    ("opt", "adamx", "an optimizer timm.optim knows .*adamax"),
    ("opt_betas", [0.9], r"a list of numbers in \[0, 1\) \(2 values\)"),
    ("scale", [0.9, 0.1], "low <= high"),
    ("device", "gpu", "cpu, cuda, cuda:N"),
    ("model_kwargs", [1, 2], "a mapping"),
]


@pytest.mark.parametrize("name,value,allowed", BAD_TRAIN, ids=[f"{n}={v!r}" for n, v, _ in BAD_TRAIN])
def test_every_train_option_is_range_checked_in_one_line(name, value, allowed):
    with pytest.raises(ValueError, match=rf"option '{name}': got .*; .*{allowed}") as info:
        load_recipe(TrainConfig, None, {name: value})
    assert "\n" not in str(info.value)


def test_good_values_pass_and_timm_strings_are_accepted():
    cfg = load_recipe(TrainConfig, None, {"aa": "rand-m9-mstd0.5-inc1", "opt": "lamb", "sched": "step",
                                          "interpolation": "bilinear", "opt_betas": [0.9, 0.99], "lr": "5e-4",
                                          "epochs": 3.0, "device": "cuda:1"})
    assert (cfg.aa, cfg.opt, cfg.lr, cfg.epochs, cfg.opt_betas) == ("rand-m9-mstd0.5-inc1", "lamb", 5e-4, 3,
                                                                    [0.9, 0.99])
    assert isinstance(cfg.epochs, int)
    # a TrainConfig made in Python is checked too
    with pytest.raises(ValueError, match="option 'hflip'"):
        TrainConfig(hflip=3.0)


@pytest.mark.parametrize("schema,key,value,allowed", [
    (SslConfig, "epochs", 0, "an integer >= 1"),
    (SslConfig, "dino.momentum_teacher", 1.5, r"\[0, 1\)"),
    (SslConfig, "data.name", "no_such_data", "one of digits, folder"),
    (SslConfig, "eval.crop_pct", 0, r"\(0, 1\]"),
    (SslConfig, "amp", "yes", "true or false"),
    (DetectConfig, "schedule.warmup_ratio", 2, r"\[0, 1\]"),
    (DetectConfig, "opt", "adamx", "optimizer timm.optim knows"),
    (DetectConfig, "model.min_size", [0], "an integer or a list of integers >= 1"),
    (DetectConfig, "data.hflip_prob", -0.1, r"\[0, 1\]"),
])
def test_nested_recipes_are_range_checked_too(schema, key, value, allowed):
    update = {key: value} if "." not in key else {key.split(".")[0]: {key.split(".")[1]: value}}
    with pytest.raises(ValueError, match=rf"option '{key}': got .*{allowed}"):
        load_recipe(schema, None, update)


def test_set_items_nest_merge_free_form_kwargs_and_reject_typos():
    r = load_recipe(SslConfig, "ssl_digits", ["lr=0.5", "model.kwargs.depth=3"])
    assert r.lr == 0.5 and r.model.kwargs["depth"] == 3 and r.model.kwargs["embed_dim"] == 64
    assert load_recipe(SslConfig, "ssl_digits", ["model.kwargs=null"]).model.kwargs == {}
    with pytest.raises(ValueError, match="unknown key 'dino.teacher_tmp' .*did you mean 'teacher_temp'"):
        load_recipe(SslConfig, None, ["dino.teacher_tmp=3"])
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        load_recipe(DetectConfig, None, ["epochs"])
    # merge_recipe checks values against the schema of the instance it changes
    with pytest.raises(ValueError, match="option 'epochs'"):
        merge_recipe(SslConfig(), {"epochs": -1})


def test_keys_of_earlier_ssl_and_detect_recipes_name_their_option_now():
    """The engine's options left the ssl/detect ``train`` sections: such a key names the option that took it."""
    for schema, key, now in [(SslConfig, "train.epochs", "epochs"), (SslConfig, "train.teacher_temp", "dino.teacher_temp"),
                             (SslConfig, "train.optimizer", "opt"), (SslConfig, "data.workers", "workers"),
                             (DetectConfig, "train.max_steps", "max_updates"),
                             (DetectConfig, "train.warmup_steps", "schedule.warmup_steps")]:
        with pytest.raises(ValueError, match=rf"unknown key '{key}' \(did you mean '{now}'\?\)") as info:
            load_recipe(schema, None, [f"{key}=1"])
        assert "\n" not in str(info.value)


def test_recipe_names_resolve_in_every_command_and_list_per_task():
    assert list_recipes(SslConfig) == ["ssl_digits", "ssl_dino_sima_small_12_p16", "ssl_dino_sima_small_12_p16_wds"]
    assert list_recipes(DetectConfig) == ["detect_maskrcnn_sima_small_12_p16", "detect_shapes_cpu"]
    train_names = list_recipes(TrainConfig)
    assert "digits_cpu" in train_names and not any(n.startswith(("ssl_", "detect_")) for n in train_names)
    # a recipe whose own keys fit a task belongs to it only if its base: does too
    assert "sima_deit_small_wds" in train_names and "convert_deit_small_imagenet_wds" not in train_names
    assert all(n.startswith("seg_") for n in list_recipes(SegmentConfig))
    for name in ("ssl_digits", "ssl_digits.yaml", "configs/ssl_digits.yaml"):
        assert load_recipe(SslConfig, name).model.kwargs["img_size"] == 16
    assert load_recipe(DetectConfig, "detect_shapes_cpu").model.fpn_channels == 32
    with pytest.raises(FileNotFoundError, match="neither a file nor a shipped recipe .*ssl_digits"):
        load_recipe(SslConfig, "ssl_digit")


def test_every_file_in_configs_ships_in_the_package_and_loads_under_its_task():
    shipped = resources.files("simattn") / "configs"
    names = sorted(p.name[:-5] for p in shipped.iterdir() if p.name.endswith(".yaml"))
    for schema in (TrainConfig, SslConfig, DetectConfig, ConvertConfig, SegmentConfig):
        for name in list_recipes(schema):
            load_recipe(schema, name)  # every value of every shipped recipe passes its checks
    claimed = {n for schema in (TrainConfig, SslConfig, DetectConfig, ConvertConfig, SegmentConfig)
               for n in list_recipes(schema)}
    assert claimed == set(names)  # every shipped recipe belongs to a task
    for name in names:  # none names an output folder: default outputs never collide
        assert "output" not in yaml.safe_load((shipped / f"{name}.yaml").read_text()), name


# each ImageNet recipe's shard variant: (schema, folder recipe, shard recipe, the keys that say where the data is)
SHARD_VARIANTS = [
    (TrainConfig, "sima_deit_small", "sima_deit_small_wds", ("dataset", "data_dir")),
    (ConvertConfig, "convert_deit_small_imagenet", "convert_deit_small_imagenet_wds", ("dataset", "data_dir")),
    (SslConfig, "ssl_dino_sima_small_12_p16", "ssl_dino_sima_small_12_p16_wds", ("data",)),
]


@pytest.mark.parametrize("schema,folder,shards,where", SHARD_VARIANTS, ids=[v[2] for v in SHARD_VARIANTS])
def test_imagenet_recipes_have_a_shard_variant_that_changes_only_the_data_source(schema, folder, shards, where):
    a, b = (dataclasses.asdict(load_recipe(schema, name)) for name in (folder, shards))
    data = b["data"] if schema is SslConfig else b
    assert (data.get("name") or data.get("dataset"), data.get("root") or data.get("data_dir")) == \
        ("wds", "/data/imagenet-wds")
    if schema is SslConfig:
        a["data"].update(name="wds", root="/data/imagenet-wds")
    # streamed shards have no index to repeat a sample by: the from-scratch recipe drops repeated augmentation
    changed = {k for k in a if a[k] != b[k]} - {"recipe", *where}
    assert changed == ({"aug_repeats"} if folder == "sima_deit_small" else set()), changed
    assert b["aug_repeats"] == 0
    assert (Path(__file__).parents[1] / "configs" / f"{shards}.yaml").resolve() == \
        Path(str(resources.files("simattn") / "configs" / f"{shards}.yaml")).resolve()


def test_saved_recipes_leave_out_where_the_run_went():
    cfg = load_recipe(TrainConfig, "digits_cpu", {"output": "runs/x", "resume": "auto", "overwrite": True})
    saved = recipe_to_save(cfg)
    assert not {"output", "resume", "overwrite"} & set(saved) and saved["epochs"] == cfg.epochs
    nested = recipe_to_save(load_recipe(SslConfig, "ssl_digits", ["output=runs/y"]))
    assert "output" not in nested and nested["epochs"] == 12 and nested["dino"]["momentum_teacher"] == 0.99


def test_bad_options_exit_2_with_one_line_in_every_command(capsys):
    for argv, expected in [
        (["train", "-c", "digits_cpu", "--hflip", "2"], "option 'hflip': got 2; allowed: a number in [0, 1]"),
        (["train", "-c", "digits_cpu", "--set", "epochs=true"], "option 'epochs': got True"),
        (["ssl", "train", "--config", "ssl_digits", "--set", "epochs=0"], "option 'epochs': got 0"),
        (["ssl", "train", "--config", "ssl_digits", "--dino.teacher-temp", "0"], "option 'dino.teacher_temp': got 0"),
        (["detect", "train", "--config", "detect_shapes_cpu", "--eval-every-epochs", "-1"],
         "option 'eval_every_epochs'"),
        (["ssl", "eval", "--config", "nope"], "recipe file not found"),
    ]:
        assert simattn_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err
