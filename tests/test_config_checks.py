"""A command's config, printed or run, passes the same checks: a recipe given to the wrong command names the right
one, ``--print-config`` refuses what the run would refuse, a flag and a ``--set`` item for one key follow the command
line's order, and a run shorter than its recipe's warm-up still reaches its peak lr and decays without a jump."""
from __future__ import annotations

import functools
from importlib import resources

import pytest
import torch
import yaml
from timm.scheduler import create_scheduler_v2

from simattn.classify.config import TrainConfig, load_config
from simattn.classify.task import train
from simattn.cli import main as simattn_main
from simattn.convert.config import ConvertConfig
from simattn.detect.config import DetectConfig
from simattn.engine.core import build_scheduler, run_warmup_epochs
from simattn.segment.config import SegmentConfig
from simattn.ssl.config import SslConfig
from simattn.train.cli import build_parser as train_parser
from simattn.utils.recipe import COMMAND_KEY, load_recipe, recipe_from_args, recipe_overrides

from cli_inputs import one_line_error

SCHEMAS = {"train": TrainConfig, "convert": ConvertConfig, "segment": SegmentConfig, "ssl train": SslConfig,
           "detect train": DetectConfig}

# the command typed, a shipped recipe of another command, the command that recipe is for
WRONG_COMMAND = [
    (["train"], "convert_digits", "convert"),
    (["train"], "seg_digits_cpu", "segment"),
    (["segment"], "digits_cpu", "train"),
    (["ssl", "train"], "detect_shapes_cpu", "detect train"),
    (["detect", "train"], "ssl_digits", "ssl train"),
    (["convert"], "seg_digits_cpu", "segment"),
]


@pytest.mark.parametrize("command,recipe,meant", WRONG_COMMAND, ids=[f"{' '.join(c)}-{r}" for c, r, _ in WRONG_COMMAND])
def test_a_recipe_given_to_another_command_names_the_right_one(capsys, command, recipe, meant):
    err = one_line_error(capsys, simattn_main([*command, "-c", recipe, "--print-config"]))
    assert f"configs/{recipe}.yaml is a `simattn {meant}` recipe, not a `simattn {' '.join(command)}` one; run " \
           f"`simattn {meant} -c {recipe}`" in err, err


def test_every_recipe_that_names_its_command_loads_under_it():
    shipped = resources.files("simattn") / "configs"
    marked = {}
    for entry in shipped.iterdir():
        data = yaml.safe_load(entry.read_text()) if entry.name.endswith(".yaml") else None
        if isinstance(data, dict) and COMMAND_KEY in data:
            marked[entry.name[:-5]] = data[COMMAND_KEY]
    assert {"digits_cpu", "convert_digits", "seg_digits_cpu", "ssl_digits", "detect_shapes_cpu"} <= set(marked)
    for name, command in marked.items():
        load_recipe(SCHEMAS[command], name)


