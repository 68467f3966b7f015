"""Single images for a model: any image file, or the real photos that scikit-image and scikit-learn ship (no
download), and the preprocessing a model expects (used by ``viz`` and ``export``).

Sources are strings: a file path, ``skimage:NAME`` (e.g. ``skimage:astronaut``) or ``sklearn:NAME``
(``sklearn:china.jpg`` / ``sklearn:flower.jpg``, the ``.jpg`` may be left out).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import nn

__all__ = ["SKIMAGE_PHOTOS", "SKLEARN_PHOTOS", "load_image", "read_image", "to_rgb", "image_tensor", "image_label",
           "resolve_data_config", "normalize_images"]

#: skimage.data images whose files ship inside the scikit-image package (others would need a download).
SKIMAGE_PHOTOS = (
    "astronaut", "brick", "camera", "cat", "cell", "checkerboard", "chelsea", "clock", "coffee", "coins",
    "colorwheel", "grass", "gravel", "horse", "hubble_deep_field", "immunohistochemistry", "logo",
    "microaneurysms", "moon", "page", "retina", "rocket", "text",
)
SKLEARN_PHOTOS = ("china.jpg", "flower.jpg")


def _from_array(arr: np.ndarray):
    from PIL import Image
    if arr.dtype == bool:
        arr = arr.astype(np.uint8) * 255
    if arr.dtype != np.uint8:
        arr = np.clip(arr, 0, 255).astype(np.uint8)
    return Image.fromarray(arr).convert("RGB")


#: PIL modes of one channel with 16 bits per pixel; ``convert("RGB")`` clips them at 255 (a 16-bit PNG turns white)
_MODES_16BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def to_rgb(img):
    """``img`` as 8-bit RGB with its range kept: 16-bit grey levels are scaled by 255/65535 instead of clipped.

    32-bit integer ("I") and float ("F") images have no fixed range; they are refused with a ValueError rather than
    guessed at.
    """
    from PIL import Image
    if img.mode in _MODES_16BIT:
        grey = np.asarray(img).astype(np.float32) * (255.0 / 65535.0)
        return Image.fromarray(np.round(grey).astype(np.uint8)).convert("RGB")
    if img.mode in ("I", "F"):
        raise ValueError(f"{'32-bit integer' if img.mode == 'I' else 'floating-point'} image (PIL mode {img.mode}) "
                         "has no fixed range; save it as 8- or 16-bit")
    return img if img.mode == "RGB" else img.convert("RGB")


def read_image(path: str | Path):
    """Decode the image file at ``path`` now (a truncated file fails here, not later) as RGB (:func:`to_rgb`)."""
    from PIL import Image
    with Image.open(path) as img:
        img.load()
        return to_rgb(img)


def load_image(source: str):
    """Load ``source`` (path, ``skimage:NAME`` or ``sklearn:NAME``) as an RGB PIL image.

    Raises FileNotFoundError for a missing file and ValueError for a file that is not a readable image or an
    unknown bundled photo name.
    """
    source = str(source)
    kind, sep, name = source.partition(":")
    if sep and kind == "skimage":
        if name not in SKIMAGE_PHOTOS:
            raise ValueError(f"unknown scikit-image photo {name!r}; bundled: {', '.join(SKIMAGE_PHOTOS)}")
        import skimage.data
        return _from_array(getattr(skimage.data, name)())
    if sep and kind == "sklearn":
        name = name if name.endswith(".jpg") else name + ".jpg"
        if name not in SKLEARN_PHOTOS:
            raise ValueError(f"unknown scikit-learn photo {name!r}; bundled: {', '.join(SKLEARN_PHOTOS)}")
        from sklearn.datasets import load_sample_image
        return _from_array(load_sample_image(name))
    from PIL import UnidentifiedImageError
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"image not found: {path}")
    if not path.is_file():
        raise ValueError(f"{path} is not a regular file (a folder, FIFO or device); give an image file")
    try:
        return read_image(path)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"cannot read image {path}: {type(e).__name__}: {e}") from None


def image_label(source: str) -> str:
    """A short file-name-safe label for a source (``astronaut``, ``china``, the file stem)."""
    kind, sep, name = str(source).partition(":")
    if sep and kind in ("skimage", "sklearn"):
        return Path(name).stem
    return Path(source).stem


def image_tensor(img, data_config: Mapping[str, Any]) -> Tuple[torch.Tensor, np.ndarray]:
    """Resize and crop ``img`` as the model's eval transform does (timm's ``create_transform``).

    Returns the normalized model input (1, 3, H, W) and the same crop as an (H, W, 3) float array in [0, 1], for
    display under the heatmaps.
    """
    from timm.data import create_transform


    keys = ("input_size", "interpolation", "crop_pct", "crop_mode")
    # Unit mean/std: the transform only resizes and crops; normalization is applied separately so the raw crop
    # stays available for display.
    transform = create_transform(**{k: data_config[k] for k in keys if k in data_config}, mean=(0., 0., 0.),
                                 std=(1., 1., 1.), is_training=False)
    raw = transform(img).unsqueeze(0)
    return normalize_images(raw, data_config), raw[0].permute(1, 2, 0).clamp(0, 1).numpy()


def resolve_data_config(model: nn.Module, spec: Optional[Mapping[str, Any]] = None,
                        img_size: Optional[int] = None) -> Dict[str, Any]:
    """Preprocessing for ``model``: timm's resolved config, updated by what was stored with the weights; the input
    size is ``img_size`` if given, else the ``img_size`` the model was built with (a model built at 32 px is fed
    32 px images), else the stored or default one."""
    from timm.data import resolve_model_data_config

    cfg = dict(resolve_model_data_config(model))
    spec = spec or {}
    cfg.update(spec.get("data_config") or {})
    size = img_size or (spec.get("config") or {}).get("img_size")
    if size:
        size = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
        cfg["input_size"] = (3, *size)
    cfg["input_size"] = tuple(cfg["input_size"])
    from ..utils.memory import check_memory, image_batch_bytes
    _, h, w = cfg["input_size"]
    check_memory(image_batch_bytes(1, h, w), f"an input of {h}x{w} pixels")
    return cfg


def normalize_images(x: torch.Tensor, data_config: Mapping[str, Any]) -> torch.Tensor:
    """(N, 3, H, W) images in [0, 1] → normalized with the config's mean and std."""
    mean = torch.tensor(data_config["mean"], dtype=x.dtype).view(1, -1, 1, 1)
    std = torch.tensor(data_config["std"], dtype=x.dtype).view(1, -1, 1, 1)
    return (x - mean) / std
