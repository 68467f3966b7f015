"""What ``simattn export`` measures on the file it wrote beyond parity (:mod:`simattn.deploy.pipeline` checks that):
the real images the parity check runs on, and the accuracy int8 costs on the embedded digits data."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch

from ..deploy import Format

__all__ = ["real_inputs", "digits_eval_tensors", "quantization_report"]


def digits_eval_tensors(data_config: Mapping[str, Any], split: str = "val"):
    """The digits split at the model's input size, normalized with the model's mean/std: (images, labels)."""
    from ..data.digits import digits_tensors
    from ..data.images import normalize_images

    _, h, w = data_config["input_size"]
    x, y = digits_tensors(split, img_size=h, normalize=False)
    if w != h:
        x = torch.nn.functional.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
    return normalize_images(x, data_config), y


def real_inputs(data_config: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """Real images for the parity check: 8 digits (val split) and a photo; both ship with scikit-learn, a core
    dependency, so the check needs nothing beyond the format's runtime."""
    from ..data.images import image_tensor, load_image

    digits, _ = digits_eval_tensors(data_config)
    photo, _ = image_tensor(load_image("sklearn:china.jpg"), data_config)
    return {"digits_val_8": digits[:8], "photo_china": photo}


def _top1(program, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 64) -> Dict[str, Any]:
    with torch.no_grad():
        preds = torch.cat([program(images[i:i + batch_size]).argmax(-1) for i in range(0, len(images), batch_size)])
    return {"top1": float((preds == labels).float().mean() * 100.0), "preds": preds}


def _size_mb(fmt: Format, path: Path) -> float:
    files = [p for f in fmt.files(path) for p in ([f] if f.is_file() else f.rglob("*")) if p.is_file()]
    return round(sum(p.stat().st_size for p in files) / 2 ** 20, 3)


def quantization_report(fmt: Format, fp32_path: Path, int8_path: Path, threads: Optional[int] = None,
                        shown_path: Optional[Path] = None) -> Dict[str, Any]:
    """fp32 vs int8 top-1 on the digits val split (at the input size and mean/std the fp32 file records), their
    prediction agreement and the file sizes; ``shown_path`` is where the int8 file ends up."""
    images, labels = digits_eval_tensors(fmt.read_metadata(fp32_path).data_config)
    fp32 = _top1(fmt.open(fp32_path, threads), images, labels)
    int8 = _top1(fmt.open(int8_path, threads), images, labels)
    return {
        "dataset": "digits/val", "images": len(labels),
        "fp32_top1": round(fp32["top1"], 3), "int8_top1": round(int8["top1"], 3),
        "delta_top1": round(int8["top1"] - fp32["top1"], 3),
        "prediction_agreement": round(float((fp32["preds"] == int8["preds"]).float().mean() * 100.0), 3),
        "fp32_mb": _size_mb(fmt, fp32_path), "int8_mb": _size_mb(fmt, int8_path),
        "int8_path": str(shown_path or int8_path),
    }
