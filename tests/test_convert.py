"""simattn convert: a timm-layout DeiT becomes a SimA model (teacher weights copied, stage 1 trains only the attention
blocks on the teacher's inputs, stage 2 distills), with a report; kinds that do not keep the layout are refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from simattn.attention.sima import SimAAttention
from simattn.cli import main as simattn_main
from simattn.convert import build_student, check_kind, convert, convertible_kinds, load_convert_recipe, load_teacher
from simattn.convert.student import attention_modules
from simattn.convert.trainers import TransferTrainer, distill_loss, transfer_parameters
from simattn.models.factory import model_spec_from_weights
from simattn.validate import validate_weights
from simattn.engine.dist import DistInfo

MODEL = "sima_deit_tiny_patch16_224"
TINY = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10}
FAST = {"epochs": 2, "steps_per_epoch": 2, "batch_size": 32, "threads": 1, "device": "cpu", "log_interval": 1,
        "convert": {"transfer_batch_size": 32}}


def make_timm_teacher(path: Path, seed: int = 0) -> torch.nn.Module:
    """A small DeiT of timm's own class, saved as a bare timm-layout state dict."""
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(seed)
    net = VisionTransformer(**TINY).eval()
    torch.save(net.state_dict(), path)
    return net


@pytest.fixture(scope="module")
def timm_teacher(tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher") / "deit_tiny_timm.pth"
    return path, make_timm_teacher(path)


def test_teacher_from_timm_weights_is_the_timm_network(timm_teacher):
    path, net = timm_teacher
    teacher, spec = load_teacher(path, MODEL, TINY)
    assert spec["attn_type"] == "softmax" and not any(p.requires_grad for p in teacher.parameters())
    x = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(teacher(x), net(x), rtol=1e-5, atol=1e-5)


def test_student_keeps_every_teacher_tensor_and_swaps_the_attention(timm_teacher):
    path, net = timm_teacher
    _, spec = load_teacher(path, MODEL, TINY)
    student, kwargs, report = build_student(spec, "sima", init_from=path)
    assert kwargs["attn_type"] == "sima" and not report.missing and not report.reset
    own = student.state_dict()
    for key, value in net.state_dict().items():
        assert torch.equal(own[key], value), key
    assert [type(m) for _, m in attention_modules(student)] == [SimAAttention] * TINY["depth"]
    # a kind with a parameter of its own (XCA's temperature) starts it fresh; every other tensor is the teacher's
    xca, _, report = build_student(spec, "xca", init_from=path)
    assert report.missing == [f"blocks.{i}.attn.temperature" for i in range(TINY["depth"])]


def test_kinds_without_the_qkv_proj_layout_are_refused(timm_teacher, capsys):
    assert "sima" in convertible_kinds() and "soft" not in convertible_kinds()
    with pytest.raises(ValueError, match=r"--to soft: .* allowed: .*sima") as e:
        check_kind("soft")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown attention 'nope'"):
        check_kind("nope")
    path, _ = timm_teacher
    code = simattn_main(["convert", "--weights", str(path), "--model", MODEL, "--to", "soft"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("simattn convert: error: --to soft") and err.count("\n") == 1


def test_transfer_parameters_are_the_attention_blocks_only(timm_teacher):
    path, _ = timm_teacher
    _, spec = load_teacher(path, MODEL, TINY)
    student, _, _ = build_student(spec, "xca", init_from=path)
    names = transfer_parameters(student, ["qkv", "proj"])
    trainable = {n for n, p in student.named_parameters() if p.requires_grad}
    assert set(names) == trainable
    expected = {f"blocks.{i}.attn.{p}" for i in range(TINY["depth"])
                for p in ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "temperature")}
    assert trainable == expected
    with pytest.raises(ValueError, match="transfer_params"):
        transfer_parameters(student, ["mlp"])


def test_distill_loss_is_tau_squared_kl():
    s, t = torch.randn(4, 10), torch.randn(4, 10)
    p_t = torch.softmax(t / 2, -1)
    manual = (p_t * (p_t.log() - torch.log_softmax(s / 2, -1))).sum(-1).mean() * 4
    torch.testing.assert_close(distill_loss(s, t, 2.0), manual)
    assert float(distill_loss(t, t, 2.0)) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("target", ["attention", "block"])
def test_transfer_loss_matches_each_layer_to_the_teachers(timm_teacher, tmp_path, one_thread, target):
    """attention: each student attention layer on the teacher's layer input; block: each student block on the
    student's own stream, against the teacher's block output."""
    path, _ = timm_teacher
    cfg = load_convert_recipe("convert_digits", {**FAST, "output": str(tmp_path / "t"), "model": MODEL,
                                                 "model_kwargs": TINY}).stage_config()
    teacher, spec = load_teacher(path, MODEL, TINY)

    def factory(c, n):
        net, kwargs, _ = build_student(spec, "sima", num_classes=n, init_from=path)
        return net, kwargs

    trainer = TransferTrainer(cfg, DistInfo(), teacher=teacher, model_factory=factory, metadata={},
                              target=target).build()
    student = trainer.model
    # move the student's attention away from the teacher's so that the loss is not zero
    with torch.no_grad():
        for _, attn in attention_modules(student):
            attn.qkv.weight.mul_(1.5)
    images = torch.randn(4, 3, 16, 16)

    def run_recording(net, modules):
        inputs, outputs = [], []

        def record(module, args, output):
            inputs.append(args[0])
            outputs.append(output)

        hooks = [m.register_forward_hook(record) for m in modules]
        with torch.no_grad():
            net(images)
        for h in hooks:
            h.remove()
        return inputs, outputs

    def rel(a, b):
        return (a - b).pow(2).mean() / b.pow(2).mean()

    with torch.no_grad():
        if target == "attention":
            t_in, t_out = run_recording(teacher, [m for _, m in attention_modules(teacher)])
            expected = torch.stack([rel(attn(x), y) for (_, attn), x, y in
                                    zip(attention_modules(student), t_in, t_out)]).mean()
        else:
            _, t_out = run_recording(teacher, list(teacher.blocks))
            _, s_out = run_recording(student, list(student.blocks))
            expected = torch.stack([rel(a, b) for a, b in zip(s_out, t_out)]).mean()
        assert float(expected) > 1e-6  # far above rounding: the two networks differ
        for _ in range(2):  # the same on every call
            got = trainer.compute_loss(images, torch.zeros(4, dtype=torch.long))
            torch.testing.assert_close(got, expected)
        # outside the loss the hooks are idle: the student is its own network again
        reference, _, _ = build_student(spec, "sima", init_from=path)
        reference.load_state_dict(student.state_dict())
        torch.testing.assert_close(student(images), reference.eval()(images))


def _convert_tiny(teacher_path: Path, out: Path, **extra):
    overrides = {**FAST, "output": str(out), **extra}
    overrides["convert"] = {**FAST["convert"], **extra.get("convert", {})}
    return convert(load_convert_recipe("convert_digits", overrides), str(teacher_path), MODEL, TINY)


def test_convert_timm_deit_end_to_end_with_baselines(timm_teacher, tmp_path, one_thread):
    path, net = timm_teacher
    out = tmp_path / "conv"
    results = _convert_tiny(path, out, convert={"compare": True})
    final = out / "final.safetensors"
    # the converted model is a SimA model that names its attention and its teacher, and validate reproduces it
    spec = model_spec_from_weights(final)
    assert spec["model"] == MODEL and spec["config"]["attn_type"] == "sima"
    assert spec["extra"]["attention"] == "sima" and spec["extra"]["teacher"] == str(path)
    assert spec["producer"] == "simattn convert"
    check = validate_weights(final, dataset="digits", device="cpu")
    assert check["top1"] == pytest.approx(results["final"]["top1"])
    # stage 1 changed the attention blocks and nothing else
    teacher_sd = net.state_dict()
    stage1 = load_file(out / "transfer" / "final.safetensors")
    for key, value in teacher_sd.items():
        if ".attn.qkv." in key or ".attn.proj." in key:
            assert not torch.equal(stage1[key], value), key
        else:
            assert torch.equal(stage1[key], value), key
    stage2 = load_file(final)
    assert not torch.equal(stage2["head.weight"], stage1["head.weight"])
    # the report: every row, the curves, the JSON
    saved = json.loads((out / "results.json").read_text())
    assert saved["final"]["top1"] == pytest.approx(results["final"]["top1"])
    assert saved["transfer"]["epochs"] == 1 and saved["distill"]["epochs"] == 1
    assert saved["finetune"]["epochs"] == 2 and saved["scratch"]["epochs"] == 2
    report = (out / "report.md").read_text()
    for row in ("teacher (softmax)", "zero-shot", "after stage 1", "after stage 2", "plain fine-tuning",
                "from scratch"):
        assert row in report, row
    assert (out / "convert.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second conversion into the same folder is refused unless resumed or overwritten
    with pytest.raises(ValueError, match="already holds files"):
        _convert_tiny(path, out)


def test_recipe_options_are_checked():
    with pytest.raises(ValueError, match="convert.transfer_epochs"):
        load_convert_recipe("convert_digits", {"convert": {"transfer_epochs": 2}, "epochs": 2})
    with pytest.raises(ValueError, match="unknown key 'convert.lr'"):
        load_convert_recipe("convert_digits", {"convert": {"lr": 1}})
    with pytest.raises(ValueError, match="distill_alpha"):
        load_convert_recipe("convert_digits", {"convert": {"distill_alpha": 2}})
    cfg = load_convert_recipe("convert_deit_small_imagenet")
    assert cfg.dataset == "imagenet" and cfg.convert.to == "sima" and cfg.convert.transfer_epochs < cfg.epochs


def test_convert_reads_packed_shards(timm_teacher, tmp_path, capsys, one_thread):
    path, _ = timm_teacher
    shards = tmp_path / "shards"
    for split in ("train", "val"):
        assert simattn_main(["data", "pack", "--dataset", "digits", "--split", split, "--output", str(shards),
                             "--shard-samples", "500"]) == 0
    out = tmp_path / "conv"
    kwargs = [f"{k}={v}" for k, v in TINY.items()]
    code = simattn_main(["convert", "--weights", str(path), "--model", MODEL, "--model-kwargs", *kwargs,
                         "--to", "sima", "--dataset", "wds", "--data-dir", str(shards), "--epochs", "2",
                         "--steps-per-epoch", "2", "--batch-size", "32", "--threads", "1", "--device", "cpu",
                         "--workers", "2", "--set", "convert.transfer_batch_size=32", "--output", str(out)])
    assert code == 0, capsys.readouterr().err[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["transfer"]["epochs"] == 1 and results["distill"]["epochs"] == 1
    assert 0 <= results["final"]["top1"] <= 100 and results["final"]["samples"] == 359
    # the converted weights score the same on the shards and on the embedded digits they were packed from
    on_shards = validate_weights(out / "final.safetensors", dataset="wds", data_dir=str(shards), device="cpu")
    assert on_shards["top1"] == pytest.approx(validate_weights(out / "final.safetensors", dataset="digits",
                                                                device="cpu")["top1"])