def test_a_recipe_names_a_command_as_a_string(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("command: [train]\nepochs: 2\n")
    with pytest.raises(ValueError, match="'command' names the command the recipe is for"):
        load_recipe(TrainConfig, str(path))


# --print-config refuses, before printing, what the run refuses before building anything
NOT_RUNNABLE = [
    (["--model", "sima_deit_tiny"], "unknown model 'sima_deit_tiny': did you mean sima_deit_tiny_patch16_224"),
    (["--model-kwargs", "depth=0"], "option 'depth': got 0; allowed: an integer"),
    (["--dataset", "folder"], "dataset 'folder' is read from disk and needs a data directory: give --data-dir"),
]


@pytest.mark.parametrize("flags,message", NOT_RUNNABLE, ids=[" ".join(f) for f, _ in NOT_RUNNABLE])
def test_print_config_passes_the_checks_of_the_run(capsys, tmp_path, flags, message):
    code = simattn_main(["train", "-c", "digits_cpu", *flags, "--print-config"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if not line.startswith("note: ")]  # notes on dropped options stay
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert out == ""  # nothing printed before the error
    output = ["--output", str(tmp_path / "run")]
    config = recipe_from_args(TrainConfig, _train_parser().parse_args(["-c", "digits_cpu", *flags, *output]))
    with pytest.raises(ValueError, match=message.split(":")[0]):  # the run checks the same before any work
        train(config)
    assert not (tmp_path / "run").exists()


# the other tasks' recipes: their backbone and data are checked as train's model and data are
TASKS_NOT_RUNNABLE = [
    (["segment", "-c", "seg_digits_cpu", "--set", "model_kwargs.backbone=sima_deit_tin"],
     "unknown model 'sima_deit_tin': did you mean sima_deit_tiny_patch16_224"),
    (["segment", "-c", "seg_digits_cpu", "--set", "model_kwargs.depth=0"], "option 'depth': got 0"),
    (["ssl", "train", "-c", "ssl_digits", "--set", "model.name=sima_deit_tin"], "unknown model 'sima_deit_tin'"),
    (["ssl", "train", "-c", "ssl_digits", "--set", "model.kwargs.depth=0"], "option 'depth': got 0"),
    (["ssl", "train", "-c", "ssl_digits", "--set", "data.name=folder"],
     "data 'folder' is read from disk and needs its root: --set data.root=DIR"),
    (["detect", "train", "-c", "detect_shapes_cpu", "--set", "model.backbone=sima_deit_tin"],
     "unknown model 'sima_deit_tin'"),
    (["detect", "train", "-c", "detect_shapes_cpu", "--set", "model.backbone_kwargs.depth=0"],
     "option 'depth': got 0"),
]


@pytest.mark.parametrize("argv,message", TASKS_NOT_RUNNABLE, ids=[" ".join(a) for a, _ in TASKS_NOT_RUNNABLE])
def test_print_config_of_every_task_passes_the_checks_of_its_run(capsys, argv, message):
    code = simattn_main([*argv, "--print-config"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if not line.startswith("note: ")]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert out == ""


def test_a_recipe_that_leaves_the_data_to_the_command_line_still_loads():
    assert load_recipe(TrainConfig, "sima_deit_small").data_dir is None


@functools.lru_cache(maxsize=None)
def _train_parser():
    return train_parser()


def _given(argv):
    return recipe_overrides(TrainConfig, _train_parser().parse_args(argv))


def test_the_later_of_a_flag_and_a_set_item_wins():
    assert _given(["--set", "lr=0.1", "--lr", "0.2"])["lr"] == 0.2
    assert _given(["--lr", "0.2", "--set", "lr=0.1"])["lr"] == 0.1
    assert _given(["--model-ema", "--set", "model_ema=false"])["model_ema"] is False
    assert _given(["--model-kwargs", "depth=3", "--set", "model_kwargs.depth=2"])["model_kwargs"] == {"depth": 2}
    assert _given(["--set", "model_kwargs.depth=2", "--model-kwargs", "depth=3", "embed_dim=8"])["model_kwargs"] == \
        {"depth": 3, "embed_dim": 8}
    # a repeated flag: the last one, as argparse has it; different keys all apply
    assert _given(["--lr", "0.2", "--set", "epochs=3", "--lr", "0.3"]) == {"lr": 0.3, "epochs": 3}
    assert "later one" in _train_parser().format_help()


def _lrs(cfg: TrainConfig, updates_per_epoch: int):
    """The lr of every update of a run of ``cfg`` (and the one after its last)."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr)
    scheduler, epochs = build_scheduler(cfg, optimizer, updates_per_epoch)
    out = []
    for step in range(cfg.epochs * updates_per_epoch + 1):
        scheduler.step_update(step)
        out.append(optimizer.param_groups[0]["lr"])
    return epochs, out


@pytest.mark.parametrize("epochs", [1, 2, 3])
def test_a_run_shorter_than_its_warm_up_reaches_its_peak_and_decays_smoothly(epochs):
    cfg = load_config("digits_cpu", {"epochs": epochs})  # warmup_epochs 2, cosine per update
    total, lrs = _lrs(cfg, 23)
    peak = lrs.index(max(lrs))
    assert total == epochs and run_warmup_epochs(cfg) == epochs / 4
    assert max(lrs) == pytest.approx(cfg.lr, rel=0.01)  # the warm-up ends at the recipe's lr
    assert lrs[-1] == pytest.approx(cfg.min_lr)  # and the decay at min_lr
    assert lrs[:peak + 1] == sorted(lrs[:peak + 1]) and lrs[peak:] == sorted(lrs[peak:], reverse=True)
    # no step bigger than the warm-up's own (timm's overlapping warm-up dropped from 0.0019 to 1e-5 at the end)
    rise = (cfg.lr - cfg.warmup_lr) / (run_warmup_epochs(cfg) * 23)
    assert max(abs(a - b) for a, b in zip(lrs, lrs[1:])) <= rise * 1.001


def test_a_run_longer_than_four_warm_ups_keeps_timm_s_schedule():
    cfg = load_config("digits_cpu", {"epochs": 8})
    expected = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr)
    timm_scheduler, _ = create_scheduler_v2(expected, sched="cosine", num_epochs=8, warmup_epochs=2,
                                            warmup_lr=cfg.warmup_lr, min_lr=cfg.min_lr, step_on_epochs=False,
                                            updates_per_epoch=23)
    theirs = []
    for step in range(8 * 23 + 1):
        timm_scheduler.step_update(step)
        theirs.append(expected.param_groups[0]["lr"])
    assert _lrs(cfg, 23)[1] == theirs


def test_an_epoch_stepped_warm_up_is_shortened_in_whole_epochs():
    cfg = load_config("sima_deit_small", {"epochs": 6, "data_dir": "/data"})  # warm-up 5 epochs, stepped per epoch
    assert run_warmup_epochs(cfg) == 1
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler, epochs = build_scheduler(cfg, optimizer, 10)
    lrs = []
    for epoch in range(epochs):
        scheduler.step(epoch)
        lrs.append(optimizer.param_groups[0]["lr"])
    assert epochs == 6 and lrs[0] == cfg.warmup_lr and lrs[1] == pytest.approx(1.0)
    assert lrs[1:] == sorted(lrs[1:], reverse=True)
