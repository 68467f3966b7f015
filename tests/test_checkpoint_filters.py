"""Checkpoint filters against state dicts in the published key layouts.

Each state dict is listed here key by key with its shape (official SimA / official XCiT from the released code,
timm's XCiT and DeiT/ViT as timm and facebookresearch/deit save them), filled with seeded random values, mapped by
the family's ``checkpoint_filter_fn`` and loaded with ``strict=True``. The logits are then compared with a forward
written here from the same layout with plain torch ops, in float64, so that any tensor the filter alters (a scale
of 1.001, a swapped q/k chunk) shows far above the rounding error: ``test_*_detects_altered_tensors`` checks that
for every tensor role of each layout.
"""
import math
import re

import pytest
import timm
import torch
import torch.nn.functional as F

import simattn  # noqa: F401  (registers the models)
from simattn.models import sima_cvt, sima_vit, sima_xcit
from simattn.utils.io import CheckpointError, atomic_torch_save, load_weights

pytestmark = pytest.mark.usefixtures("one_thread")  # hundreds of tiny forwards: fastest on one thread

DTYPE = torch.float64
# float64 forwards of these small nets agree to ~1e-15; a 1.001 scale of any one tensor moves the logits by more
# than 1e-7 (checked for every tensor by the *_detects_altered_tensors tests).
TOL = dict(rtol=1e-10, atol=1e-10)


# ---- layouts -----------------------------------------------------------------------------------------------------
def _norm(prefix: str, dim: int) -> dict:
    return {f"{prefix}.weight": (dim,), f"{prefix}.bias": (dim,)}


def _linear(prefix: str, out_f: int, in_f: int) -> dict:
    return {f"{prefix}.weight": (out_f, in_f), f"{prefix}.bias": (out_f,)}


def _bn(prefix: str, dim: int) -> dict:
    return {f"{prefix}.weight": (dim,), f"{prefix}.bias": (dim,), f"{prefix}.running_mean": (dim,),
            f"{prefix}.running_var": (dim,), f"{prefix}.num_batches_tracked": ()}


def deit_layout(dim: int, depth: int, patch: int, grid: int, num_classes: int) -> dict:
    """timm's VisionTransformer / facebookresearch/deit (a timm ViT): class token with a position-embedding slot."""
    shapes = {"cls_token": (1, 1, dim), "pos_embed": (1, 1 + grid * grid, dim),
              "patch_embed.proj.weight": (dim, 3, patch, patch), "patch_embed.proj.bias": (dim,)}
    for i in range(depth):
        b = f"blocks.{i}"
        shapes.update({**_norm(f"{b}.norm1", dim), **_linear(f"{b}.attn.qkv", 3 * dim, dim),
                       **_linear(f"{b}.attn.proj", dim, dim), **_norm(f"{b}.norm2", dim),
                       **_linear(f"{b}.mlp.fc1", 4 * dim, dim), **_linear(f"{b}.mlp.fc2", dim, 4 * dim)})
    shapes.update({**_norm("norm", dim), **_linear("head", num_classes, dim)})
    return shapes


