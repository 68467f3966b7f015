"""Explainability: q̂/k̂ token-importance heatmaps (SimA paper Fig. 3 / A2) and softmax CLS attention maps.

matplotlib, scikit-image and scikit-learn are imported inside the functions that use them.
"""
from .heatmaps import TokenMaps, hooked_blocks, overlay, render_panels, save_overlay, token_grid, token_maps
from ..data.images import SKIMAGE_PHOTOS, SKLEARN_PHOTOS, image_label, image_tensor, load_image

__all__ = [
    "TokenMaps", "hooked_blocks", "overlay", "render_panels", "save_overlay", "token_grid", "token_maps",
    "SKIMAGE_PHOTOS", "SKLEARN_PHOTOS", "image_label", "image_tensor", "load_image",
]
