"""int8 dynamic quantization with onnxruntime, and the accuracy it costs on the embedded digits data."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import numpy as np
import torch

from ..utils.io import atomic_path
from ..utils.onnx import (QDQ_OP_TYPES, metadata_data_config, ort_session, quantize_static_int8, quiet_loggers,
                          read_onnx_metadata, run_onnx)

__all__ = ["quantize_int8", "quantize_static_int8", "QDQ_OP_TYPES", "onnx_top1", "digits_eval_tensors",
           "quantization_report"]


def quantize_int8(src: str | Path, dst: str | Path) -> Path:
    """Write an int8 dynamically quantized copy of the ONNX model ``src`` (weights int8, activations quantized at
    run time) to ``dst`` (atomically), with ``onnxruntime.quantization.quantize_dynamic``; ``src``'s simattn
    metadata is carried over."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    proto = onnx.load(str(src))
    # The dynamo exporter records value_info for initializers too; the quantizer transposes Gemm weights into
    # MatMul ones and its shape inference then trips over the stale [out, in] shapes. Inference recomputes them.
    del proto.graph.value_info[:]
    dst = Path(dst)
    # quantize_dynamic logs a pre-processing advice on the root logger at WARNING for every call
    with atomic_path(dst) as tmp:
        with quiet_loggers(""):
            # 7-bit weights: the same answers on AVX2 (saturating u8×s8 sums) as on VNNI CPUs
            quantize_dynamic(proto, str(tmp), weight_type=QuantType.QInt8, reduce_range=True)
        quantized = onnx.load(str(tmp))
        keys = {p.key for p in quantized.metadata_props}
        quantized.metadata_props.extend(p for p in proto.metadata_props if p.key not in keys)
        onnx.save(quantized, str(tmp))
    return dst


def digits_eval_tensors(data_config: Mapping[str, Any], split: str = "val"):
    """The digits split at the model's input size, normalized with the model's mean/std: (images, labels)."""
    from ..data.digits import digits_tensors
    from ..data.images import normalize_images

    _, h, w = data_config["input_size"]
    x, y = digits_tensors(split, img_size=h, normalize=False)
    if w != h:
        x = torch.nn.functional.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
    return normalize_images(x, data_config), y


def onnx_top1(session, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 64) -> Dict[str, Any]:
    """Top-1 accuracy (%) of an onnxruntime session and its predictions."""
    preds = np.concatenate([run_onnx(session, images[i:i + batch_size]).argmax(-1)
                            for i in range(0, len(images), batch_size)])
    return {"top1": float((preds == labels.numpy()).mean() * 100.0), "preds": preds}


def quantization_report(fp32_path: str | Path, int8_path: str | Path,
                        threads: Optional[int] = None) -> Dict[str, Any]:
    """fp32 vs int8 top-1 on the digits val split (at the input size and mean/std in ``fp32_path``'s metadata),
    their prediction agreement and the file sizes."""
    images, labels = digits_eval_tensors(metadata_data_config(read_onnx_metadata(fp32_path)))
    fp32 = onnx_top1(ort_session(fp32_path, threads), images, labels)
    int8 = onnx_top1(ort_session(int8_path, threads), images, labels)
    return {
        "dataset": "digits/val", "images": len(labels),
        "fp32_top1": round(fp32["top1"], 3), "int8_top1": round(int8["top1"], 3),
        "delta_top1": round(int8["top1"] - fp32["top1"], 3),
        "prediction_agreement": round(float((fp32["preds"] == int8["preds"]).mean() * 100.0), 3),
        "fp32_mb": round(Path(fp32_path).stat().st_size / 2 ** 20, 3),
        "int8_mb": round(Path(int8_path).stat().st_size / 2 ** 20, 3),
        "int8_path": str(int8_path),
    }
