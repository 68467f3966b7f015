"""A model asked for another attention kind, weights that fit a network only in part, and a model swapped into a
recipe made for another: each is built as meant, or refused in one true line before any work."""
from __future__ import annotations

import json
import logging

import pytest
import torch

import simattn  # noqa: F401  (registers the models)
from simattn.cli import main as simattn_main
from simattn.convert.student import build_student
from simattn.models.factory import create_model
from simattn.models.weights import save_weights, weights_metadata

#: the six newer kinds' DeiT models, each made for a kind with options of its own (or model options, sigmoid's)
NEWER = ["agent", "flatten", "inline", "slab", "polaformer", "sigmoid"]
TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2)
AGENT = dict(TINY, attn_kwargs={"agent_num": 4, "window": 4})


@pytest.mark.parametrize("family", NEWER)
@pytest.mark.parametrize("kind", ["softmax", "sima"])
def test_every_newer_model_takes_another_kind_and_says_what_fell_away(family, kind, caplog):
    name = f"{family}_deit_tiny_patch16_224"
    with caplog.at_level(logging.WARNING, logger="simattn.models"), torch.device("meta"):
        model = create_model(name, attn_type=kind, **TINY)
    assert {m.attn_name for m in model.modules() if hasattr(m, "attn_name")} == {kind}
    notes = [r.getMessage() for r in caplog.records]
    if family == "sigmoid":  # qk-LayerNorm and LayerScale are the model's, and stay
        assert not notes and model.blocks[0].attn.q_norm.__class__.__name__ == "LayerNorm"
    else:
        assert len(notes) == 1 and notes[0].startswith(f"note: {name} with attn_type={kind!r}: {family}'s own")


def test_options_the_kind_does_not_take_are_a_value_error_naming_them():
    with pytest.raises(ValueError, match=r"attention 'softmax' does not take option\(s\) agent_num; its own "
                                          r"options: fused"):
        create_model("agent_deit_tiny_patch16_224", attn_type="softmax", attn_kwargs={"agent_num": 4}, **TINY)
    with pytest.raises(ValueError, match=r"attention 'cosformer' does not take option\(s\) focusing"):
        create_model("cosformer_xcit_small_12_p16", attn_kwargs={"focusing": 2}, **dict(TINY, patch_size=8))


def test_the_token_layout_goes_to_every_kind_that_takes_it():
    # FLatten's key encoding is made for its grid; SLAB, another grid-linear kind, takes the same layout
    slab = create_model("flatten_deit_tiny_patch16_224", attn_type="slab", **TINY)
    attn = slab.blocks[0].attn
    assert attn.attn_name == "slab" and attn.pos_grid == (4, 4) and attn.num_prefix_tokens == 1
    flatten = create_model("flatten_deit_tiny_patch16_224", **TINY)
    # so FLatten's weights load whole (but for its own focusing scale)
    assert set(slab.state_dict()) == set(flatten.state_dict()) - {"blocks.0.attn.feature_scale"}
    assert attn.positional_encoding.shape == flatten.blocks[0].attn.positional_encoding.shape
    assert slab(torch.randn(2, 3, 16, 16)).shape == (2, 1000)


def test_convert_takes_an_agent_teacher_to_sima_leaving_the_agent_tensors_out(tmp_path):
    teacher = create_model("agent_deit_tiny_patch16_224", num_classes=3, **AGENT)
    path = tmp_path / "agent.safetensors"
    save_weights(teacher, path, weights_metadata("agent_deit_tiny_patch16_224", AGENT, producer="test",
                                                 num_classes=3))
    spec = {"model": "agent_deit_tiny_patch16_224", "config": dict(AGENT, num_classes=3)}
    student, kwargs, report = build_student(spec, "sima", init_from=path)
    assert kwargs["attn_type"] == "sima" and "attn_kwargs" not in kwargs
    assert report.unexpected and all(".attn." in k for k in report.unexpected) and not report.missing
    assert torch.equal(student.blocks[0].attn.qkv.weight, teacher.blocks[0].attn.qkv.weight)


def test_fewer_than_two_by_two_patches_is_refused_at_build_and_at_the_input():
    with pytest.raises(ValueError, match=r"img_size=16 makes 1x1 patch\(es\) of 16 px; .* img_size >= 32 or "
                                          r"patch_size <= 8"):
        create_model("sima_nano_12_p16", img_size=16)
    model = create_model("agent_deit_tiny_patch16_224", num_classes=2, **dict(AGENT, img_size=32, patch_size=8))
    with pytest.raises(ValueError, match=r"input size \(8, 8\) makes fewer than 2x2 patches of \(8, 8\) px"):
        model(torch.randn(1, 3, 8, 8))


