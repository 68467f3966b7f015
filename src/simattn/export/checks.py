"""What ``simattn export`` measures on the file it wrote, through the file's runtime (:mod:`simattn.deploy`): parity
with the PyTorch model, and the accuracy int8 costs on the embedded digits data."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch
from torch import nn

from ..deploy import Format
from ..deploy.base import first_line

__all__ = ["real_inputs", "digits_eval_tensors", "compare_outputs", "parity", "quantization_report"]


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
    """Real images for the parity check: 8 digits (val split) and the scikit-image astronaut photo."""
    from ..data.images import image_tensor, load_image

    digits, _ = digits_eval_tensors(data_config)
    photo, _ = image_tensor(load_image("skimage:astronaut"), data_config)
    return {"digits_val_8": digits[:8], "photo_astronaut": photo}


def compare_outputs(ref: torch.Tensor, out: torch.Tensor) -> Dict[str, float]:
    """Max |difference|, cosine similarity and argmax agreement (%) of two (N, classes) outputs, or of two
    (N, classes, H, W) segmentation logits (the class argmax per pixel)."""
    ref, out = ref.float(), out.float()
    dim = 1 if ref.dim() == 4 else -1
    return {"max_abs_diff": float((ref - out).abs().max()),
            "cosine": float(torch.nn.functional.cosine_similarity(ref.flatten(), out.flatten(), dim=0)),
            "argmax_agreement": float((ref.argmax(dim) == out.argmax(dim)).float().mean() * 100)}


def parity(fmt: Format, path: Path, model: nn.Module, inputs: Mapping[str, torch.Tensor], atol: float,
           threads: Optional[int], quantized: bool) -> Dict[str, Dict[str, Any]]:
    """The file run in its runtime against ``model`` on each input: ``ok`` when within ``atol`` (relative to the
    outputs' scale, ``max(1, max |logit|)``, for formats whose runtime sums in another order); int8 files are
    reported, not judged (their accuracy is what validate measures)."""
    program = fmt.open(path, threads)
    results: Dict[str, Dict[str, Any]] = {}
    for name, x in inputs.items():
        entry: Dict[str, Any] = {"shape": list(x.shape)}
        with torch.no_grad():
            ref = model(x)
        ref = ref if isinstance(ref, torch.Tensor) else ref[0]
        try:
            with torch.no_grad():
                out = program(x)
        except Exception as e:  # runtimes raise their own types for inputs they cannot take
            entry.update(ok=False, error=first_line(e))
        else:
            entry.update(compare_outputs(ref, out) if out.shape == ref.shape else {"max_abs_diff": float("inf")})
            bound = atol * max(1.0, float(ref.abs().max())) if fmt.relative_atol else atol
            entry["ok"] = bool(quantized or entry["max_abs_diff"] <= bound)
        results[name] = entry
    return results


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
