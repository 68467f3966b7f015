"""A model as the edge exporters need it: one fixed input size, no antialiased resample, plain BatchNorm, eval."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["prepare_for_export"]


# replaced by the models-level export helper when merged
def prepare_for_export(model: nn.Module, input_size: Sequence[int]) -> nn.Module:
    """``model`` (modified in place, returned) for a graph at ``input_size`` = (C, H, W).

    timm's ViT built with ``dynamic_img_size`` resamples its position embedding on every call, and under
    torch.export with antialiased bicubic (``aten._upsample_bicubic2d_aa``), which ExecuTorch and Core ML reject:
    the embedding is resampled once here, eagerly, and the per-call path is switched off. SyncBatchNorm becomes
    BatchNorm (no process group at inference)."""
    size = (int(input_size[1]), int(input_size[2]))
    if getattr(model, "dynamic_img_size", False) and hasattr(model, "set_input_size"):
        from timm.layers import Format

        model.set_input_size(img_size=size)  # resamples pos_embed once (a no-op at the built size)
        model.dynamic_img_size = False
        embed = model.patch_embed
        # the fixed-size path expects flattened (B, N, C) tokens, as a model built without dynamic_img_size
        embed.flatten, embed.output_fmt, embed.strict_img_size = True, Format.NCHW, True
    _sync_to_batch_norm(model)
    return model.eval()


def _sync_to_batch_norm(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.SyncBatchNorm):
            bn = nn.BatchNorm2d(child.num_features, child.eps, child.momentum, child.affine,
                                child.track_running_stats)
            bn.load_state_dict(child.state_dict())
            setattr(module, name, bn.to(next(child.buffers(), torch.empty(0)).device))
        else:
            _sync_to_batch_norm(child)
