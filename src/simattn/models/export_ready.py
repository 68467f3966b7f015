"""Lay a model out for graph export at one input size: :func:`prepare_for_export`.

``torch.export`` (and the runtimes behind it: ExecuTorch, Core ML, ONNX) capture one input size best. A model built
with ``dynamic_img_size=True`` resamples its learned position embeddings on every forward, and while exporting
timm does so even at the size the embeddings already have (so that the graph does not specialize to the example
input), with antialiased bicubic interpolation: ``aten._upsample_bicubic2d_aa``, which ExecuTorch and Core ML do
not accept and which ONNX carries as ``Resize(cubic, antialias)`` on a constant. :func:`prepare_for_export`
resamples the embeddings once, here, in eager mode, and turns per-forward resampling off, so the exported graph
adds them as constants. It also turns ``SyncBatchNorm`` (the official SimA training layout) into ``BatchNorm2d``,
which export backends know, and puts the model in eval mode.
"""
from typing import Optional, Tuple, Type, Union

import torch
from torch import nn
from timm.layers import BatchNormAct2d, SyncBatchNormAct, to_2tuple
from timm.layers.format import Format
from timm.models.vision_transformer import VisionTransformer

from ._pyramid import PyramidTransformer
from .sima_xcit import XCiTBackbone

__all__ = ["prepare_for_export", "revert_sync_batchnorm", "fixed_size_export"]


def revert_sync_batchnorm(module: nn.Module, batch_norm_class: Type[nn.Module] = nn.BatchNorm2d) -> nn.Module:
    """Every ``nn.SyncBatchNorm`` in ``module`` becomes a ``batch_norm_class`` (``nn.BatchNorm2d`` for the 2-D maps
    of these models' BatchNorms; the class a parent names as ``sync_bn_reverts_to`` for its children, as SLAB's
    RepBN does for its token ``BatchNorm1d``; timm's ``SyncBatchNormAct``: a ``BatchNormAct2d``) with the same
    parameters, running statistics and mode; the inverse of ``nn.SyncBatchNorm.convert_sync_batchnorm`` /
    ``timm.layers.convert_sync_batchnorm``. Returns the module (a new one when ``module`` itself is converted)."""
    out = module
    if isinstance(module, SyncBatchNormAct):
        out = BatchNormAct2d(module.num_features, module.eps, module.momentum, module.affine,
                             module.track_running_stats)
        out.act, out.drop = module.act, module.drop
    elif isinstance(module, nn.SyncBatchNorm):
        out = batch_norm_class(module.num_features, module.eps, module.momentum, module.affine,
                               module.track_running_stats)
    if out is not module:
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
    child_class = getattr(out, "sync_bn_reverts_to", nn.BatchNorm2d)
    for name, child in module.named_children():
        new = revert_sync_batchnorm(child, child_class)
        if new is not child:
            setattr(out, name, new)
    return out


def prepare_for_export(model: nn.Module, img_size: Union[int, Tuple[int, int]]) -> nn.Module:
    """Fix ``model``'s input size to ``img_size`` (H, W) for export, in place, and return it in eval mode.

    - Learned position embeddings are resampled to the grid of ``img_size`` once, here, and per-forward resampling
      is turned off (timm's ``dynamic_img_size``; the same switch on XCiT-layout and pyramid models), so an
      exported graph holds no resampling op (no ``aten._upsample_bicubic2d_aa``). Fourier encodings (SimA/XCiT)
      and CvT (no position embedding) need nothing. The model then takes inputs of ``img_size`` only (a
      ValueError or timm's assertion otherwise), with any batch size.
    - A segmenter (:class:`~simattn.models.segmentation.Segmenter`) has its backbone laid out so.
    - ``SyncBatchNorm`` layers become plain BatchNorms again (:func:`revert_sync_batchnorm`).
    - ``model.eval()``.

    Outputs at ``img_size`` are unchanged: the embeddings added are the ones the model resampled for that size.
    Use the returned module: it is ``model`` itself unless ``model`` is a bare ``SyncBatchNorm``.
    """
    size = tuple(img_size) if isinstance(img_size, (tuple, list)) else (img_size,)
    if len(size) not in (1, 2) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size):
        raise ValueError(f"prepare_for_export img_size {img_size!r}: expected a positive int or (height, width) of "
                         "positive ints")
    h, w = to_2tuple(size[0]) if len(size) == 1 else size
    model = revert_sync_batchnorm(model)
    _fix_input_size(_backbone_of(model), img_size, h, w)
    return model.eval()


def fixed_size_export(model: nn.Module) -> Optional[str]:
    """Why ``model`` (or a segmenter's backbone) exports at one input size only (its class's ``fixed_size_export``),
    or None where height and width can stay dynamic."""
    return getattr(model, "fixed_size_export", None) or getattr(_backbone_of(model), "fixed_size_export", None)


def _backbone_of(model: nn.Module) -> nn.Module:
    """The module that takes the input image: a segmenter's backbone (fed the image as it is), else the model."""
    from .segmentation import Segmenter
    return model.backbone if isinstance(model, Segmenter) else model


def _fix_input_size(model: nn.Module, img_size, h: int, w: int) -> None:
    if isinstance(model, VisionTransformer):
        patch_embed = model.patch_embed
        ph, pw = to_2tuple(patch_embed.patch_size)
        if h % ph or w % pw:
            raise ValueError(f"prepare_for_export img_size {img_size!r}: height and width must be positive multiples "
                             f"of the patch size {ph}x{pw}")
        if getattr(model, "dynamic_img_size", False):
            model.dynamic_img_size = False
            # dynamic models keep patches as an NHWC grid for resampling; a fixed size takes timm's flat tokens
            patch_embed.flatten, patch_embed.output_fmt = True, Format.NCHW
        model.set_input_size(img_size=(h, w))
        patch_embed.strict_img_size = True
    elif isinstance(model, (XCiTBackbone, PyramidTransformer)):
        model.set_input_size((h, w), dynamic_img_size=False)
