"""simattn train / validate: recipes, options, data errors, a short real training run, and validation of its weights."""
from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import simattn  # noqa: F401  (registers the models)
from simattn.train import TrainConfig, load_config, list_recipes, scaled_lr, train
from simattn.validate import validate_weights
from simattn.cli import main as simattn_main
from simattn.train import cli as train_cli
from simattn import validate as validate_mod
from simattn.classify.task import build_model, build_optimizer, build_scheduler
from simattn.utils.io import read_safetensors_metadata
from simattn.utils.recipe import recipe_from_args

REPO = Path(__file__).resolve().parents[1]

# A model small enough to learn something from the digits in a few dozen CPU updates
TINY = dict(
    model="sima_deit_tiny_patch16_224",
    model_kwargs={"img_size": 16, "patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 4,
                  "global_pool": "avg", "class_token": False},
    dataset="digits", img_size=16, interpolation="bilinear", crop_pct=1.0, batch_size=32, scale=[1.0, 1.0],
    hflip=0.0, color_jitter=0.0, smoothing=0.0, lr=2e-3, warmup_epochs=0, sched_on_updates=True, clip_grad=None,
    threads=1, device="cpu", log_interval=10, seed=0,
)


def tiny_config(tmp_path: Path, **overrides):
    return load_config(None, {**TINY, "output": str(tmp_path / "run"), **overrides})


# ---------------------------------------------------------------- options and recipes
def test_recipe_and_command_line_overrides():
    args = train_cli.build_parser().parse_args(
        ["-c", "digits_cpu", "--epochs", "3", "--model-kwargs", "depth=2", "attn_kwargs.order=kv_first",
         "--lr", "1e-3", "--resume", "--output", "runs/x", "--no-model-ema", "--scale", "[0.5, 1.0]",
         "--set", "seed=7", "hflip=0.25"])
    cfg = recipe_from_args(TrainConfig, args)
    assert cfg.epochs == 3 and cfg.lr == 1e-3 and cfg.resume == "auto" and cfg.model_ema is False
    assert cfg.scale == [0.5, 1.0] and (cfg.seed, cfg.hflip) == (7, 0.25)
    assert cfg.model_kwargs["attn_kwargs"] == {"order": "kv_first"}
    # model_kwargs merge into the recipe's instead of replacing them
    assert cfg.model_kwargs["depth"] == 2 and cfg.model_kwargs["attn_type"] == "sima"
    assert cfg.model_kwargs["embed_dim"] == load_config("digits_cpu").model_kwargs["embed_dim"]


def test_bad_options_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown key 'epoch' .*did you mean 'epochs'"):
        load_config("digits_cpu", {"epoch": 3})
    with pytest.raises(ValueError, match="option 'batch_size': got 'many'; allowed: an integer >= 1"):
        load_config(None, {"batch_size": "many"})
    with pytest.raises(ValueError, match="option 'grad_accum_steps': got 0; allowed: an integer >= 1"):
        load_config(None, {"grad_accum_steps": 0})
    with pytest.raises(FileNotFoundError, match="'no_such_recipe' is neither a file nor a shipped recipe"):
        load_config("no_such_recipe")
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochs: 2\nlearning_rate: 0.1\n")
    with pytest.raises(ValueError, match="unknown key 'learning_rate'.*in recipe"):
        load_config(str(bad))
    # the command line reports them as one line and exit status 2
    assert simattn_main(["train", "-c", "digits_cpu", "--epochs", "0"]) == 2


def test_learning_rate_follows_the_global_batch():
    deit = load_config("sima_deit_small")
    assert scaled_lr(deit, world_size=8) == pytest.approx(1e-3)  # 5e-4 x 1024/512
    assert scaled_lr(deit, world_size=2) == pytest.approx(2.5e-4)
    accum = load_config("sima_deit_small", {"grad_accum_steps": 2})
    assert scaled_lr(accum, world_size=4) == pytest.approx(1e-3)
    assert scaled_lr(load_config("soft_tiny"), world_size=8) == pytest.approx(1e-3)  # 1e-3 x 1024/1024
    assert scaled_lr(load_config("relu_vit_small_patch16"), world_size=8) == pytest.approx(1e-3)  # 1e-3 x 4096/4096
    assert scaled_lr(load_config("digits_cpu"), world_size=8) == load_config("digits_cpu").lr  # absolute lr wins