def test_a_model_swapped_into_the_digit_recipe_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    code = simattn_main(["train", "-c", "digits_cpu", "--model", "agent_deit_tiny_patch16_224", "--output",
                         str(out)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and not out.exists()
    assert err[-1].startswith("simattn train: error: agent_deit_tiny_patch16_224: a 16 px input makes 1x1 patch(es) "
                              "of 16 px; the attention needs at least 2x2: feed at least 32 px (img_size)")


def test_a_grid_four_times_another_than_the_recipes_is_noted(capsys):
    code = simattn_main(["train", "-c", "digits_cpu", "--model", "sima_deit_small_patch16_224", "--img-size", "160",
                         "--print-config"])
    err = capsys.readouterr().err
    assert code == 0 and "note: sima_deit_small_patch16_224 makes 100 patch tokens of a 160 px input where recipe " \
                         "digits_cpu's sima_deit_tiny_patch16_224 makes 16" in err
    code = simattn_main(["train", "-c", "digits_cpu", "--model", "sima_deit_small_patch16_224", "--img-size", "64",
                         "--print-config"])
    assert code == 0 and "patch tokens" not in capsys.readouterr().err  # 16 tokens, as the recipe's


def _train(tmp_path, *extra: str) -> int:
    return simattn_main(["train", "-c", "digits_cpu", "--model", "agent_deit_tiny_patch16_224", "--model-kwargs",
                         "patch_size=4", "embed_dim=32", "depth=1", "num_heads=2", "attn_kwargs.agent_num=4",
                         "attn_kwargs.window=4", "--batch-size", "8", "--steps-per-epoch", "2", "--epochs", "1",
                         "--warmup-epochs", "0", "--output", str(tmp_path / "run"), *extra])


def test_a_partial_load_is_refused_unless_asked_for_and_then_counted(tmp_path, capsys):
    sima = create_model("sima_deit_tiny_patch16_224", num_classes=10, **TINY)
    weights = tmp_path / "sima.safetensors"
    save_weights(sima, weights, weights_metadata("sima_deit_tiny_patch16_224", TINY, producer="test",
                                                 num_classes=10))
    code = _train(tmp_path, "--initial-checkpoint", str(weights))
    err = capsys.readouterr().err.splitlines()  # the recipe's note that its model_kwargs were dropped, the error
    assert code == 2 and len(err) == 2 and err[0].startswith("note: --model") and "Traceback" not in err[1]
    assert "would leave 10 of the 30 tensors of agent_deit_tiny_patch16_224 at their initialization (first " \
           "missing: blocks.0.attn.agent_block_bias): give weights made for this network, or " \
           "--initial-checkpoint-partial to start" in err[1]
    assert not (tmp_path / "run").exists()
    assert _train(tmp_path, "--initial-checkpoint", str(weights), "--initial-checkpoint-partial") == 0
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["initial_weights"]
    assert (record["loaded"], record["missing"], record["partial"]) == (20, 10, True), record
    out = capsys.readouterr().out
    assert "loaded 20/30 tensors" in out and "agent_deit_tiny_patch16_224 (agent attention," in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["attention"] == "agent"
    # validate's JSON names the kind, from the model and from the weights record alike
    assert simattn_main(["validate", "--weights", str(tmp_path / "run" / "final.safetensors"), "--threads", "1",
                         "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["attention"] == "agent"


def test_list_names_every_kind_model_and_recipe_and_filters_as_timm(capsys):
    assert simattn_main(["list", "--json"]) == 0
    everything = json.loads(capsys.readouterr().out)
    assert len(everything["kinds"]) == 18 and {"sima", "agent", "polaformer", "xnorm"} <= \
        {k["name"] for k in everything["kinds"]}
    assert {"name": "agent_deit_tiny", "command": "train", "model": "agent_deit_tiny_patch16_224"} in \
        everything["recipes"]
    assert {"name": "relu_vit_small_patch16_224.in1k", "top1": "-", "input": 224, "license": "apache-2.0",
            "file": "-", "weights": "none published", "classes": 1000} in everything["pretrained"]
    # what a researcher picks by: the authors' top-1, the input size, the license and the file
    assert {"name": "slab_deit_tiny_patch16_224.in1k", "top1": 74.3, "input": 224, "license": "none stated",
            "file": "slab_deit_tiny.pth", "weights": "https://github.com/xinghaochen/SLAB/releases/download/ckpts/"
            "slab_deit_tiny.pth", "classes": 1000} in everything["pretrained"]
    assert simattn_main(["list", "pretrained", "slab_deit_tiny*"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["name", "top1", "input", "license", "file", "weights", "classes"]
    assert out[2].split()[:3] == ["slab_deit_tiny_patch16_224.in1k", "74.3", "224"]
    assert simattn_main(["list", "pretraind"]) == 2  # a misspelt section is not taken as a pattern
    assert "did you mean the section 'pretrained'" in capsys.readouterr().err
    assert simattn_main(["list", "models", "agent_deit*"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "models (2):" and [line.split()[0] for line in out[1:]] == [
        "agent_deit_small_patch16_224", "agent_deit_tiny_patch16_224"]
    assert simattn_main(["list", "slab_deit"]) == 0  # plain text matches anywhere, in every section
    out = capsys.readouterr().out
    assert "kinds (0):" in out and "models (2):" in out and "recipes (1):" in out and "pretrained (2):" in out