def xcit_layout(dim: int, depth: int, heads: int, num_classes: int, *, patch: int = 16, official: bool = True,
                temperature: bool = False, cls_layers: int = 2) -> dict:
    """XCiT's layout. official=True: the facebookresearch/xcit and SimA ``sima.py`` names (``pos_embeder.``, fused
    class-attention ``qkv``); SimA has no ``attn.temperature``. official=False: timm's ``xcit.py`` names
    (``pos_embed.``, class-attention ``q``/``k``/``v``)."""
    chans = [3, dim // 8, dim // 4, dim // 2, dim] if patch == 16 else [3, dim // 4, dim // 2, dim]
    shapes = {"cls_token": (1, 1, dim)}
    for j, (c_in, c_out) in enumerate(zip(chans[:-1], chans[1:])):  # conv3x3 (no bias) + BN, GELU in between
        shapes[f"patch_embed.proj.{2 * j}.0.weight"] = (c_out, c_in, 3, 3)
        shapes.update(_bn(f"patch_embed.proj.{2 * j}.1", c_out))
    pos = "pos_embeder" if official else "pos_embed"
    shapes.update({f"{pos}.token_projection.weight": (dim, 64, 1, 1), f"{pos}.token_projection.bias": (dim,)})
    for i in range(depth):
        b = f"blocks.{i}"
        shapes.update({f"{b}.gamma1": (dim,), f"{b}.gamma2": (dim,), f"{b}.gamma3": (dim,), **_norm(f"{b}.norm1", dim),
                       **_linear(f"{b}.attn.qkv", 3 * dim, dim), **_linear(f"{b}.attn.proj", dim, dim),
                       **_norm(f"{b}.norm2", dim), **_linear(f"{b}.mlp.fc1", 4 * dim, dim),
                       **_linear(f"{b}.mlp.fc2", dim, 4 * dim), **_norm(f"{b}.norm3", dim),
                       f"{b}.local_mp.conv1.weight": (dim, 1, 3, 3), f"{b}.local_mp.conv1.bias": (dim,),
                       **_bn(f"{b}.local_mp.bn", dim),
                       f"{b}.local_mp.conv2.weight": (dim, 1, 3, 3), f"{b}.local_mp.conv2.bias": (dim,)})
        if temperature:
            shapes[f"{b}.attn.temperature"] = (heads, 1, 1)
    for j in range(cls_layers):
        c = f"cls_attn_blocks.{j}"
        shapes.update({f"{c}.gamma1": (dim,), f"{c}.gamma2": (dim,), **_norm(f"{c}.norm1", dim),
                       **_linear(f"{c}.attn.proj", dim, dim), **_norm(f"{c}.norm2", dim),
                       **_linear(f"{c}.mlp.fc1", 4 * dim, dim), **_linear(f"{c}.mlp.fc2", dim, 4 * dim)})
        if official:
            shapes.update(_linear(f"{c}.attn.qkv", 3 * dim, dim))
        else:
            for name in "qkv":
                shapes.update(_linear(f"{c}.attn.{name}", dim, dim))
    shapes.update({**_norm("norm", dim), **_linear("head", num_classes, dim)})
    return shapes


def fill(shapes: dict, seed: int) -> dict:
    """Seeded random values: norm/BN scales and variances around 1, everything else around 0."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in shapes.items():
        if key.endswith("num_batches_tracked"):
            out[key] = torch.tensor(100)
            continue
        t = torch.randn(shape, generator=g, dtype=DTYPE)
        if key.endswith("running_var"):
            t = 0.5 + t.abs()
        elif key.endswith((".norm1.weight", ".norm2.weight", ".norm3.weight", ".bn.weight", "temperature")) \
                or key == "norm.weight" or ".gamma" in key \
                or (key.startswith("patch_embed.proj.") and key.endswith(".1.weight")):  # stem BatchNorm
            t = 1.0 + 0.2 * t
        elif key.endswith(("cls_token", "pos_embed")):
            t = 0.5 * t
        else:
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else 16
            t = t / math.sqrt(fan_in)
        out[key] = t
    return out


# ---- forwards written from the layouts -----------------------------------------------------------------------------
def _ln(sd, prefix, x):
    return F.layer_norm(x, x.shape[-1:], sd[f"{prefix}.weight"], sd[f"{prefix}.bias"], eps=1e-6)


def _lin(sd, prefix, x):
    return F.linear(x, sd[f"{prefix}.weight"], sd[f"{prefix}.bias"])


def _bn_eval(sd, prefix, x):
    return F.batch_norm(x, sd[f"{prefix}.running_mean"], sd[f"{prefix}.running_var"], sd[f"{prefix}.weight"],
                        sd[f"{prefix}.bias"], training=False, eps=1e-5)


def _heads(t, num_heads):
    B, N, C = t.shape
    return t.reshape(B, N, num_heads, C // num_heads).transpose(1, 2)


def _merge(t):
    B, H, N, d = t.shape
    return t.transpose(1, 2).reshape(B, N, H * d)


def _token_attention(kind, q, k, v, temperature=None):
    """(B, H, N, d) → (B, H, N, d): softmax (ViT), SimA (l1 over tokens, q̂(k̂ᵀv)), XCA (XCiT, over channels)."""
    if kind == "softmax":
        return torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1) @ v
    if kind == "sima":
        q, k = F.normalize(q, p=1.0, dim=-2), F.normalize(k, p=1.0, dim=-2)
        return q @ (k.transpose(-2, -1) @ v)
    # XCA: q, k l2-normalized along tokens, a d×d softmax attention scaled by the per-head temperature
    q, k = F.normalize(q, dim=-2), F.normalize(k, dim=-2)
    attn = torch.softmax(q.transpose(-2, -1) @ k * temperature, dim=-1)  # (B, H, d, d)
    return (attn @ v.transpose(-2, -1)).transpose(-2, -1)


def deit_forward(sd, x, *, patch, num_heads, attn="softmax"):
    """timm/DeiT ViT: conv patchify, class token, position embedding on all tokens, pre-norm blocks, token pool."""
    x = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=patch)
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([sd["cls_token"].expand(x.shape[0], -1, -1), x], dim=1) + sd["pos_embed"]
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    for i in range(depth):
        b = f"blocks.{i}"
        q, k, v = _lin(sd, f"{b}.attn.qkv", _ln(sd, f"{b}.norm1", x)).chunk(3, dim=-1)
        out = _token_attention(attn, _heads(q, num_heads), _heads(k, num_heads), _heads(v, num_heads))
        x = x + _lin(sd, f"{b}.attn.proj", _merge(out))
        x = x + _lin(sd, f"{b}.mlp.fc2", F.gelu(_lin(sd, f"{b}.mlp.fc1", _ln(sd, f"{b}.norm2", x))))
    return _lin(sd, "head", _ln(sd, "norm", x)[:, 0])


def _fourier(sd, prefix, H, W, hidden=32, temperature=1e4):
    """XCiT's Fourier encoding: sin/cos of the normalized grid position (computed in float32 as in XCiT), 1×1 conv."""
    y = torch.arange(1, H + 1, dtype=torch.float32)[:, None].expand(H, W)
    x = torch.arange(1, W + 1, dtype=torch.float32)[None, :].expand(H, W)
    y, x = y / (H + 1e-6) * (2 * math.pi), x / (W + 1e-6) * (2 * math.pi)
    dim_t = temperature ** (2 * (torch.arange(hidden, dtype=torch.float32) // 2) / hidden)
    px, py = x[..., None] / dim_t, y[..., None] / dim_t
    px = torch.stack([px[..., 0::2].sin(), px[..., 1::2].cos()], dim=-1).flatten(-2)
    py = torch.stack([py[..., 0::2].sin(), py[..., 1::2].cos()], dim=-1).flatten(-2)
    feats = torch.cat([py, px], dim=-1).reshape(H * W, 2 * hidden).to(DTYPE)
    weight = sd[f"{prefix}.token_projection.weight"]
    return F.linear(feats, weight.reshape(weight.shape[0], -1), sd[f"{prefix}.token_projection.bias"])


def _cls_qkv(sd, prefix):
    """Class-attention q, k, v weights and biases from either layout (fused ``qkv`` or ``q``/``k``/``v``)."""
    if f"{prefix}.qkv.weight" in sd:
        return sd[f"{prefix}.qkv.weight"], sd[f"{prefix}.qkv.bias"]
    return (torch.cat([sd[f"{prefix}.{n}.weight"] for n in "qkv"]),
            torch.cat([sd[f"{prefix}.{n}.bias"] for n in "qkv"]))


def xcit_forward(sd, x, *, num_heads, attn, tokens_norm, patch=16):
    """XCiT / SimA as released: conv stem, Fourier encoding, blocks (attn, LPI, MLP with layer scale), class
    attention over all tokens (softmax for XCiT, l1-normalized and softmax-free for SimA), final norm, CLS → head."""
    n_convs = 4 if patch == 16 else 3
    for j in range(n_convs):
        x = _bn_eval(sd, f"patch_embed.proj.{2 * j}.1", F.conv2d(x, sd[f"patch_embed.proj.{2 * j}.0.weight"],
                                                                  stride=2, padding=1))
        x = F.gelu(x) if j < n_convs - 1 else x
    B, C, H, W = x.shape
    pos = "pos_embeder" if "pos_embeder.token_projection.weight" in sd else "pos_embed"
    x = x.flatten(2).transpose(1, 2) + _fourier(sd, pos, H, W)
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    for i in range(depth):
        b = f"blocks.{i}"
        q, k, v = _lin(sd, f"{b}.attn.qkv", _ln(sd, f"{b}.norm1", x)).chunk(3, dim=-1)
        out = _token_attention(attn, _heads(q, num_heads), _heads(k, num_heads), _heads(v, num_heads),
                               sd.get(f"{b}.attn.temperature"))
        x = x + sd[f"{b}.gamma1"] * _lin(sd, f"{b}.attn.proj", _merge(out))
        grid = _ln(sd, f"{b}.norm3", x).transpose(1, 2).reshape(B, C, H, W)  # LPI: dwconv, GELU, BN, dwconv
        grid = F.conv2d(grid, sd[f"{b}.local_mp.conv1.weight"], sd[f"{b}.local_mp.conv1.bias"], padding=1, groups=C)
        grid = _bn_eval(sd, f"{b}.local_mp.bn", F.gelu(grid))
        grid = F.conv2d(grid, sd[f"{b}.local_mp.conv2.weight"], sd[f"{b}.local_mp.conv2.bias"], padding=1, groups=C)
        x = x + sd[f"{b}.gamma3"] * grid.reshape(B, C, H * W).transpose(1, 2)
        x = x + sd[f"{b}.gamma2"] * _lin(sd, f"{b}.mlp.fc2", F.gelu(_lin(sd, f"{b}.mlp.fc1", _ln(sd, f"{b}.norm2", x))))
    x = torch.cat([sd["cls_token"].expand(B, -1, -1), x], dim=1)
    n_cls = len({k.split(".")[1] for k in sd if k.startswith("cls_attn_blocks.")})
    for j in range(n_cls):
        c = f"cls_attn_blocks.{j}"
        h = _ln(sd, f"{c}.norm1", x)
        q, k, v = (_heads(t, num_heads) for t in F.linear(h, *_cls_qkv(sd, f"{c}.attn")).chunk(3, dim=-1))
        if attn == "sima":  # every token's q and k l1-normalized over tokens (eps 1e-6); the CLS row weights v
            q, k = F.normalize(q, p=1.0, dim=-2, eps=1e-6), F.normalize(k, p=1.0, dim=-2, eps=1e-6)
            weights = (q[:, :, :1] * k).sum(-1, keepdim=True).transpose(-2, -1)
        else:
            weights = torch.softmax((q[:, :, :1] * k).sum(-1, keepdim=True).transpose(-2, -1)
                                    * q.shape[-1] ** -0.5, dim=-1)
        cls = _lin(sd, f"{c}.attn.proj", _merge(weights @ v))
        # the attention passes the normalized patch tokens through: they are added to the residual too
        x = x + sd[f"{c}.gamma1"] * torch.cat([cls, h[:, 1:]], dim=1)
        x = _ln(sd, f"{c}.norm2", x) if tokens_norm else torch.cat([_ln(sd, f"{c}.norm2", x[:, :1]), x[:, 1:]], 1)
        cls = sd[f"{c}.gamma2"] * _lin(sd, f"{c}.mlp.fc2", F.gelu(_lin(sd, f"{c}.mlp.fc1", x[:, :1])))
        x = x + torch.cat([cls, x[:, 1:]], dim=1)  # as released: the patch tokens are added to themselves
    return _lin(sd, "head", _ln(sd, "norm", x)[:, 0])


# ---- checks ----------------------------------------------------------------------------------------------------------
def _cloned(checkpoint):
    if isinstance(checkpoint, dict):
        return {k: _cloned(v) for k, v in checkpoint.items()}
    return checkpoint.clone()


def load_filtered(model, filter_fn, checkpoint):
    """Filter a copy (the forwards here read the listed values even if a filter edits in place), load strictly."""
    sd = filter_fn(_cloned(checkpoint), model)
    model.load_state_dict(sd, strict=True)
    return sd


def close(a, b) -> bool:
    return torch.allclose(a, b, **TOL)


def assert_mutations_detected(model, filtered, x, expected, qkv_keys, no_effect=()):
    """A single-tensor alteration of the filter's output (×1.001, or q and k chunks swapped) changes the logits
    beyond TOL, for every tensor outside the blocks and every tensor of the first block of each kind (the later
    blocks repeat those roles). ``no_effect``: keys the function does not depend on."""
    with torch.no_grad():
        assert close(model(x), expected)
    for key, value in filtered.items():
        if not value.is_floating_point() or re.match(r"(cls_attn_)?blocks\.[1-9]", key) or key in no_effect:
            continue
        model.load_state_dict({**filtered, key: value * 1.001})
        with torch.no_grad():
            assert not close(model(x), expected), f"scaling {key} by 1.001 went unnoticed"
    for key in qkv_keys:
        q, k, v = filtered[key].chunk(3)
        model.load_state_dict({**filtered, key: torch.cat([k, q, v])})
        with torch.no_grad():
            assert not close(model(x), expected), f"swapping q and k of {key} went unnoticed"
    model.load_state_dict(filtered)


# ---- DeiT / ViT (sima_vit) ------------------------------------------------------------------------------------------
DEIT = dict(embed_dim=32, depth=2, num_heads=2, img_size=64, num_classes=5)


@pytest.mark.parametrize("wrapped", [False, True], ids=["timm", "deit_official"])
@pytest.mark.parametrize("attn", ["softmax", "sima"])
def test_deit_layout_gives_reference_logits(wrapped, attn):
    official = fill(deit_layout(32, 2, 16, 4, 5), seed=0)
    model = timm.create_model("sima_deit_tiny_patch16_224", attn_type=attn, **DEIT).to(DTYPE).eval()
    load_filtered(model, sima_vit.checkpoint_filter_fn, {"model": official} if wrapped else official)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    with torch.no_grad():
        torch.testing.assert_close(model(x), deit_forward(official, x, patch=16, num_heads=2, attn=attn), **TOL)


def test_deit_layout_detects_altered_tensors():
    official = fill(deit_layout(32, 2, 16, 4, 5), seed=0)
    model = timm.create_model("sima_deit_tiny_patch16_224", attn_type="softmax", **DEIT).to(DTYPE).eval()
    filtered = load_filtered(model, sima_vit.checkpoint_filter_fn, official)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    expected = deit_forward(official, x, patch=16, num_heads=2)
    assert_mutations_detected(model, filtered, x, expected, [k for k in filtered if k.endswith("attn.qkv.weight")])


def _bicubic_grid(pos: torch.Tensor, old: tuple, new: tuple, timm_style: bool = False) -> torch.Tensor:
    """(1, h·w, C) on an old grid → (1, H·W, C): bicubic resampling of the C maps in their dtype, without
    antialiasing, as DeiT's fine-tuning code (its ``main.py``) and the peers' ``load_pretrained`` resize them;
    ``timm_style``: in float32 and antialiased, as timm's ``resample_abs_pos_embed``."""
    C = pos.shape[-1]
    maps = (pos.float() if timm_style else pos).reshape(1, *old, C).permute(0, 3, 1, 2)
    maps = F.interpolate(maps, size=new, mode="bicubic", align_corners=False, antialias=timm_style)
    return maps.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], C).to(pos.dtype)


def test_deit_position_embedding_resampled_to_model_grid():
    official = fill(deit_layout(32, 2, 16, 4, 5), seed=0)  # trained at 64 px: 4×4 grid
    model = timm.create_model("sima_deit_tiny_patch16_224", attn_type="softmax",
                              **dict(DEIT, img_size=96)).to(DTYPE).eval()
    filtered = load_filtered(model, sima_vit.checkpoint_filter_fn, official)
    pos = official["pos_embed"]
    expected = torch.cat([pos[:, :1], _bicubic_grid(pos[:, 1:], (4, 4), (6, 6))], dim=1)  # class slot kept
    torch.testing.assert_close(filtered["pos_embed"], expected, rtol=0, atol=0)
    x = torch.randn(1, 3, 96, 96, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    with torch.no_grad():
        torch.testing.assert_close(model(x), deit_forward({**official, "pos_embed": expected}, x, patch=16,
                                                          num_heads=2), rtol=1e-6, atol=1e-6)


# ---- XCiT / SimA (sima_xcit) ----------------------------------------------------------------------------------------
XCIT = dict(embed_dim=32, depth=2, num_heads=2, num_classes=5)


def _xcit_case(layout: str):
    """(model, checkpoint, reference attention kind) for the official SimA, official XCiT and timm XCiT layouts."""
    if layout == "sima_official":
        model = timm.create_model("sima_small_12_p16", **XCIT)  # tokens_norm=True, SimA class attention
        shapes = xcit_layout(32, 2, 2, 5, official=True, temperature=False)
        return model, {"model": fill(shapes, seed=0)}, "sima", True
    model = timm.create_model("sima_nano_12_p16", attn_type="xca", **XCIT)  # tokens_norm=False, softmax
    shapes = xcit_layout(32, 2, 2, 5, official=layout == "xcit_official", temperature=True)
    sd = fill(shapes, seed=0)
    return model, ({"model": sd} if layout == "xcit_official" else sd), "xca", False


@pytest.mark.parametrize("layout", ["sima_official", "xcit_official", "timm_xcit"])
def test_xcit_layouts_give_reference_logits(layout):
    model, checkpoint, attn, tokens_norm = _xcit_case(layout)
    model = model.to(DTYPE).eval()
    official = checkpoint.get("model", checkpoint)
    load_filtered(model, sima_xcit.checkpoint_filter_fn, checkpoint)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    with torch.no_grad():
        torch.testing.assert_close(model(x), xcit_forward(official, x, num_heads=2, attn=attn,
                                                          tokens_norm=tokens_norm), **TOL)


@pytest.mark.parametrize("layout", ["sima_official", "timm_xcit"])
def test_xcit_layouts_detect_altered_tensors(layout):
    model, checkpoint, attn, tokens_norm = _xcit_case(layout)
    model = model.to(DTYPE).eval()
    official = checkpoint.get("model", checkpoint)
    filtered = load_filtered(model, sima_xcit.checkpoint_filter_fn, checkpoint)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    expected = xcit_forward(official, x, num_heads=2, attn=attn, tokens_norm=tokens_norm)
    # softmax class attention is blind to the key bias (it shifts every logit of the CLS row by the same q·b)
    no_effect = {"cls_attn_blocks.0.attn.k.bias"} if attn == "xca" else set()
    assert_mutations_detected(model, filtered, x, expected, [k for k in filtered if k.endswith("attn.qkv.weight")],
                              no_effect)
    # the split of the fused class-attention qkv: q and k exchanged
    model.load_state_dict({**filtered, "cls_attn_blocks.0.attn.q.weight": filtered["cls_attn_blocks.0.attn.k.weight"],
                           "cls_attn_blocks.0.attn.k.weight": filtered["cls_attn_blocks.0.attn.q.weight"]})
    with torch.no_grad():
        assert not close(model(x), expected)


def test_xcit_learned_position_embedding_resampled_to_model_grid():
    """UFO-ViT's learned encoding (no class slot) saved at 64 px (4×4) loads into a 96 px (6×6) model."""
    model = timm.create_model("ufo_vit_tiny", embed_dim=32, depth=1, num_heads=2, num_classes=5,
                              img_size=96).to(DTYPE).eval()
    source = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    source["pos_embed"] = torch.randn(1, 16, 32, generator=g, dtype=DTYPE)
    filtered = load_filtered(model, sima_xcit.checkpoint_filter_fn, source)
    torch.testing.assert_close(filtered["pos_embed"], _bicubic_grid(source["pos_embed"], (4, 4), (6, 6), True),
                               rtol=0, atol=1e-6)


# ---- CvT (sima_cvt) -------------------------------------------------------------------------------------------------
CVT = dict(embed_dims=(16, 32, 64), depths=(1, 1, 1), num_heads=(1, 2, 2))
CVT_EMBED = ((7, 4, 2), (3, 2, 1), (3, 2, 1))  # (kernel, stride, padding) of each stage's token embedding


def cvt_official_layout(dims, depths, num_classes) -> dict:
    """microsoft/CvT's layout: ``stage{i}.`` modules, depthwise conv + BN projections ``conv_proj_{q,k,v}``
    followed by separate linear maps ``proj_{q,k,v}``, a CLS token in the last stage, final ``norm`` and ``head``."""
    shapes, c_in = {}, 3
    for i, (dim, depth, (kernel, _, _)) in enumerate(zip(dims, depths, CVT_EMBED)):
        s = f"stage{i}"
        shapes.update({f"{s}.patch_embed.proj.weight": (dim, c_in, kernel, kernel),
                       f"{s}.patch_embed.proj.bias": (dim,), **_norm(f"{s}.patch_embed.norm", dim)})
        if i == len(dims) - 1:
            shapes[f"{s}.cls_token"] = (1, 1, dim)
        for j in range(depth):
            b = f"{s}.blocks.{j}"
            shapes.update({**_norm(f"{b}.norm1", dim), **_norm(f"{b}.norm2", dim),
                           **_linear(f"{b}.attn.proj", dim, dim), **_linear(f"{b}.mlp.fc1", 4 * dim, dim),
                           **_linear(f"{b}.mlp.fc2", dim, 4 * dim)})
            for n in "qkv":
                shapes[f"{b}.attn.conv_proj_{n}.conv.weight"] = (dim, 1, 3, 3)
                shapes.update(_bn(f"{b}.attn.conv_proj_{n}.bn", dim))
                shapes.update(_linear(f"{b}.attn.proj_{n}", dim, dim))
        c_in = dim
    shapes.update({**_norm("norm", dims[-1]), **_linear("head", num_classes, dims[-1])})
    return shapes


def cvt_sima_forward(sd, x, *, heads):
    """CvT as released (LayerNorm eps 1e-5, QuickGELU MLP, CLS token skipping the conv projections, keys and values
    at stride 2) with SimA attention: q l1-normalized over the queries, k over the (fewer) keys, q̂(k̂ᵀv)."""
    def ln(prefix, t):
        return F.layer_norm(t, t.shape[-1:], sd[f"{prefix}.weight"], sd[f"{prefix}.bias"], eps=1e-5)

    def conv_proj(prefix, grid, stride):
        C = grid.shape[1]
        t = F.conv2d(grid, sd[f"{prefix}.conv.weight"], stride=stride, padding=1, groups=C)
        return _bn_eval(sd, f"{prefix}.bn", t).flatten(2).transpose(1, 2)

    for i, (kernel, stride, padding) in enumerate(CVT_EMBED):
        s = f"stage{i}"
        x = F.conv2d(x, sd[f"{s}.patch_embed.proj.weight"], sd[f"{s}.patch_embed.proj.bias"], stride=stride,
                     padding=padding)
        B, C, H, W = x.shape
        x = ln(f"{s}.patch_embed.norm", x.flatten(2).transpose(1, 2))
        prefix = 1 if f"{s}.cls_token" in sd else 0
        if prefix:
            x = torch.cat([sd[f"{s}.cls_token"].expand(B, -1, -1), x], dim=1)
        depth = len({k.split(".")[2] for k in sd if k.startswith(f"{s}.blocks.")})
        for j in range(depth):
            b = f"{s}.blocks.{j}"
            h = ln(f"{b}.norm1", x)
            cls, grid = h[:, :prefix], h[:, prefix:].transpose(1, 2).reshape(B, C, H, W)
            q, k, v = (_heads(_lin(sd, f"{b}.attn.proj_{n}", torch.cat([cls, conv_proj(f"{b}.attn.conv_proj_{n}",
                                                                                       grid, st)], dim=1)), heads[i])
                       for n, st in (("q", 1), ("k", 2), ("v", 2)))
            out = _token_attention("sima", q, k, v)
            x = x + _lin(sd, f"{b}.attn.proj", _merge(out))
            h = _lin(sd, f"{b}.mlp.fc1", ln(f"{b}.norm2", x))
            x = x + _lin(sd, f"{b}.mlp.fc2", h * torch.sigmoid(1.702 * h))
        if not prefix:
            x = x.transpose(1, 2).reshape(B, C, H, W)
    return _lin(sd, "head", ln("norm", x)[:, 0])


@pytest.mark.parametrize("wrapped", ["model", "state_dict", None])
def test_cvt_official_layout_gives_reference_logits(wrapped):
    official = fill(cvt_official_layout(CVT["embed_dims"], CVT["depths"], 5), seed=0)
    model = timm.create_model("sima_cvt_13", num_classes=5, **CVT).to(DTYPE).eval()
    checkpoint = {wrapped: official} if wrapped else official
    filtered = load_filtered(model, sima_cvt.checkpoint_filter_fn, checkpoint)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    expected = cvt_sima_forward(official, x, heads=CVT["num_heads"])
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, **TOL)
    # the fusion of proj_q/proj_k/proj_v into qkv: k and v exchanged, or one part scaled by 1.001, is seen
    key = "stages.1.blocks.0.attn.qkv.weight"
    q, k, v = filtered[key].chunk(3)
    for altered in (torch.cat([q, v, k]), torch.cat([q, k * 1.001, v])):
        model.load_state_dict({**filtered, key: altered})
        with torch.no_grad():
            assert not close(model(x), expected)


def test_official_sima_layout_into_xcit_names_the_missing_temperatures(tmp_path):
    """SimA's checkpoint has no XCA temperatures: loading it into the XCiT variant names them."""
    path = tmp_path / "sima_official.pth"
    atomic_torch_save({"model": fill(xcit_layout(32, 2, 2, 5, official=True), seed=0)}, path)
    load_weights(timm.create_model("sima_small_12_p16", **XCIT), path, filter_fn=sima_xcit.checkpoint_filter_fn)
    xca = timm.create_model("sima_small_12_p16", attn_type="xca", **XCIT)
    with pytest.raises(CheckpointError, match=r"missing keys: blocks\.0\.attn\.temperature"):
        load_weights(xca, path, filter_fn=sima_xcit.checkpoint_filter_fn)
