"""``simattn export``: ONNX export, onnxruntime parity, exp-op audit, softmax latency comparison, int8 quantization.

Examples::

    simattn export --model sima_deit_small_patch16_224 --model-kwargs act_layer=relu --require-exp-free
    simattn export --weights runs/digits/best.safetensors --compare-softmax --quantize

Exit status: 0 on success, 1 when parity or ``--require-exp-free`` fails, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from ..models.factory import add_model_arguments

    p = argparse.ArgumentParser(prog="simattn export", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("model")
    add_model_arguments(src)
    src.add_argument("--img-size", type=int, help="export resolution (default: the model's)")
    out = p.add_argument_group("export")
    out.add_argument("-o", "--output", help="ONNX file (default: runs/export/<model>.onnx)")
    out.add_argument("--report", help="JSON report (default: the ONNX path with .json)")
    out.add_argument("--opset", type=int, default=18, help="ONNX opset, >= 18 (default 18)")
    out.add_argument("--exporter", choices=("auto", "dynamo", "torchscript"), default="auto",
                     help="torch.onnx exporter; auto = dynamo, falling back to TorchScript (default auto)")
    out.add_argument("--static-spatial", action="store_true", help="fix height/width (batch stays dynamic)")
    out.add_argument("--batch", type=int, default=2, help="example batch for export and parity (default 2)")
    out.add_argument("--atol", type=float, default=1e-4, help="max |onnxruntime - PyTorch| allowed (default 1e-4)")
    chk = p.add_argument_group("audit, latency, quantization")
    chk.add_argument("--require-exp-free", action="store_true",
                     help="fail (exit 1, ONNX file removed) if the graph has any exp-like op")
    chk.add_argument("--compare-softmax", action="store_true",
                     help="also export the same architecture with softmax attention and compare onnxruntime latency")
    chk.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads for timing (default 1)")
    chk.add_argument("--bench-batch", type=int, default=1, help="batch size for latency (default 1)")
    chk.add_argument("--bench-time", type=float, default=1.0,
                     help="seconds of timed runs per model and round, at least 20 runs (default 1.0)")
    chk.add_argument("--quantize", action="store_true",
                     help="int8 dynamic quantization; accuracy fp32 vs int8 on the digits val split (10-class weights)")
    return p


def _print_parity(parity: Dict[str, Dict[str, Any]]) -> None:
    for name, r in parity.items():
        shown = r.get("error") or f"max abs diff {r['max_abs_diff']:.3g}"
        print(f"  {name:<28} {'x'.join(map(str, r['shape'])):<14} {shown}  {'ok' if r['ok'] else 'FAIL'}")


def _real_inputs(data_config) -> Dict[str, Any]:
    """Real images for the parity check: 8 digits (val split) and the scikit-image astronaut photo."""
    from ..data.images import image_tensor, load_image
    from .quantize import digits_eval_tensors

    digits, _ = digits_eval_tensors(data_config)
    photo, _ = image_tensor(load_image("skimage:astronaut"), data_config)
    return {"digits_val_8": digits[:8], "photo_astronaut": photo}


def run(args: argparse.Namespace) -> int:
    import torch

    from ..utils.io import atomic_write_json
    from .audit import audit_onnx
    from ..models.factory import parse_model_kwargs
    from ..data.images import resolve_data_config
    from ..models.factory import load_model
    from ..utils.onnx import ExportError, export_and_verify, onnx_metadata, read_onnx_metadata
    from .loading import attention_kind, model_stride

    model, spec = load_model(args.model, args.weights, parse_model_kwargs(args.model_kwargs), args.use_ema)
    data_config = resolve_data_config(model, spec, args.img_size)
    input_size = tuple(data_config["input_size"])
    output = Path(args.output or Path("runs/export") / f"{spec['model']}.onnx")
    report_path = Path(args.report) if args.report else output.with_suffix(".json")
    kind = attention_kind(model)
    if args.compare_softmax and kind == "softmax":
        raise ValueError("--compare-softmax: the model already uses softmax attention")
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"model {spec['model']} ({n_params:.2f}M params, attention {kind}), input {'x'.join(map(str, input_size))}"
          f", weights {spec['weights'] or 'random'}")
    report: Dict[str, Any] = {"model": spec["model"], "model_kwargs": spec["config"], "weights": spec["weights"],
                              "attention": kind, "params_m": round(n_params, 3), "data_config": data_config}
    metadata = onnx_metadata(spec["model"], kind, data_config, spec["config"])

    def finish(status: int) -> int:
        atomic_write_json(report, report_path)
        print(f"report: {report_path}")
        return status

    torch.manual_seed(0)
    print(f"exporting to {output} (exporter {args.exporter}, opset {args.opset}) ...", flush=True)
    try:
        result, parity = export_and_verify(
            model, output, metadata, real_inputs=_real_inputs, batch=args.batch, opset=args.opset,
            exporter=args.exporter, dynamic_spatial=not args.static_spatial, stride=model_stride(model),
            atol=args.atol)
    except ExportError as e:
        if e.parity is not None:
            report.update(export=e.result.to_dict(), parity=e.parity)
            _print_parity(e.parity)
            print(f"simattn export: {e}", file=sys.stderr)
            return finish(1)
        raise
    for note in result.notes:
        print(f"  note: {note}")
    print(f"  {result.exporter} exporter, {result.seconds:.1f} s; input {result.input_shape} (dynamic batch"
          f"{', dynamic height/width' if result.dynamic_spatial else ', fixed height/width'})")
    print(f"parity onnxruntime vs PyTorch (atol {args.atol:g}):")
    _print_parity(parity)
    report.update(export=result.to_dict(), parity=parity, metadata=read_onnx_metadata(output),
                  max_abs_diff=max(r["max_abs_diff"] for r in parity.values()))
    print("metadata: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in report["metadata"].items()))

    audit = audit_onnx(output)
    report["audit"] = audit.to_dict()
    print("graph audit (ops, functions expanded, subgraphs included):")
    print(audit.format())
    if args.require_exp_free and audit.exp_like:
        output.unlink()
        print(f"simattn export: --require-exp-free: {spec['model']} is not exp-free: the graph contains "
              f"{audit.describe_exp_like()}; removed {output}", file=sys.stderr)
        report["exp_free_check"] = "failed"
        return finish(1)
    if args.require_exp_free:
        report["exp_free_check"] = "passed"
        print("exp-free: yes")

    if args.compare_softmax:
        report["latency"] = _compare_softmax(args, spec, output, metadata, result, kind)
    if args.quantize:
        report["quantization"] = _quantize(args, output, model)
    return finish(0)


def _compare_softmax(args, spec, output: Path, metadata, result, kind) -> Dict[str, Any]:
    from ..utils.onnx import export_and_verify
    from .latency import compare_latency
    from .loading import softmax_twin

    twin_path = output.with_name(f"{output.stem}_softmax.onnx")
    print(f"exporting the softmax twin to {twin_path} ...", flush=True)
    twin = softmax_twin(spec)
    # Same exporter and the same dynamic axes, so both graphs are built alike.
    twin_result, _ = export_and_verify(twin, twin_path, {**metadata, "attention": "softmax"}, batch=args.batch,
                                       opset=args.opset,
                                       exporter=result.exporter, dynamic_spatial=result.dynamic_spatial,
                                       atol=args.atol)
    print(f"onnxruntime CPU latency, batch {args.bench_batch}, {args.threads} thread(s) ...", flush=True)
    lat = compare_latency(output, twin_path, batch=args.bench_batch, threads=args.threads,
                          min_time=args.bench_time)
    m, b = lat["model"], lat["baseline"]
    print(f"  input {'x'.join(map(str, lat['input_shape']))} (from the files' metadata)")
    print(f"  {kind}: {m['median_ms']:.3f} ms (p10 {m['p10_ms']:.3f}, p90 {m['p90_ms']:.3f})   softmax: "
          f"{b['median_ms']:.3f} ms (p10 {b['p10_ms']:.3f}, p90 {b['p90_ms']:.3f})   {kind} speed-up over softmax: "
          f"×{lat['baseline_over_model']:.2f}")
    lat.update(model_attention=kind, baseline_attention="softmax", baseline_exporter=twin_result.exporter)
    return lat


def _quantize(args, output: Path, model) -> Dict[str, Any]:
    from .quantize import quantization_report, quantize_int8

    int8_path = output.with_name(f"{output.stem}_int8.onnx")
    print(f"int8 dynamic quantization to {int8_path} ...", flush=True)
    quantize_int8(output, int8_path)
    num_classes = getattr(model, "num_classes", None)
    if num_classes != 10:
        print(f"  accuracy not measured: the model has {num_classes} classes; the digits data has 10 "
              "(pass weights trained on digits)")
        return {"int8_path": str(int8_path), "accuracy": None}
    if not args.weights:
        print("  warning: random weights; the accuracies below are near chance")
    q = quantization_report(output, int8_path, threads=args.threads)
    print(f"  digits val ({q['images']} images): fp32 top-1 {q['fp32_top1']:.2f}%  int8 top-1 {q['int8_top1']:.2f}%"
          f"  (Δ {q['delta_top1']:+.2f}, agreement {q['prediction_agreement']:.1f}%), "
          f"{q['fp32_mb']:.2f} MB → {q['int8_mb']:.2f} MB")
    return q


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``simattn export``; returns the exit status."""
    args = build_parser().parse_args(argv)
    from ..utils.onnx import ExportError
    try:
        return run(args)
    except ExportError as e:
        print(f"simattn export: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in ("onnx", "onnxruntime", "onnxscript", "skimage"):
            print(f"simattn export: {e.name} is not installed: pip install 'simattn[export,viz]'", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
