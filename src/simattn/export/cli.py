"""``simattn export``: ONNX, ExecuTorch or Core ML export with a parity check in its runtime, an exp-op audit,
int8 quantization (dynamic or static) and a softmax latency comparison.

Examples::

    simattn export --model sima_deit_small_patch16_224 --model-kwargs act_layer=relu --require-exp-free
    simattn export --weights runs/digits/best.safetensors --compare-softmax --quantize
    simattn export --weights W.safetensors --format executorch --quantize static -o m8.pte
    simattn export --weights W.safetensors --format coreml --precision fp16 -o m.mlpackage

With ``--quantize``, ``-o`` is the int8 file. The JSON report goes beside ``-o`` under its whole name plus ``.json``
(``m.pte.json``), so exports of one model to several formats keep their own reports. ExecuTorch and Core ML graphs
are captured at one fixed input size.
Exit status: 0 on success, 1 when parity or ``--require-exp-free`` fails, 2 on bad input (nothing written).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["main", "build_parser", "FORMATS", "QUANTIZE_MODES", "check_options", "side_file"]

FORMATS = ("onnx", "executorch", "coreml")
#: format → file suffix
SUFFIXES = {"onnx": ".onnx", "executorch": ".pte", "coreml": ".mlpackage"}
#: format → --quantize modes it has
QUANTIZE_MODES = {"onnx": ("dynamic", "static"), "executorch": ("dynamic", "static"), "coreml": ()}
PRECISIONS = ("fp32", "fp16")
DEFAULT_CALIB_IMAGES, MAX_CALIB_IMAGES = 128, 100_000


def side_file(output: Path, suffix: str) -> Path:
    """A file an export writes beside ``output``, named after its whole name (``m.pte`` → ``m.pte.json``), so the
    exports of one model to several formats (``m.onnx``, ``m.pte``, ``m.mlpackage``) keep their own reports."""
    return output.with_name(output.name + suffix)


def _check_opset(opset: int) -> Optional[str]:
    from onnx.defs import onnx_opset_version
    if opset > onnx_opset_version():
        return f"allowed: 18 to {onnx_opset_version()} (the newest opset the installed onnx knows)"
    return None


def _options() -> Dict[str, Dict[str, Any]]:
    """The export options by group, declared through the option mechanism (checked by :func:`check_options`)."""
    from ..data.factory import DATASETS
    from ..utils.recipe import Opt, maybe
    return {
        "model": {
            "img_size": Opt(None, "export resolution (default: the model's)", type=maybe(int), low=16),
        },
        "export": {
            "format": Opt("onnx", "onnx (onnxruntime), executorch (.pte, XNNPACK delegate) or coreml (.mlpackage, "
                                  "mlprogram)", choices=list(FORMATS)),
            "opset": Opt(18, "ONNX opset", low=18, check=_check_opset),
            "exporter": Opt("auto", "torch.onnx exporter; auto = dynamo, falling back to TorchScript",
                            choices=["auto", "dynamo", "torchscript"]),
            "static_spatial": Opt(False, "fix height/width (batch stays dynamic; no position-embedding resample in "
                                         "the graph)"),
            "batch": Opt(2, "--format onnx: example batch for export and parity (ExecuTorch and Core ML programs "
                            "take one image)", low=2),
            "atol": Opt(1e-4, "max |runtime - PyTorch| allowed (onnx, executorch)", low=0.0),
        },
        "audit, latency, quantization": {
            "require_exp_free": Opt(False, "fail (exit 1, nothing written) if the graph has any exp-like op"),
            "compare_softmax": Opt(False, "also export the same architecture with softmax attention "
                                          "(<output>.softmax.onnx) and compare onnxruntime latency"),
            "threads": Opt(1, "runtime threads for parity and timing (onnx, executorch)", low=1),
            "bench_batch": Opt(1, "--compare-softmax: batch size for latency", low=1),
            "bench_time": Opt(1.0, "--compare-softmax: seconds of timed runs per model and round, at least 20 runs",
                              low=0.0, low_open=True),
            "quantize": Opt(None, "int8 matmul-type layers (linear/conv/matmul; adds, norms and SimA's "
                                  "normalization stay float), onnx and executorch; bare --quantize is dynamic; the "
                                  "int8 file is -o", type=maybe(str), choices=["dynamic", "static"], const="dynamic"),
            "calib_data": Opt(None, "--quantize static: images to calibrate on, any dataset train reads (train "
                                    "split; default digits)", type=maybe(str), choices=list(DATASETS)),
            "calib_dir": Opt(None, "--calib-data root folder (not used by digits)", type=maybe(str)),
            "calib_images": Opt(None, f"--quantize static: calibration images (default {DEFAULT_CALIB_IMAGES})",
                                type=maybe(int), low=1, high=MAX_CALIB_IMAGES),
            "precision": Opt(None, "--format coreml: compute precision (default fp32; Core ML's own default is "
                                   "fp16)", type=maybe(str), choices=list(PRECISIONS)),
        },
    }


def build_parser() -> argparse.ArgumentParser:
    from ..models.factory import add_model_arguments
    from ..utils.recipe import add_option_flags

    p = argparse.ArgumentParser(prog="simattn export", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {name: p.add_argument_group(name) for name in _options()}
    add_model_arguments(groups["model"])
    groups["export"].add_argument("-o", "--output",
                                  help="output file (default: runs/export/<model>[_int8].{onnx,pte,mlpackage})")
    groups["export"].add_argument("--report", help="JSON report (default: the output's whole name + .json: "
                                                   "m.onnx.json, m.pte.json, m.mlpackage.json)")
    for name, specs in _options().items():
        add_option_flags(groups[name], specs)
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


def check_options(args: argparse.Namespace) -> Dict[str, Any]:
    """Every option checked before any work, one-line ValueErrors naming the option, the value and what is
    allowed; returns what the run needs of them (``format``, ``quantize``, ``output``, ``calibration`` dataset)."""
    from ..utils.recipe import checked_flags
    for specs in _options().values():
        vars(args).update(checked_flags(args, specs))
    fmt = args.format
    mode = args.quantize
    if mode is not None and mode not in QUANTIZE_MODES[fmt]:
        raise ValueError(f"--quantize {mode} is not available for --format {fmt}; it has "
                         f"{', '.join(QUANTIZE_MODES[fmt]) or 'no int8 mode'}"
                         + (" (use --precision fp16 for a smaller model)" if fmt == "coreml" else ""))
    if args.precision is not None and fmt != "coreml":
        raise ValueError(f"--precision applies to --format coreml, not {fmt}")
    calib_given = [o for o, v in (("--calib-data", args.calib_data), ("--calib-dir", args.calib_dir),
                                  ("--calib-images", args.calib_images)) if v is not None]
    if calib_given and mode != "static":
        raise ValueError(f"{', '.join(calib_given)} applies to --quantize static only")
    from ..data.factory import DATASETS
    if args.calib_dir is not None and DATASETS[args.calib_data or "digits"] == "digits":
        raise ValueError(f"--calib-dir {args.calib_dir}: the calibration data is "
                         f"{args.calib_data or 'digits (the default)'}, which reads no folder; name the data in it "
                         "with --calib-data (folder, imagenet, cifar10 or cifar100)")
    defaults = {name: spec.default for specs in _options().values() for name, spec in specs.items()}

    def changed(*names: str) -> List[str]:
        return ["--" + n.replace("_", "-") for n in names if getattr(args, n) != defaults[n]]

    if fmt != "onnx":
        onnx_only = [o for o, given in (("--compare-softmax", args.compare_softmax),
                                        ("--static-spatial", args.static_spatial),
                                        ("--exporter", args.exporter != "auto"), ("--opset", args.opset != 18))
                     if given]
        if onnx_only:
            raise ValueError(f"{', '.join(onnx_only)} applies to --format onnx, not {fmt}")
        if changed("batch"):
            raise ValueError(f"--batch {args.batch} applies to --format onnx (the example batch of its dynamic "
                             f"batch axis); --format {fmt} programs take one image, as devices run them")
    if fmt == "coreml" and changed("atol", "threads"):
        raise ValueError(f"{', '.join(changed('atol', 'threads'))} applies to the parity check, which --format "
                         "coreml does not run here (Core ML runs on macOS/iOS only)")
    if not args.compare_softmax and changed("bench_batch", "bench_time"):
        raise ValueError(f"{', '.join(changed('bench_batch', 'bench_time'))} applies to --compare-softmax only")
    output = Path(args.output) if args.output else None
    if output is not None:
        if output.suffix.lower() != SUFFIXES[fmt]:
            raise ValueError(f"-o {output}: a --format {fmt} file ends with {SUFFIXES[fmt]}")
        if args.weights and output.resolve() == Path(args.weights).resolve():
            raise ValueError(f"-o {output} is the --weights file; choose another output")
        if output.is_dir() and fmt != "coreml":
            raise ValueError(f"-o {output} is a folder")
        if fmt == "coreml" and output.exists() and not output.is_dir():
            raise ValueError(f"-o {output} exists and is not an .mlpackage folder")
    calibration = None
    if mode == "static":
        from ..data.calibration import open_calibration_dataset

        calibration = open_calibration_dataset(args.calib_data or "digits", args.calib_dir, "train")
    elif args.calib_dir is not None:
        raise ValueError("--calib-dir applies to --quantize static only")
    return {"format": fmt, "quantize": mode, "output": output, "calibration": calibration}


def run(args: argparse.Namespace) -> int:
    opts = check_options(args)
    import torch

    from ..utils.io import atomic_write_json
    from ..models.factory import parse_model_kwargs
    from ..data.images import resolve_data_config
    from ..models.factory import load_model
    from .architecture import attention_kind

    fmt, mode = opts["format"], opts["quantize"]
    model, spec = load_model(args.model, args.weights, parse_model_kwargs(args.model_kwargs), args.use_ema)
    data_config = resolve_data_config(model, spec, args.img_size)
    input_size = tuple(data_config["input_size"])
    suffix = ("_int8" if mode else "") + SUFFIXES[fmt]
    output = opts["output"] or Path("runs/export") / f"{spec['model']}{suffix}"
    report_path = Path(args.report) if args.report else side_file(output, ".json")
    if args.report and report_path.resolve() in (output.resolve(), Path(args.weights or output).resolve()):
        raise ValueError(f"--report {report_path} is the output or the weights file; choose another path")
    kind = attention_kind(model)
    if args.compare_softmax and kind == "softmax":
        raise ValueError("--compare-softmax: the model already uses softmax attention")
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"model {spec['model']} ({n_params:.2f}M params, attention {kind}), input {'x'.join(map(str, input_size))}"
          f", weights {spec['weights'] or 'random'}; format {fmt}" + (f", int8 {mode}" if mode else ""))
    report: Dict[str, Any] = {"model": spec["model"], "model_kwargs": spec["config"], "weights": spec["weights"],
                              "attention": kind, "params_m": round(n_params, 3), "data_config": data_config,
                              "format": fmt, "quantize": mode, "output": str(output)}
    from ..utils.onnx import onnx_metadata
    classes = (spec.get("extra") or {}).get("classes")
    metadata = onnx_metadata(spec["model"], kind, data_config, spec["config"],
                             classes=classes if isinstance(classes, list) and classes else None)
    calibration = None
    if mode == "static":
        from ..data.calibration import calibration_images

        count = args.calib_images or DEFAULT_CALIB_IMAGES
        calibration = calibration_images(opts["calibration"], data_config, count)
        report["calibration"] = {"dataset": args.calib_data or "digits", "split": "train",
                                 "images": len(calibration)}
        print(f"calibration: {len(calibration)} images of {args.calib_data or 'digits'} (train), preprocessed as "
              "the model is evaluated")

    def finish(status: int) -> int:
        atomic_write_json(report, report_path)
        print(f"report: {report_path}")
        return status

    torch.manual_seed(0)
    if fmt == "onnx":
        return finish(_run_onnx(args, model, spec, kind, output, metadata, mode, calibration, report))
    from .edge import export_edge

    return finish(export_edge(model, spec, output, metadata, fmt=fmt, quantize=mode, calibration=calibration,
                              precision=args.precision or "fp32", require_exp_free=args.require_exp_free,
                              atol=args.atol, threads=args.threads, report=report,
                              real_inputs=_real_inputs(data_config)))


def _run_onnx(args, model, spec, kind, output: Path, metadata, mode, calibration, report) -> int:
    """ONNX: export and verify the fp32 graph (to a temporary file when an int8 one is the output), audit,
    compare with softmax, quantize."""
    import tempfile

    from .audit import audit_onnx
    from ..utils.onnx import ExportError, export_and_verify, read_onnx_metadata
    from .architecture import model_stride

    if args.static_spatial:
        from ..models import prepare_for_export

        # one size: the position embedding is resampled once here, not by an antialiased Resize in the graph
        model = prepare_for_export(model, tuple(metadata["input_size"][1:]))
    with tempfile.TemporaryDirectory(prefix="simattn_export_") as work:
        fp32_path = Path(work) / output.name if mode else output
        print(f"exporting to {fp32_path if not mode else 'a temporary fp32 file'} (exporter {args.exporter}, "
              f"opset {args.opset}) ...", flush=True)
        try:
            result, parity = export_and_verify(
                model, fp32_path, metadata, real_inputs=_real_inputs, batch=args.batch, opset=args.opset,
                exporter=args.exporter, dynamic_spatial=not args.static_spatial, stride=model_stride(model),
                atol=args.atol, threads=args.threads)
        except ExportError as e:
            if e.parity is not None:
                report.update(export=e.result.to_dict(), parity=e.parity)
                _print_parity(e.parity)
                print(f"simattn export: {e}", file=sys.stderr)
                return 1
            raise
        for note in result.notes:
            print(f"  note: {note}")
        print(f"  {result.exporter} exporter, {result.seconds:.1f} s; input {result.input_shape} (dynamic batch"
              f"{', dynamic height/width' if result.dynamic_spatial else ', fixed height/width'})")
        print(f"parity onnxruntime vs PyTorch (atol {args.atol:g}):")
        _print_parity(parity)
        report.update(export=result.to_dict(), parity=parity, metadata=read_onnx_metadata(fp32_path),
                      max_abs_diff=max(r["max_abs_diff"] for r in parity.values()))
        print("metadata: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in report["metadata"].items()))

        audit = audit_onnx(fp32_path)
        report["audit"] = audit.to_dict()
        print("graph audit (ops, functions expanded, subgraphs included):")
        print(audit.format())
        if args.require_exp_free and audit.exp_like:
            if fp32_path.exists() and not mode:
                fp32_path.unlink()
            print(f"simattn export: --require-exp-free: {spec['model']} is not exp-free: the graph contains "
                  f"{audit.describe_exp_like()}; nothing written", file=sys.stderr)
            report["exp_free_check"] = "failed"
            return 1
        if args.require_exp_free:
            report["exp_free_check"] = "passed"
            print("exp-free: yes")

        if args.compare_softmax:
            report["latency"] = _compare_softmax(args, spec, fp32_path, output, metadata, result, kind)
        if mode:
            report["quantization"] = _quantize(args, fp32_path, output, model, mode, calibration)
    return 0


def _compare_softmax(args, spec, fp32_path: Path, output: Path, metadata, result, kind) -> Dict[str, Any]:
    from ..utils.onnx import export_and_verify
    from .latency import compare_latency
    from .architecture import softmax_twin

    twin_path = side_file(output, ".softmax.onnx")
    print(f"exporting the softmax twin to {twin_path} ...", flush=True)
    twin = softmax_twin(spec)
    # Same exporter and the same dynamic axes, so both graphs are built alike.
    twin_result, _ = export_and_verify(twin, twin_path, {**metadata, "attention": "softmax"}, batch=args.batch,
                                       opset=args.opset,
                                       exporter=result.exporter, dynamic_spatial=result.dynamic_spatial,
                                       atol=args.atol)
    print(f"onnxruntime CPU latency, batch {args.bench_batch}, {args.threads} thread(s) ...", flush=True)
    lat = compare_latency(fp32_path, twin_path, batch=args.bench_batch, threads=args.threads,
                          min_time=args.bench_time)
    m, b = lat["model"], lat["baseline"]
    print(f"  input {'x'.join(map(str, lat['input_shape']))} (from the files' metadata)")
    print(f"  {kind}: {m['median_ms']:.3f} ms (p10 {m['p10_ms']:.3f}, p90 {m['p90_ms']:.3f})   softmax: "
          f"{b['median_ms']:.3f} ms (p10 {b['p10_ms']:.3f}, p90 {b['p90_ms']:.3f})   {kind} speed-up over softmax: "
          f"×{lat['baseline_over_model']:.2f}")
    lat.update(model_attention=kind, baseline_attention="softmax", baseline_exporter=twin_result.exporter)
    return lat


def _quantize(args, fp32_path: Path, output: Path, model, mode: str, calibration) -> Dict[str, Any]:
    from .quantize import quantization_report, quantize_int8, quantize_static_int8

    print(f"int8 {mode} quantization (MatMul/Gemm/Conv{', per-channel' if mode == 'static' else ''}) to {output} ...",
          flush=True)
    if mode == "static":
        quantize_static_int8(fp32_path, output, calibration)
    else:
        quantize_int8(fp32_path, output)
    num_classes = getattr(model, "num_classes", None)
    if num_classes != 10:
        print(f"  accuracy not measured: the model has {num_classes} classes; the digits data has 10 "
              "(pass weights trained on digits)")
        return {"mode": mode, "int8_path": str(output), "accuracy": None}
    if not args.weights:
        print("  warning: random weights; the accuracies below are near chance")
    q = quantization_report(fp32_path, output, threads=args.threads)
    print(f"  digits val ({q['images']} images): fp32 top-1 {q['fp32_top1']:.2f}%  int8 top-1 {q['int8_top1']:.2f}%"
          f"  (Δ {q['delta_top1']:+.2f}, agreement {q['prediction_agreement']:.1f}%), "
          f"{q['fp32_mb']:.2f} MB → {q['int8_mb']:.2f} MB")
    return {"mode": mode, **q}


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
        from ..utils.extras import EXTRAS, missing_extra

        top = (e.name or "").split(".")[0]
        if top in EXTRAS:
            print(f"simattn export: error: {missing_extra(top, f'simattn export --format {args.format}')}",
                  file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