def test_paper_recipes_state_the_published_values():
    deit, xcit = load_config("sima_deit_small"), load_config("sima_small_12_p16")
    for cfg in (deit, xcit):
        assert (cfg.opt, cfg.lr_base, cfg.lr_base_size, cfg.weight_decay, cfg.opt_eps) == ("adamw", 5e-4, 512, 0.05, 1e-8)
        assert (cfg.sched, cfg.warmup_epochs, cfg.warmup_lr, cfg.min_lr, cfg.drop_path) == ("cosine", 5, 1e-6, 1e-5, 0.05)
        assert (cfg.aa, cfg.color_jitter, cfg.interpolation, cfg.reprob) == ("rand-m9-mstd0.5-inc1", 0.4, "bicubic", 0.25)
        assert (cfg.mixup, cfg.cutmix, cfg.smoothing, cfg.aug_repeats) == (0.8, 1.0, 0.1, 3)
        assert (cfg.model_ema, cfg.model_ema_decay, cfg.amp, cfg.amp_dtype) == (True, 0.99996, True, "float16")
        assert (cfg.batch_size * 8, cfg.img_size, cfg.crop_pct) == (1024, 224, 1.0)
    assert (deit.model, deit.epochs) == ("sima_deit_small_patch16_224", 300)
    assert (xcit.model, xcit.epochs) == ("sima_small_12_p16", 400)
    assert load_config("sima_deit_small_1head").model_kwargs == {"num_heads": 1}
    assert load_config("sima_deit_small_relu").model_kwargs == {"act_layer": "relu"}


def test_repo_configs_are_links_to_the_shipped_recipes():
    # configs/ holds only links into the package, so every recipe ships in the wheel and none exists twice
    package = REPO / "src/simattn/configs"
    repo_entries = sorted((REPO / "configs").iterdir())
    assert {p.name for p in repo_entries} == {p.name for p in package.glob("*.yaml")}
    for entry in repo_entries:
        assert entry.is_symlink(), f"configs/{entry.name} is a file of its own, not a link into the package"
        assert entry.resolve() == (package / entry.name).resolve()


@pytest.mark.parametrize("recipe", list_recipes(TrainConfig))
def test_every_recipe_builds_its_model_optimizer_and_schedule(recipe):
    cfg = load_config(recipe)
    assert timm.is_model(cfg.model), f"recipe {recipe} names an unregistered model {cfg.model}"
    num_classes = cfg.num_classes or (10 if cfg.dataset == "digits" else 1000)
    with torch.device("meta"):  # shapes only: full-size models build in a fraction of a second
        model, kwargs = build_model(cfg, num_classes)
    assert kwargs["num_classes"] == num_classes and model.get_classifier().out_features == num_classes
    optimizer, lr = build_optimizer(cfg, model, world_size=8)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    assert optimizer.param_groups[0]["lr"] > 0 and lr == scaled_lr(cfg, 8)
    scheduler, epochs = build_scheduler(cfg, optimizer, updates_per_epoch=100)
    assert epochs == cfg.epochs + cfg.cooldown_epochs
    if cfg.warmup_epochs:  # the schedule starts at warmup_lr and reaches the scaled lr after warmup
        assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.warmup_lr)
        if cfg.sched_on_updates:
            scheduler.step_update(int(cfg.warmup_epochs * 100))
        else:
            scheduler.step(int(cfg.warmup_epochs))
        # the cosine counts the warmup as part of the schedule, so the peak is a hair below the scaled lr
        assert 0.95 * lr <= optimizer.param_groups[0]["lr"] <= lr * (1 + 1e-9)


# ---------------------------------------------------------------- a real (short) run
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    cfg = tiny_config(tmp, epochs=2, steps_per_epoch=30)
    return train(cfg), cfg


