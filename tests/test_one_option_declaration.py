"""Every training task declares each option once: the engine's options (batch per process, accumulation, EMA, ...) are
the same flags and keys in ``train``, ``ssl train``, ``detect train`` and ``convert``; every option is a flag and a
``--set`` key that mean the same; unknown keys name the close match; a run's config.yaml is a recipe for the same
run."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main
from simattn.convert.cli import build_parser as convert_parser
from simattn.convert.config import ConvertConfig
from simattn.detect.cli import _parser as detect_parser
from simattn.detect.config import DetectConfig
from simattn.engine.config import EngineConfig
from simattn.segment.cli import build_parser as segment_parser
from simattn.segment.config import SegmentConfig
from simattn.ssl.cli import _parser as ssl_parser
from simattn.ssl.config import SslConfig
from simattn.train.cli import build_parser as train_parser
from simattn.train.config import TrainConfig
from simattn.utils.io import load_checkpoint
from simattn.utils.recipe import (RUN_KEYS, list_recipes, load_recipe, option_paths, recipe_from_args,
                                  recipe_overrides, recipe_to_save)

# command → (parser, the arguments before the options, the schema, a shipped recipe)
COMMANDS = {
    "train": (train_parser, [], TrainConfig, "digits_cpu"),
    "ssl": (ssl_parser, ["train"], SslConfig, "ssl_digits"),
    "detect": (detect_parser, ["train"], DetectConfig, "detect_shapes_cpu"),
    "convert": (convert_parser, ["--weights", "w.safetensors"], ConvertConfig, "convert_digits"),
    "segment": (segment_parser, [], SegmentConfig, "seg_digits_cpu"),
}


def _config(command: str, argv):
    parser, head, schema, recipe = COMMANDS[command]
    return recipe_from_args(schema, parser().parse_args([*head, "-c", recipe, *argv]))


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_task_takes_trains_flags_and_set_items_alike(command):
    flags = _config(command, ["--grad-accum-steps", "2", "--model-ema", "--channels-last", "--compile",
                              "--amp-dtype", "bfloat16", "--batch-size", "3", "--seed", "7", "--threads", "1"])
    assert (flags.grad_accum_steps, flags.model_ema, flags.channels_last, flags.compile, flags.amp_dtype,
            flags.batch_size, flags.seed, flags.threads) == (2, True, True, True, "bfloat16", 3, 7, 1)
    items = _config(command, ["--set", "grad_accum_steps=2", "model_ema=true", "channels_last=true", "compile=true",
                              "amp_dtype=bfloat16", "batch_size=3", "seed=7", "threads=1"])
    assert flags.to_dict() == items.to_dict()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_flag_is_its_set_item(command):
    """For every option of every task (sections' too): ``--flag VALUE`` changes the recipe as ``--set key=VALUE``."""
    make_parser, head, schema, _ = COMMANDS[command]
    parser = make_parser()
    for name, spec in option_paths(schema).items():
        flag = "--" + name.replace("_", "-")
        value = spec.default
        if spec.hint is bool:
            cases = [([flag], f"{name}=true"), ([flag.replace("--", "--no-", 1)], f"{name}=false")]
        elif isinstance(value, dict):
            cases = [([flag, "k=[1, 2]"], f"{name}.k=[1, 2]")]
        elif isinstance(value, list):
            cases = [([flag, *map(str, value)], f"{name}={json.dumps(value)}")] if value else []
        elif value is None:
            cases = [([flag, "null"], f"{name}=null")] if spec.check is None else []
        else:
            cases = [([flag, str(value)], f"{name}={value}")]
        for argv, item in cases:
            by_flag = recipe_overrides(schema, parser.parse_args([*head, *argv]))
            by_item = recipe_overrides(schema, parser.parse_args([*head, "--set", item]))
            assert by_flag == by_item, (command, argv, item)
    # a bare --resume is resume=auto in every task
    assert recipe_overrides(schema, parser.parse_args([*head, "--resume"])) == {"resume": "auto"}


def test_engine_options_are_declared_once_and_tasks_only_change_defaults():
    engine = {f.name: f for f in dataclasses.fields(EngineConfig)}
    for schema in (TrainConfig, ConvertConfig, SslConfig, DetectConfig, SegmentConfig):
        for f in dataclasses.fields(schema):
            if f.name in engine:  # the same declaration (help, range, choices), at most another default
                assert f.metadata["opt"] is engine[f.name].metadata["opt"], (schema.__name__, f.name)
    assert SslConfig().batch_size == 256 and SslConfig().clip_mode == "param_norm" and EngineConfig().clip_mode == "norm"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unknown_recipe_key_names_the_close_match(command, tmp_path, capsys):
    _, head, schema, recipe = COMMANDS[command]
    typo, meant = {"train": ("grad_acum_steps", "grad_accum_steps"), "ssl": ("dino.teacher_tmp", "teacher_temp"),
                   "detect": ("model.fpn_chanels", "fpn_channels"),
                   "convert": ("convert.transfer_lr_", "transfer_lr"), "segment": ("eval.strde", "stride")}[command]
    path = tmp_path / "recipe.yaml"
    section, _, key = typo.rpartition(".")
    path.write_text(yaml.safe_dump({"base": recipe, **({section: {key: 1}} if section else {key: 1})}))
    with pytest.raises(ValueError, match=rf"unknown key '{typo}' \(did you mean '{meant}'\?\).* \(in recipe "):
        load_recipe(schema, str(path))
    name = "ssl" if command == "ssl" else command
    code = simattn_main([name, *head, "-c", str(path), "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"did you mean '{meant}'" in err, err


@pytest.mark.parametrize("schema", [TrainConfig, ConvertConfig, SslConfig, DetectConfig, SegmentConfig])
def test_saved_config_yaml_round_trips(schema, tmp_path):
    for name in list_recipes(schema):
        cfg = load_recipe(schema, name, {"output": str(tmp_path / "x"), "resume": "auto", "overwrite": True})
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(recipe_to_save(cfg), sort_keys=False))
        again = load_recipe(schema, str(path))
        assert recipe_to_save(again) == recipe_to_save(cfg), name
        assert not set(RUN_KEYS) & set(recipe_to_save(again))


# ---------------------------------------------------------------- the flag and the --set form train the same weights
TINY_VIT = "{img_size: 16, patch_size: 4, embed_dim: 32, depth: 1, num_heads: 2}"
RUNS = {
    "train": (["train", "-c", "digits_cpu"],
              ["model_kwargs=" + TINY_VIT.replace("}", ", attn_type: sima}"), "steps_per_epoch=2", "epochs=1",
               "batch_size=16", "threads=1", "eval_every_epochs=0"]),
    "ssl": (["ssl", "train", "-c", "ssl_digits"],
            [f"model.kwargs={TINY_VIT}", "head.hidden_dim=32", "head.bottleneck_dim=16", "head.output_dim=64",
             "epochs=1", "batch_size=64", "steps_per_epoch=2", "threads=1", "workers=0",
             "eval.compare_random_init=false", "eval.linear_epochs=0"]),
}


def _run_both_ways(tmp_path, argv, settings):
    flag_run, set_run = tmp_path / "flags", tmp_path / "set"
    assert simattn_main([*argv, "--set", *settings, "--grad-accum-steps", "2", "--model-ema",
                         "--output", str(flag_run)]) == 0
    assert simattn_main([*argv, "--set", *settings, "grad_accum_steps=2", "model_ema=true",
                         "--output", str(set_run)]) == 0
    a, b = load_checkpoint(flag_run / "last.pth"), load_checkpoint(set_run / "last.pth")
    for key in ("model", "model_ema"):
        assert a[key].keys() == b[key].keys() and all(torch.equal(a[key][k], b[key][k]) for k in a[key]), key
    assert a["config"]["grad_accum_steps"] == 2 and a["config"]["model_ema"] is True and a["global_step"] == 2
    # the config.yaml each run wrote is a recipe for the same run
    assert (flag_run / "config.yaml").read_text() == (set_run / "config.yaml").read_text()
    return a


@pytest.mark.parametrize("command", list(RUNS))
def test_the_flag_and_set_forms_train_the_same_weights(command, tmp_path, one_thread):
    if command == "ssl":
        pytest.importorskip("lightly")
    argv, settings = RUNS[command]
    state = _run_both_ways(tmp_path, argv, settings)
    schema = TrainConfig if command == "train" else SslConfig
    saved = load_recipe(schema, str(tmp_path / "flags" / "config.yaml"))
    assert recipe_to_save(saved) == {k: v for k, v in state["config"].items() if k not in RUN_KEYS + ("recipe",)}


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # pycocotools' own
def test_detect_takes_accumulation_and_ema_from_the_engine(tmp_path, one_thread):
    pytest.importorskip("pycocotools")
    from simattn.detect.shapes import make_shapes_dataset
    data = {}
    for split, n in (("train", 8), ("val", 2)):
        images, ann = make_shapes_dataset(tmp_path / "shapes", split, n, 64, seed=0)
        data.update({f"{split}_images": str(images), f"{split}_annotations": str(ann)})
    settings = [f"data.{k}={v}" for k, v in data.items()] + [
        "model.backbone_kwargs={img_size: 64, patch_size: 16, embed_dim: 32, depth: 4, num_heads: 2}",
        "model.min_size=64", "model.max_size=64", "model.fpn_channels=16", "model.box_head_dim=32",
        "model.mask_head_channels=8", "epochs=1", "batch_size=2", "threads=1"]
    _run_both_ways(tmp_path, ["detect", "train", "-c", "detect_shapes_cpu"], settings)


def test_convert_takes_accumulation_and_ema_in_both_forms(tmp_path, one_thread):
    from test_convert import MODEL, TINY, make_timm_teacher
    teacher = tmp_path / "teacher.pth"
    make_timm_teacher(teacher)
    head = ["convert", "--weights", str(teacher), "--model", MODEL, "--model-kwargs",
            *[f"{k}={v}" for k, v in TINY.items()], "--set", "epochs=2", "steps_per_epoch=2", "batch_size=16",
            "threads=1", "convert.transfer_batch_size=16"]
    assert simattn_main([*head, "--grad-accum-steps", "2", "--model-ema", "--output", str(tmp_path / "flags")]) == 0
    assert simattn_main([*head, "grad_accum_steps=2", "model_ema=true", "--output", str(tmp_path / "set")]) == 0
    for stage in ("transfer", "distill"):
        a, b = (load_checkpoint(tmp_path / form / stage / "last.pth") for form in ("flags", "set"))
        assert a["global_step"] == b["global_step"] == 2 and a["config"]["grad_accum_steps"] == 2
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), stage
    # stage 2 keeps an EMA as asked; stage 1 trains only the attention blocks, without one
    assert "model_ema" in load_checkpoint(tmp_path / "set" / "distill" / "last.pth")
    assert "model_ema" not in load_checkpoint(tmp_path / "set" / "transfer" / "last.pth")


def test_commands_that_write_take_output_and_keep_out_as_its_alias():
    from simattn.viz.cli import build_parser as viz_parser
    for parser, head in ((viz_parser(), []), (detect_parser(), ["shapes"])):
        assert parser.parse_args([*head, "--output", "a"]).output == "a"
        assert parser.parse_args([*head, "--out", "b"]).output == "b"
