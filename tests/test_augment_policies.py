"""The shipped recipes' training augmentation on real photos: the random resized crop, flips, timm's auto-augment
policy and random erasing (timm leaves color jitter out when a policy is set), drawn many times without an error
(Pillow 13 rejects the 0 bits that timm's posterize levels reach)."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
from timm.data.auto_augment import AugMixAugment, AutoAugment, RandAugment
from timm.models import get_pretrained_cfg
from torch import nn

import simattn  # noqa: F401  (registers the models)
from simattn.classify.config import TrainConfig, load_config
from simattn.classify.transforms import build_transform, data_config_for
from simattn.convert.config import ConvertConfig
from simattn.data.images import load_image
from simattn.detect.config import DetectConfig
from simattn.segment.config import SegmentConfig
from simattn.ssl.config import SslConfig
from simattn.utils.recipe import list_recipes, load_recipe

pytest.importorskip("skimage")  # the photos


def recipes_with_a_policy():
    """Every shipped recipe with an auto-augment policy, whatever its command (conversion stages train as `train`
    does), by name."""
    found = {}
    for schema in (TrainConfig, ConvertConfig, SslConfig, DetectConfig, SegmentConfig):
        for name in list_recipes(schema):
            cfg = load_recipe(schema, name)
            if getattr(cfg, "aa", None):
                found[name] = cfg
    return found


RECIPES = recipes_with_a_policy()
#: each distinct policy of those recipes, with the first recipe that names it
POLICIES = {}
for _name, _cfg in RECIPES.items():
    POLICIES.setdefault(_cfg.aa, _name)
SIZE = 32  # the crop the pipeline outputs: small, as the cost of an op hardly depends on it
POLICY_DRAWS = 100_000  # RandAugment draws in all, split evenly between the policies
PIPELINE_DRAWS = 50  # whole pipelines per recipe


@pytest.fixture(scope="module")
def photos():
    """Four real photos at 64 px (the crop's input, larger than its output as ImageNet's images are)."""
    return [load_image(f"skimage:{name}").resize((64, 64)) for name in ("astronaut", "coffee", "chelsea", "rocket")]


def training_transform(cfg: TrainConfig):
    """The recipe's training transform as a run builds it, with the model's data defaults (its pretrained_cfg) and
    a SIZE px crop."""
    model = nn.Module()  # data_config_for reads only the model's pretrained_cfg: no need to build the network
    model.pretrained_cfg = get_pretrained_cfg(cfg.model).to_dict()
    return build_transform(data_config_for(model, cfg, img_size=SIZE), cfg, is_training=True)


def augmentation(transform):
    """The one timm auto-augment step of a training Compose."""
    steps = [t for t in transform.transforms if isinstance(t, (RandAugment, AutoAugment, AugMixAugment))]
    assert len(steps) == 1, f"expected one auto-augment step in {transform}"
    return steps[0]


def ops_of(step):
    """The AugmentOps of an auto-augment step (AutoAugment holds them in sub-policies)."""
    return [op for sub in step.policy for op in sub] if isinstance(step, AutoAugment) else list(step.ops)


def seed(value: int) -> None:
    random.seed(value)  # timm's ops, crop and erasing
    np.random.seed(value)  # RandAugment's choice of ops
    torch.manual_seed(value)  # the flip, erasing's noise


class PillowOncePerArgument:
    """An AugmentOp's function that hands each distinct argument to Pillow once and returns the image as it came
    after that: whether Pillow accepts an op depends on its argument (and the image's mode), not on the pixels, and
    the lookup-table ops (posterize, solarize, equalize, autocontrast) cost 0.1 to 0.7 ms a call at any image size,
    which would make 100,000 draws last 20 s or more. timm's draw of the op, its magnitude noise and the argument
    computed from it run on every draw."""

    def __init__(self, fn):
        self.fn, self.seen = fn, set()

    def __call__(self, img, *args, **kwargs):
        if args in self.seen:
            return img
        out = self.fn(img, *args, **kwargs)
        self.seen.add(args)
        return out


def test_the_recipes_policies_draw_100000_times_without_an_error(photos):
    crops = [photo.resize((SIZE, SIZE)) for photo in photos]  # what RandAugment gets: the crop
    for i, (policy, recipe) in enumerate(sorted(POLICIES.items())):
        step = augmentation(training_transform(RECIPES[recipe]))
        for op in step.ops:
            op.aug_fn = PillowOncePerArgument(op.aug_fn)
        seed(i)
        for k in range(POLICY_DRAWS // len(POLICIES)):
            step(crops[k % len(crops)])
        assert all(op.aug_fn.seen for op in step.ops), f"{policy}: some ops were never drawn"
        if policy == "rand-m9-mstd0.5-inc1":
            # the magnitude noise reached 10, where timm asks for 0 bits (one posterize draw in 44), and it went
            # through
            posterize = next(op for op in step.ops if op.name == "PosterizeIncreasing")
            assert (0,) in posterize.aug_fn.seen, f"{policy}: the draws never reached posterize's 0-bit level"


# the recipes' policies, and one of each other kind timm builds (AutoAugment names Posterize at level 2: 0 bits)
SWEPT = sorted(POLICIES) + ["v0", "augmix-m5-w3-mstd0.5"]


@pytest.mark.parametrize("policy", SWEPT)
def test_every_op_of_a_policy_takes_every_magnitude_up_to_its_bound(policy, photos):
    """Each op at magnitudes from 0 to its upper bound (where the noise is clipped), each twice (ops negate their
    argument at random): no magnitude a noise can draw makes an argument Pillow rejects."""
    step = augmentation(training_transform(load_config(None, {"aa": policy})))
    crop = photos[0].resize((SIZE, SIZE))
    seed(0)
    swept = {}
    for op in ops_of(step):
        swept.setdefault(op.name, op)
    for op in swept.values():
        op.prob, op.magnitude_std = 1.0, 0
        for magnitude in np.linspace(0, op.magnitude_max or 10, 41):
            op.magnitude = float(magnitude)
            for _ in range(2):
                assert op(crop).size == crop.size
    assert any("Posterize" in name for name in swept)


def test_every_recipes_whole_training_pipeline_draws_without_an_error(photos):
    named = {"agent_deit_tiny", "sima_deit_small", "soft_tiny", "ufo_vit_small", "convert_deit_small_imagenet"}
    assert named <= set(RECIPES)
    for i, (recipe, cfg) in enumerate(RECIPES.items()):
        transform = training_transform(cfg)
        augmentation(transform)
        # loader workers get the transform pickled when they are spawned
        transform = pickle.loads(pickle.dumps(transform))
        seed(i)
        for k in range(PIPELINE_DRAWS):
            out = transform(photos[k % len(photos)])
            assert out.shape == (3, SIZE, SIZE) and torch.isfinite(out).all(), recipe