def test_short_run_learns_and_writes_its_files(trained):
    result, cfg = trained
    summary, out = result.summary, result.output
    assert summary["updates"] == 60 and summary["final"]["samples"] == 359
    assert summary["final"]["top1"] > 25.0, f"chance is 10%, got {summary['final']['top1']:.1f}%"
    assert summary["history"][1]["train_loss"] < summary["history"][0]["train_loss"]
    for name in ("last.pth", "best.safetensors", "final.safetensors", "metrics.jsonl", "summary.json", "config.yaml",
                 "summary.csv"):
        assert (out / name).is_file(), name
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["type"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    assert epochs[-1]["val_top1"] == pytest.approx(summary["final"]["top1"])
    assert any(r["type"] == "step" for r in records)
    meta = read_safetensors_metadata(out / "final.safetensors")
    assert meta["model"] == cfg.model
    assert json.loads(meta["config"]) == {**cfg.model_kwargs, "num_classes": 10}
    rebuilt = timm.create_model(meta["model"], **json.loads(meta["config"]))
    assert sum(p.numel() for p in rebuilt.parameters()) == summary["params"]


def test_validate_reproduces_the_training_accuracy(trained, tmp_path, capsys):
    result, cfg = trained
    out = result.output
    final = validate_weights(out / "final.safetensors")  # model, kwargs and preprocessing from the metadata
    assert final["top1"] == pytest.approx(result.summary["final"]["top1"], abs=1e-9)
    assert final["loss"] == pytest.approx(result.summary["final"]["loss"], rel=1e-5)
    best = validate_weights(out / "best.safetensors")
    assert best["top1"] == pytest.approx(result.summary["best"]["top1"], abs=1e-9)
    # the train state works too, and the command line writes JSON
    json_out = tmp_path / "val.json"
    assert validate_mod.main(["--weights", str(out / "last.pth"), "--output", str(json_out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json_out.read_text())
    assert printed["top1"] == pytest.approx(final["top1"], abs=1e-9)
    # another resolution and crop ratio: the model adapts (dynamic image size), the numbers are reported as such
    other = validate_weights(out / "final.safetensors", img_size=32, crop_pct=0.875)
    assert (other["img_size"], other["crop_pct"], other["samples"]) == (32, 0.875, 359)


def test_validate_errors_are_one_line(trained, tmp_path, capsys):
    out = trained[0].output
    with pytest.raises(ValueError, match=r"has 5 classes but dataset 'digits' has 10|head.weight \(10, 64\) vs "
                                         r"\(5, 64\)"):
        validate_weights(out / "final.safetensors", model_kwargs={"num_classes": 5}, dataset="digits")
    assert simattn_main(["validate", "--weights", str(tmp_path / "nope.safetensors")]) == 2
    assert "not found" in capsys.readouterr().err
    assert simattn_main(["validate", "--weights", str(out / "final.safetensors"), "--use-ema"]) == 2
    assert "no EMA weights" in capsys.readouterr().err


def test_an_existing_run_is_not_overwritten_by_accident(trained):
    result, cfg = trained
    with pytest.raises(ValueError, match="already holds files .*pass --resume to continue it"):
        train(load_config(None, {**TINY, "output": str(result.output), "epochs": 1}))


def test_precision_and_memory_options_run(tmp_path, monkeypatch):
    # bf16 autocast, gradient accumulation, gradient checkpointing, channels_last, EMA and mixup in one short run
    from simattn.engine import amp
    monkeypatch.setattr(amp, "cpu_has_native", lambda dtype: True)  # bf16 autocast even where the CPU emulates it
    cfg = tiny_config(tmp_path, epochs=1, steps_per_epoch=2, amp=True, amp_dtype="bfloat16", grad_accum_steps=2,
                      grad_checkpointing=True, channels_last=True, model_ema=True, model_ema_decay=0.9,
                      mixup=0.8, cutmix=1.0, clip_grad=1.0)
    result = train(cfg)
    assert result.summary["updates"] == 2 and np.isfinite(result.summary["final"]["loss"])
    assert result.summary["ema"] is not None and (result.output / "final_ema.safetensors").is_file()
    ema_weights = result.ema.state_dict()
    assert not all(torch.equal(v, result.model.state_dict()[k]) for k, v in ema_weights.items())


def test_fp16_loss_scaling_runs(tmp_path, monkeypatch):
    from simattn.engine import amp
    monkeypatch.setattr(amp, "cpu_has_native", lambda dtype: True)  # as on a CPU with fp16 arithmetic
    cfg = tiny_config(tmp_path, epochs=1, steps_per_epoch=2, amp=True, amp_dtype="float16", clip_grad=1.0)
    result = train(cfg)
    state = torch.load(result.output / "last.pth", weights_only=True)
    assert state["scaler"] is not None and "scale" in state["scaler"]


@pytest.mark.parametrize("dtype, has_bf16", [("float16", False), ("float16", True), ("bfloat16", False)])
def test_amp_recipe_on_cpu_without_its_arithmetic_runs_fp32_with_a_note(tmp_path, monkeypatch, capsys, dtype,
                                                                        has_bf16):
    # emulated fp16 / bf16 autocast made an ImageNet recipe's digits epoch take hours on a CPU
    from simattn.engine import amp
    monkeypatch.setattr(amp, "cpu_has_native", lambda dt: has_bf16 and dt == "bfloat16")
    half = []  # every autocast entered in half precision: training steps and evaluations alike
    real = torch.autocast

    def recording(device_type, dtype=None, enabled=True, **kw):
        in_effect = dtype if dtype is not None else torch.get_autocast_dtype(device_type)  # autocast's own default
        if enabled and in_effect in (torch.float16, torch.bfloat16):
            half.append((device_type, in_effect))
        return real(device_type, dtype=dtype, enabled=enabled, **kw)

    monkeypatch.setattr(torch, "autocast", recording)
    cfg = tiny_config(tmp_path, epochs=1, steps_per_epoch=2, amp=True, amp_dtype=dtype)
    result = train(cfg)
    notes = [line for line in capsys.readouterr().out.splitlines() if "arithmetic is emulated" in line]
    assert len(notes) == 1 and f"amp {dtype} on a CPU" in notes[0] and "running in fp32" in notes[0]
    assert ("--amp-dtype bfloat16" in notes[0]) == has_bf16
    assert half == []
    assert torch.load(result.output / "last.pth", weights_only=True)["scaler"] is None


def test_run_precision_keeps_what_the_device_does_natively(monkeypatch):
    from simattn.engine import amp
    monkeypatch.setattr(amp, "cpu_has_native", lambda dtype: False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert amp.run_precision(cuda, True, "float16") == (True, "float16", None)
    assert amp.run_precision(cuda, True, "bfloat16") == (True, "bfloat16", None)
    assert amp.run_precision(cpu, False, "float16") == (False, "float16", None)
    assert amp.run_precision(cpu, True, "float16")[:2] == (False, "float16")
    assert amp.run_precision(cpu, True, "bfloat16")[:2] == (False, "bfloat16")
    monkeypatch.setattr(amp, "cpu_has_native", lambda dtype: dtype == "float16")
    assert amp.run_precision(cpu, True, "float16") == (True, "float16", None)
    assert amp.run_precision(cpu, True, "bfloat16")[:2] == (False, "bfloat16")
    monkeypatch.setattr(amp, "cpu_has_native", lambda dtype: dtype == "bfloat16")
    assert amp.run_precision(cpu, True, "bfloat16") == (True, "bfloat16", None)


# ---------------------------------------------------------------- datasets
def _write_folder(root: Path, split: str, per_class: int = 4, corrupt: int = 0) -> None:
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        d = root / split / c
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(d / f"{i}.png")
    for i in range(corrupt):
        (root / split / "cat" / f"broken{i}.jpg").write_bytes(b"this is not a jpeg")


def test_image_folder_skips_and_counts_unreadable_images(tmp_path, caplog):
    root = tmp_path / "imgs"
    _write_folder(root, "train", per_class=4, corrupt=1)  # 9 files, one unreadable
    _write_folder(root, "val", per_class=2, corrupt=1)  # 5 files, one unreadable
    cfg = tiny_config(tmp_path, dataset="folder", data_dir=str(root), batch_size=9, epochs=1)
    with caplog.at_level(logging.WARNING, logger="simattn.data.folder"):
        result = train(cfg)
    assert result.summary["skipped_unreadable"] == {"train": 1, "val": 1}
    assert result.summary["final"]["samples"] == 4
    assert any("skipping unreadable image" in r.getMessage() and "broken0.jpg" in r.getMessage()
               for r in caplog.records)


def test_dataset_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="option 'dataset': got 'imagenet22k'; allowed: one of digits, folder"):
        train(tiny_config(tmp_path, dataset="imagenet22k"))
    with pytest.raises(FileNotFoundError, match="image folder not found"):
        train(tiny_config(tmp_path, dataset="folder", data_dir=str(tmp_path / "missing")))
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="is empty: expected one sub-folder per class"):
        train(tiny_config(tmp_path, dataset="folder", data_dir=str(tmp_path / "empty")))
    (tmp_path / "noimg" / "train" / "a").mkdir(parents=True)
    (tmp_path / "noimg" / "train" / "a" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="holds no images"):
        train(tiny_config(tmp_path, dataset="folder", data_dir=str(tmp_path / "noimg")))
    _write_folder(tmp_path / "nosplit", "train")
    with pytest.raises(FileNotFoundError, match="has no 'val' split folder"):
        train(tiny_config(tmp_path, dataset="folder", data_dir=str(tmp_path / "nosplit")))
    with pytest.raises(FileNotFoundError, match="cifar10: .*cifar-10-batches-py not found"):
        train(tiny_config(tmp_path, dataset="cifar10", data_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="needs a data directory"):
        train(tiny_config(tmp_path, dataset="cifar100"))
    with pytest.raises(ValueError, match="num_classes=100 does not match dataset 'digits', which has 10 classes"):
        train(tiny_config(tmp_path, num_classes=100))
    assert not (tmp_path / "run").exists()  # nothing was written by the failed runs


def test_cifar_pickle_files_are_read_without_download(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as tv_cifar

    from simattn.data.factory import create_dataset
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 9]}
        (folder / name).write_bytes(pickle.dumps(entry))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    # torchvision checks the published md5 sums, which these stand-in files cannot match
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)
    train_set = create_dataset("cifar10", folder, "train")  # the unpacked folder itself works too
    val_set = create_dataset("cifar10", tmp_path, "val")
    assert (len(train_set), len(val_set), len(train_set.classes)) == (20, 4, 10)
    img, label = val_set[3]
    assert img.size == (32, 32) and label == 9


# ---------------------------------------------------------------- the reproducible data stream
def test_resumed_sampler_replays_the_rest_of_the_epoch_and_augmentations_are_seeded():
    from timm.data.distributed_sampler import RepeatAugSampler

    from simattn.data import DigitsDataset
    from simattn.engine.data import ResumableSampler, SeededSamples
    from simattn.classify.transforms import build_transform

    cfg = load_config(None, {"scale": [0.1, 1.0], "hflip": 0.5})  # strong enough to tell draws apart on 8x8 images
    data_config = {"input_size": [3, 16, 16], "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3,
                   "crop_pct": 1.0}
    dataset = DigitsDataset("train", transform=build_transform(data_config, cfg, is_training=True))
    order = RepeatAugSampler(dataset, num_replicas=1, rank=0, num_repeats=3)
    full, resumed = ResumableSampler(order, seed=5, rank=0), ResumableSampler(order, seed=5, rank=0)
    full.set_epoch(2)
    resumed.set_epoch(2, start=96)
    everything = list(full)
    assert list(resumed) == everything[96:] and len(resumed) == len(everything) - 96
    # repeated augmentation: the three copies of an image get three different augmentations
    (i0, s0), (i1, s1), (i2, s2) = everything[:3]
    assert i0 == i1 == i2 and len({s0, s1, s2}) == 3
    samples = SeededSamples(dataset)
    rng_before = torch.get_rng_state()
    a, b, again = samples[(i0, s0)][0], samples[(i1, s1)][0], samples[(i0, s0)][0]
    assert torch.equal(a, again) and not torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global RNG (drop-path, mixup) is left alone
    full.set_epoch(3)
    assert list(full) != everything  # a new epoch, a new order


def test_repeated_augmentation_and_workers_train(tmp_path):
    cfg = tiny_config(tmp_path, epochs=1, steps_per_epoch=2, aug_repeats=3, workers=1, scale=[0.6, 1.0])
    result = train(cfg)
    assert result.summary["updates"] == 2


def test_accumulated_micro_batches_make_the_update_of_their_whole_batch(tmp_path):
    """Two accumulated micro-batches of 16 give the update of one batch of their 32 images (plain SGD, no
    randomness left in the step): the loss of each micro-batch is divided by the number accumulated."""
    common = dict(epochs=1, steps_per_epoch=1, opt="momentum", momentum=0.0, weight_decay=0.0, sched="none",
                  drop_path=0.0, lr=0.5)
    whole = train(tiny_config(tmp_path / "whole", batch_size=32, **common))
    accum = train(tiny_config(tmp_path / "accum", batch_size=16, grad_accum_steps=2, **common))
    assert whole.summary["updates"] == accum.summary["updates"] == 1
    for name, value in whole.model.state_dict().items():
        torch.testing.assert_close(accum.model.state_dict()[name], value, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_evaluate_counts_top1_top5_and_the_mean_loss():
    """evaluate's sums against a direct count: the rank of the target among the classes, and the batch-mean loss."""
    import torch.nn.functional as F
    from torch import nn
    from simattn.classify.evaluation import evaluate
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 8, generator=g)
    target = torch.randint(0, 8, (64,), generator=g)
    batches = [(logits[:40], target[:40], 0), (logits[40:], target[40:], 3)]  # (images, labels, unreadable)
    got = evaluate(nn.Identity(), batches, torch.device("cpu"))
    above = (logits > logits.gather(1, target[:, None])).sum(1)  # classes scored above the target
    assert got["top1"] == pytest.approx(100 * (above == 0).double().mean().item())
    assert got["top5"] == pytest.approx(100 * (above < 5).double().mean().item())
    assert got["loss"] == pytest.approx(F.cross_entropy(logits.double(), target).item(), rel=1e-6)
    assert (got["samples"], got["skipped"]) == (64, 3)


def test_digits_splits_partition_the_data_with_a_fifth_of_each_class_held_out():
    from collections import Counter
    from simattn.data import DigitsDataset
    train_set, val_set, every = (DigitsDataset(split) for split in ("train", "val", "all"))

    def items(ds):
        return Counter((img.tobytes(), int(t)) for img, t in zip(ds.images, ds.targets))

    assert items(train_set) + items(val_set) == items(every)  # each image in exactly one split
    per_class, held_out = Counter(every.targets.tolist()), Counter(val_set.targets.tolist())
    assert len(per_class) == 10 and all(held_out[c] == round(0.2 * n) for c, n in per_class.items())


def test_img_size_alone_says_the_model_keeps_its_own_size(tmp_path, capsys):
    """--img-size sets the data's size; a model built without model_kwargs.img_size keeps its default, and the run
    says so with the kwarg that builds it at the data's size."""
    code = simattn_main(["train", "-c", "digits_cpu", "--model-kwargs", "img_size=null", "depth=1", "--img-size", "32",
                         "--max-updates", "1", "--epochs", "1", "--batch-size", "16", "--output", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "note: img_size sets the data's size (32 px); the model is built at its default 224 px" in out
    assert "--model-kwargs img_size=32" in out


def test_a_data_folder_given_relative_is_recorded_absolute(tmp_path, monkeypatch, capsys):
    """validate finds a run's data from another working folder: the record holds the folder's absolute path."""
    for split in ("train", "val"):
        for label, colour in (("a", (200, 30, 30)), ("b", (30, 30, 200))):
            folder = tmp_path / "work" / "imgs" / split / label
            folder.mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (16, 16), colour).save(folder / f"{i}.png")
    monkeypatch.chdir(tmp_path / "work")
    code = simattn_main(["train", "-c", "digits_cpu", "--dataset", "folder", "--data-dir", "imgs", "--model-kwargs",
                         "depth=1", "--max-updates", "1", "--epochs", "1", "--batch-size", "4", "--output", "run"])
    assert code == 0, capsys.readouterr().err
    assert read_safetensors_metadata(tmp_path / "work" / "run" / "final.safetensors")["data_dir"] == \
        str(tmp_path / "work" / "imgs")
    monkeypatch.chdir(tmp_path)
    assert simattn_main(["validate", "--weights", "work/run/final.safetensors"]) == 0, capsys.readouterr().err
