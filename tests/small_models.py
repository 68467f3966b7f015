"""Every registered model in its smallest configuration (one block per stage, narrow, 32-64 px), and the network
such a build is, so that tests that cost seconds per network run once per distinct one (graph capture, the
finite-difference gradient check)."""
from typing import Any, Dict

import torch
from timm.models import model_entrypoint

SMALL = {
    "sima_vit": dict(img_size=64, embed_dim=32, depth=1, num_heads=2),
    "sima_xcit": dict(img_size=32, embed_dim=32, depth=1, num_heads=2, cls_attn_layers=1),
    "ufo_vit": dict(img_size=32, embed_dim=32, depth=1, num_heads=2, cls_attn_layers=1),
    # pyramids of two stages: the first's blocks on the grid, the last's with the CLS token
    "sima_cvt": dict(img_size=32, embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), patch_sizes=(7, 3),
                     patch_strides=(4, 2), patch_paddings=(2, 1)),
    # 3 Newton iterations instead of 20: the same graph, a sixth of the ops for export to trace
    "soft_vit": dict(img_size=32, embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2), v_conv_kernels=(3,),
                     stem_chans=8, attn_kwargs={"num_iters": 3}),
    "pvt": dict(img_size=64, embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4),
                mlp_ratios=(2, 2, 2, 2)),
    # timm's Swin drops paths at 0.1 by default, which would make the FX backward check random
    "swin": dict(img_size=32, embed_dim=16, depths=(1, 1), num_heads=(2, 4), window_size=4, drop_path_rate=0.0),
}

#: the papers' comparison networks: another kind in a family's layout, so the family's SOFT options do not apply
_BASELINES = {f"soft_tiny_{kind}" for kind in ("softmax", "linformer", "performer", "nystrom")}

#: what the patch size sets: the patch embedding's kernel (or the depth of XCiT's conv stem) and the token grid
_PATCH_SETTINGS = {"patch_size", "grid_size", "num_patches"}


def family(name: str) -> str:
    """The module that registers ``name`` (a model or a pretrained tag), e.g. ``pvt``."""
    return model_entrypoint(name.split(".")[0]).__module__.rsplit(".", 1)[-1]


def small_kwargs(name: str) -> Dict[str, Any]:
    """The smallest configuration of ``name``'s family, with 3 classes."""
    small = dict(SMALL[family(name)], num_classes=3)
    if name in _BASELINES:
        small.pop("attn_kwargs")
    return small


def structure(model: torch.nn.Module) -> str:
    """The network as graph capture sees it: the module tree with shapes, and every module's plain settings. The
    patch embedding is left out: models that differ only in patch size run the same code, on more or fewer tokens."""
    plain = (bool, int, float, str, tuple, type(None))

    def own(m):
        return sorted((k, v) for k, v in vars(m).items()
                      if k[0] != "_" and isinstance(v, plain) and k not in _PATCH_SETTINGS)

    settings = [f"{name}: {own(m)}" for name, m in model.named_modules() if not name.startswith("patch_embed")]
    tree = [f"{name}: {child!r}" for name, child in model.named_children() if name != "patch_embed"]
    return "\n".join(tree + settings)
