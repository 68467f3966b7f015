"""``simattn export``: a model written in any format of :mod:`simattn.deploy` (ONNX, ExecuTorch, Core ML, OpenVINO,
TFLite), with a parity check in its runtime, an exp-op audit, int8 quantization and a softmax latency comparison.

Examples::

    simattn export --model sima_deit_small_patch16_224 --model-kwargs act_layer=relu --require-exp-free
    simattn export --weights runs/digits/best.safetensors --compare-softmax --quantize
    simattn export --weights W.safetensors --format executorch --quantize static -o m8.pte
    simattn export --weights W.safetensors --format coreml --precision fp16 -o m.mlpackage

Segmentation weights (``simattn segment``) export the same way, at the crop they trained on, with the dataset they
record carried into the file (``simattn validate`` scores the file on it), and static int8 calibrated on that
dataset's training images; a classifier's static int8 calibrates on the training split of the data its weights
record (``--calib-data``/``--calib-dir`` name others; digits where the record names none). ONNX keeps a Semantic FPN's height and width dynamic (multiples of 32; DeiT, ReLU-ViT,
XCiT, CvT, SOFT and UFO backbones); UperNet's pyramid pooling is exported for the one size (the exporter checks a
second size and falls back to fixed, saying so), and the other formats take one size: ``simattn validate`` resizes
images to it.

Without ``--format`` the format is the one ``-o``'s suffix names (``-o m.pte``: ExecuTorch), else ONNX. With
``--quantize``, ``-o`` is the int8 file. The JSON report goes beside ``-o`` under its whole name plus ``.json``
(``m.pte.json``), so exports of one model to several formats keep their own reports. An existing ``-o`` or report
is replaced only with ``--overwrite``. Every format but ONNX is
captured at one fixed input size. The file is written in a folder beside ``-o`` and moved there once every check
passed. With ``--format executorch`` or ``onnx`` it prints what runs outside the fast kernels (``not delegated:``,
also in the report). Exit status: 0 on success, 1 when parity, ``--require-exp-free`` or ``--require-delegated``
fails, 2 on bad input (nothing written).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["main", "build_parser", "check_options", "side_file"]

DEFAULT_CALIB_IMAGES, MAX_CALIB_IMAGES = 128, 100_000


def side_file(output: Path, suffix: str) -> Path:
    """A file an export writes beside ``output``, named after its whole name (``m.pte`` → ``m.pte.json``), so the
    exports of one model to several formats (``m.onnx``, ``m.pte``, ``m.mlpackage``) keep their own reports."""
    return output.with_name(output.name + suffix)


#: export options of the command that apply only to the formats with a capability: option → whether a format
#: takes it
GATED_OPTIONS = {
    # one size where the format could keep height and width dynamic
    "static_spatial": lambda fmt: fmt.dynamic_size,
    # the latency of the two files is timed at --bench-batch, a batch a one-image program cannot take in one call
    "compare_softmax": lambda fmt: not fmt.one_image,
}


def _options() -> Dict[str, Dict[str, Any]]:
    """The export options by group, declared through the option mechanism (checked by :func:`check_options`); the
    options only some formats take are declared by those formats (:func:`simattn.deploy.format_options`)."""
    from .. import deploy
    from ..data.factory import DATASETS
    from ..utils.recipe import Opt, maybe
    formats = deploy.formats()
    return {
        "model": {
            "img_size": Opt(None, "export resolution (default: the model's)", type=maybe(int), low=16),
        },
        "export": {
            "format": Opt(None, ", ".join(f"{f.name} ({f.suffixes[0]}, {f.description or f.runtime})"
                                          for f in formats.values()) + "; default: the one -o's suffix names, else "
                          "onnx", type=maybe(str), choices=list(formats)),
            "overwrite": Opt(False, "replace an existing -o and its report (and --compare-softmax's twin file)"),
            "static_spatial": Opt(False, "fix height/width (batch stays dynamic; no position-embedding resample in "
                                         "the graph)"),
            "atol": Opt(1e-4, "max |runtime - PyTorch| allowed (formats that run here)", low=0.0),
        },
        "format options": deploy.format_options(),
        "audit, latency, quantization": {
            "require_exp_free": Opt(False, "fail (exit 1, nothing written) if the graph has any exp-like op"),
            "require_delegated": Opt(False, "fail (exit 1, nothing written) if any op runs outside the runtime's "
                                            "fast kernels: --format executorch, outside the XNNPACK delegate (only "
                                            "the class token's select and expand, one call each, may stay out); "
                                            "--format onnx, a MatMul/Gemm/Conv of an int8 file whose Q/DQ "
                                            "onnxruntime did not fuse into an int8 kernel (a float file runs "
                                            "every op in onnxruntime's CPU provider)"),
            "compare_softmax": Opt(False, "also export the same architecture with softmax attention "
                                          "(<output>.softmax.onnx) and compare onnxruntime latency"),
            "threads": Opt(1, "runtime threads for parity and timing (formats that run here)", low=1),
            "bench_batch": Opt(1, "--compare-softmax: batch size for latency", low=1),
            "bench_time": Opt(1.0, "--compare-softmax: seconds of timed runs per model and round, at least 20 runs",
                              low=0.0, low_open=True),
            "quantize": Opt(None, "int8 matmul-type layers (linear/conv/matmul; adds, norms and SimA's "
                                  "normalization stay float) in " +
                            ", ".join(f.name for f in formats.values() if f.quantize_modes) +
                            "; bare --quantize is dynamic; the int8 file is -o", type=maybe(str),
                            choices=["dynamic", "static"], const="dynamic"),
            "calib_data": Opt(None, "--quantize static: images to calibrate on, any dataset train reads (train "
                                    "split; default: the data the weights record, else digits)", type=maybe(str),
                              choices=list(DATASETS)),
            "calib_dir": Opt(None, "--calib-data root folder (not used by digits; default: the one the weights "
                                   "record with their data)", type=maybe(str)),
            "calib_images": Opt(None, f"--quantize static: calibration images (default {DEFAULT_CALIB_IMAGES})",
                                type=maybe(int), low=1, high=MAX_CALIB_IMAGES),
        },
    }


def build_parser() -> argparse.ArgumentParser:
    from ..models.factory import add_model_arguments
    from ..utils.recipe import add_option_flags, command_parser

    p = command_parser("simattn export", __doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {name: p.add_argument_group(name) for name in _options()}
    add_model_arguments(groups["model"])
    groups["export"].add_argument("-o", "--output",
                                  help="output file (default: runs/export/<model>[_int8] and the format's suffix)")
    groups["export"].add_argument("--report", help="JSON report (default: the output's whole name + .json: "
                                                   "m.onnx.json, m.pte.json, m.mlpackage.json)")
    for name, specs in _options().items():
        add_option_flags(groups[name], specs)
    return p


def _print_parity(parity: Dict[str, Dict[str, Any]]) -> None:
    for name, r in parity.items():
        shown = r.get("error") or f"max abs diff {r['max_abs_diff']:.3g}" + (
            f", cosine {r['cosine']:.5f}, argmax agreement {r['argmax_agreement']:.0f}%" if "cosine" in r else "")
        print(f"  {name:<28} {'x'.join(map(str, r['shape'])):<14} {shown}  {'ok' if r['ok'] else 'FAIL'}")


def _given(args: argparse.Namespace, defaults: Dict[str, Any], names) -> List[str]:
    from ..utils.recipe import flag_name

    return [flag_name(n) for n in names if getattr(args, n) != defaults[n]]


def _refuse_foreign_options(args: argparse.Namespace, fmt) -> None:
    """The options only some formats take (those the formats declare, and :data:`GATED_OPTIONS`), refused where
    ``fmt`` does not take them, naming the formats that do."""
    from .. import deploy
    defaults = {n: spec.default for specs in _options().values() for n, spec in specs.items()}
    owners = {option: deploy.option_takers(option) for option in deploy.format_options()}
    owners.update({option: [f.name for f in deploy.formats().values() if takes(f)]
                   for option, takes in GATED_OPTIONS.items()})
    foreign = [o for o, takers in owners.items() if fmt.name not in takers and o != "batch"]
    for takers in dict.fromkeys(tuple(owners[o]) for o in foreign):
        given = _given(args, defaults, [o for o in foreign if tuple(owners[o]) == takers])
        if given:
            raise ValueError(f"{', '.join(given)} applies to --format {' or '.join(takers)}, not {fmt.name}")
    if "batch" in owners and "batch" not in fmt.options and _given(args, defaults, ["batch"]):
        raise ValueError(f"--batch {args.batch} applies to --format {' or '.join(owners['batch'])} (the example "
                         f"batch of its dynamic batch axis); --format {fmt.name} programs take one image, as "
                         "devices run them")


def _output_format(name: Optional[str], output: Optional[str]):
    """The format to write: ``--format`` (``name``), else the one whose suffix ``-o`` has (the registry's suffix
    map; a one-line ValueError when no format has it), else ONNX. :func:`_check_suffix` checks ``-o`` against it."""
    from .. import deploy
    by_suffix = deploy.for_path(output) if output else None
    if name is None and output and by_suffix is None:
        known = ", ".join(f"{s} ({f.name})" for f in deploy.formats().values() for s in f.suffixes)
        raise ValueError(f"-o {output}: no format writes {Path(output).suffix or 'a file without a suffix'}; end it "
                         f"with {known}, or give --format")
    return deploy.get(name) if name is not None else by_suffix or deploy.get("onnx")


def _format_words(fmt, given: Optional[str], output: Optional[str]) -> str:
    """How the command chose ``fmt``, for a message: as typed, from ``-o``'s suffix, or by default."""
    if given is not None:
        return f"simattn export --format {given}"
    if output:
        return f"simattn export -o {output} (format {fmt.name}, from its suffix)"
    return f"simattn export (format {fmt.name}, the default)"


def _check_suffix(fmt, output: Path) -> None:
    """``-o`` ends with a suffix of ``--format`` (a one-line ValueError naming the format the suffix belongs to)."""
    from .. import deploy
    by_suffix = deploy.for_path(output)
    if by_suffix is not fmt:
        what = f"--format {by_suffix.name}'s" if by_suffix is not None else "no format's"
        raise ValueError(f"-o {output}: a --format {fmt.name} file ends with {fmt.suffixes[0]} ({output.suffix} is "
                         f"{what}); fix -o, or drop --format to take the format from -o")


def _check_targets(args: argparse.Namespace, fmt, output: Path, report: Path) -> None:
    """The files the export writes, each refused when it exists unless --overwrite (the one output policy,
    :func:`~simattn.utils.io.check_new_file`; a format's folder, an .mlpackage, is replaced whole)."""
    from ..utils.io import check_new_file
    targets = [("-o", path) for path in fmt.files(output)] + [("--report", report)]
    if args.compare_softmax:
        targets.append(("--compare-softmax's twin", side_file(output, ".softmax" + fmt.suffixes[0])))
    for flag, path in targets:
        if fmt.folder and path == output:
            if output.is_dir() and not args.overwrite:
                raise ValueError(f"-o {output} exists: pass --overwrite to replace it, or choose another -o")
            continue
        check_new_file(path, args.overwrite, flag)


def check_options(args: argparse.Namespace) -> Dict[str, Any]:
    """Every option checked before any work, one-line ValueErrors naming the option, the value and what is
    allowed; returns what the run needs of them (``format``, ``quantize``, ``output``, ``calibration`` dataset)."""
    from .. import deploy
    from ..utils.recipe import checked_flags
    for specs in _options().values():
        vars(args).update(checked_flags(args, specs))
    given = args.format
    fmt = _output_format(given, args.output)
    args.format = fmt.name
    name, mode = fmt.name, args.quantize
    if mode is not None and mode not in fmt.quantize_modes:
        raise ValueError(f"--quantize {mode} is not available for --format {name}; it has "
                         f"{', '.join(fmt.quantize_modes) or 'no int8 mode'}"
                         + (" (use --precision fp16 for a smaller model)" if "precision" in fmt.options else ""))
    calib_given = [o for o, v in (("--calib-data", args.calib_data), ("--calib-dir", args.calib_dir),
                                  ("--calib-images", args.calib_images)) if v is not None]
    if calib_given and mode != "static":
        raise ValueError(f"{', '.join(calib_given)} applies to --quantize static only")
    _refuse_foreign_options(args, fmt)
    defaults = {n: spec.default for specs in _options().values() for n, spec in specs.items()}
    if not fmt.runs_here and _given(args, defaults, ["atol", "threads"]):
        raise ValueError(f"{', '.join(_given(args, defaults, ['atol', 'threads']))} applies to the parity check, "
                         f"which --format {name} does not run here ({fmt.not_here})")
    if args.require_delegated and not fmt.delegates_to:
        takers = " or ".join(f.name for f in deploy.formats().values() if f.delegates_to)
        raise ValueError(f"--require-delegated applies to --format {takers}, where what runs outside the fast "
                         f"kernels is known; --format {name} does not tell")
    if not args.compare_softmax and _given(args, defaults, ["bench_batch", "bench_time"]):
        raise ValueError(f"{', '.join(_given(args, defaults, ['bench_batch', 'bench_time']))} applies to "
                         "--compare-softmax only")
    if args.weights:  # once: every step below reads this source
        from ..models.sources import resolve_source
        args.weights = resolve_source(args.weights, packages=True)
    output = Path(args.output) if args.output else None
    if output is not None:
        _check_suffix(fmt, output)
        if args.weights and output.resolve() == Path(args.weights).resolve():
            raise ValueError(f"-o {output} is the --weights file; choose another output")
        if output.is_dir() and not fmt.folder:
            raise ValueError(f"-o {output} is a folder")
        if fmt.folder and output.exists() and not output.is_dir():
            raise ValueError(f"-o {output} exists and is not an {fmt.suffixes[0]} folder")
        _check_targets(args, fmt, output, Path(args.report) if args.report else side_file(output, ".json"))
    from ..data.factory import DATASETS
    segmentation = None
    if args.weights and deploy.for_path(args.weights) is None:  # an exported file is refused when it is loaded
        from ..segment.validation import segmentation_source

        segmentation = segmentation_source(args.weights)
    if segmentation is not None and segmentation.dataset is not None and args.calib_data is not None:
        raise ValueError(f"--calib-data {args.calib_data}: segmentation weights calibrate on the training images of "
                         f"the dataset they record ({segmentation.dataset}); --calib-dir sets its root")
    calib_name, calib_dir, recorded = _calibration_data(args, mode, segmentation)
    if segmentation is None and args.calib_dir is not None and DATASETS[calib_name] == "digits":
        raise ValueError(f"--calib-dir {args.calib_dir}: the calibration data is "
                         f"{args.calib_data or 'digits (the default)'}, which reads no folder; name the data in it "
                         "with --calib-data (folder, imagenet, cifar10 or cifar100)")
    # a missing runtime: one line naming its extra, after the option checks and before any work (opening data)
    fmt.require(_format_words(fmt, given, args.output))
    calibration = None
    if mode == "static" and segmentation is not None:
        from ..segment.validation import open_segmentation_dataset

        calibration = open_segmentation_dataset(segmentation, dataset=args.calib_data, data_dir=args.calib_dir,
                                                 split=segmentation.train_split, what="--calib-data")
    elif mode == "static":
        from ..data.calibration import open_calibration_dataset

        try:
            calibration = open_calibration_dataset(calib_name, calib_dir, "train")
        except (ValueError, FileNotFoundError) as e:
            if not recorded:
                raise
            raise ValueError(f"{e} (the data the weights record, calibrated on by default; --calib-data and "
                             "--calib-dir name other images)") from None
    elif args.calib_dir is not None:
        raise ValueError("--calib-dir applies to --quantize static only")
    return {"format": fmt, "quantize": mode, "output": output, "calibration": calibration,
            "calibration_name": calib_name, "segmentation": segmentation}


def _calibration_data(args: argparse.Namespace, mode: Optional[str], segmentation) -> Tuple[str, Optional[str], bool]:
    """(dataset, root, whether they come from the weights' record) a classifier's static int8 calibrates on:
    ``--calib-data``/``--calib-dir``, else the train split of the data the weights record (as ``validate`` scores
    on it), else digits."""
    name, root = args.calib_data, args.calib_dir
    if name is not None or mode != "static" or segmentation is not None or not args.weights:
        return name or "digits", root, False
    from ..models.sources import read_weights_record

    record = read_weights_record(args.weights)
    dataset = (record.extra if record is not None else {}).get("dataset")
    if not isinstance(dataset, str):
        return "digits", root, False
    return dataset, root if root is not None else record.extra.get("data_dir"), True


def run(args: argparse.Namespace) -> int:
    opts = check_options(args)
    import torch

    from ..data.images import resolve_data_config
    from ..models.factory import load_model, parse_model_kwargs
    from ..models.weights import DATA_RECORD_KEYS, export_record
    from ..utils.io import atomic_write_json
    from .architecture import attention_kind

    fmt, mode, segmentation = opts["format"], opts["quantize"], opts["segmentation"]
    model, spec = load_model(args.model, args.weights, parse_model_kwargs(args.model_kwargs), args.use_ema)
    data_config = resolve_data_config(model, spec, args.img_size)
    if segmentation is not None and not args.img_size and segmentation.input_size:
        # a segmenter is exported at the crop it trained on, whatever size its backbone was built for
        data_config["input_size"] = tuple(int(v) for v in segmentation.input_size)
    input_size = tuple(data_config["input_size"])
    output = opts["output"] or Path("runs/export") / f"{spec['model']}{'_int8' if mode else ''}{fmt.suffixes[0]}"
    report_path = Path(args.report) if args.report else side_file(output, ".json")
    if args.report and report_path.resolve() in (output.resolve(), Path(args.weights or output).resolve()):
        raise ValueError(f"--report {report_path} is the output or the weights file; choose another path")
    _check_targets(args, fmt, output, report_path)
    kind = attention_kind(model)
    if args.compare_softmax and kind == "softmax":
        raise ValueError("--compare-softmax: the model already uses softmax attention")
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"model {spec['model']} ({n_params:.2f}M params, attention {kind}), input {'x'.join(map(str, input_size))}"
          f", weights {spec['weights'] or 'random'}; format {fmt.name}" + (f", int8 {mode}" if mode else ""))
    report: Dict[str, Any] = {"model": spec["model"], "model_kwargs": spec["config"], "weights": spec["weights"],
                              "attention": kind, "params_m": round(n_params, 3), "data_config": data_config,
                              "format": fmt.name, "quantize": mode, "output": str(output)}
    extra = spec.get("extra") or {}
    classes = extra.get("classes")
    # the data it was trained on, so that validate scores the file on the same images
    task: Dict[str, Any] = {k: extra[k] for k in DATA_RECORD_KEYS if k in extra}
    if segmentation is not None:
        task = {**segmentation.record(), **{k: extra[k] for k in ("label_ids", "palette", "ignore_index")
                                             if k in extra}}
    record = export_record(spec["model"], spec["config"], data_config, attention=kind,
                           classes=classes if isinstance(classes, list) and classes else None,
                           num_classes=spec.get("num_classes"), **task)
    calibration = None
    if mode == "static":
        from ..data.calibration import calibration_images, segmentation_calibration_images

        count = args.calib_images or DEFAULT_CALIB_IMAGES
        if segmentation is not None:
            calibration = segmentation_calibration_images(opts["calibration"], input_size, count)
            calib_name, split = segmentation.dataset or args.calib_data, segmentation.train_split
            how = "resized and normalised as in training, centre crops of the input size"
        else:
            calibration = calibration_images(opts["calibration"], data_config, count)
            calib_name, split, how = opts["calibration_name"], "train", "preprocessed as the model is evaluated"
        report["calibration"] = {"dataset": calib_name, "split": split, "images": len(calibration)}
        print(f"calibration: {len(calibration)} images of {calib_name} ({split}), {how}")
    torch.manual_seed(0)
    status = _export(args, fmt, model, spec, kind, output, record, mode, calibration, report)
    atomic_write_json(report, report_path)
    print(f"report: {report_path}")
    return status


class _Failed(Exception):
    """A check failed: its message is printed, the report written, nothing exported (exit 1)."""


def _one_size_where_needed(args, fmt, model, record, report):
    """``model`` laid out for one input size with ``--static-spatial``, or where its class says why its exported
    graph holds one (:func:`~simattn.models.export_ready.fixed_size_export`; a note, and ``--static-spatial`` set,
    so that the format exports that size at once)."""
    from ..models import prepare_for_export
    from ..models.export_ready import fixed_size_export

    why_fixed = fixed_size_export(model)
    if why_fixed and fmt.dynamic_size and not args.static_spatial:
        h, w = record.input_size[1:]
        print(f"note: {why_fixed}: exported at {h}x{w} with a dynamic batch, as --static-spatial does")
        report["fixed_size_reason"] = why_fixed
        args.static_spatial = True
    # one size: the position embedding is resampled once here, not by an antialiased Resize in the graph
    return prepare_for_export(model, record.input_size[1:]) if args.static_spatial else model


def _export(args, fmt, model, spec, kind, output: Path, record, mode, calibration, report) -> int:
    """Write the file in a folder beside ``output`` through :func:`~simattn.deploy.pipeline.deploy_model` (export,
    audit, parity in its runtime, int8), compare with softmax, then move it onto ``output``."""
    import torch

    from ..deploy import Exported, ExportError
    from ..deploy.ops import ExpFreeError
    from ..deploy.pipeline import deploy_model
    from .architecture import model_stride, segmentation_stride
    from .checks import real_inputs

    model = _one_size_where_needed(args, fmt, model, record, report)

    def on_checked(done) -> None:  # the written file passed its checks: show them, compare with softmax
        _show_export(done.exported, report)
        if done.parity is not None:
            _show_parity(args, fmt, done.parity, quantized=bool(mode) and done.float_path is None)
            report.update(parity=done.parity, max_abs_diff=max(r["max_abs_diff"] for r in done.parity.values()))
        written = done.float_path or done.path
        report["metadata"] = fmt.read_metadata(written).to_dict()
        print("metadata: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in report["metadata"].items()))
        if args.compare_softmax:
            report["latency"] = _compare_softmax(args, fmt, spec, written, output, record, done.exported, kind)

    def inputs():
        x = torch.randn(1, *record.input_size, generator=torch.Generator().manual_seed(0))
        return {f"random_1x{'x'.join(map(str, record.input_size))}": x, **real_inputs(record.data_config)}

    output.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    try:
        staged = work / output.name
        try:
            done = deploy_model(fmt, model, record, staged, quantize=mode, calibration=calibration,
                                options=fmt.option_values(vars(args)), fixed_size=args.static_spatial,
                                parity_inputs=inputs, atol=args.atol, threads=args.threads,
                                on_ops=_audit_hook(args, spec, report), on_checked=on_checked,
                                progress=lambda line: print(line, flush=True), shown=output, real_inputs=real_inputs,
                                stride=model_stride(model), spatial_multiple=segmentation_stride(model))
        except ExportError as e:
            if e.parity is None:
                raise
            if isinstance(e.result, Exported):  # checked here; else the format's own checks failed in its export
                _show_export(e.result, report)
            else:
                report["export"] = e.result.to_dict()
            _show_parity(args, fmt, e.parity, quantized=False)
            report["parity"] = e.parity
            raise _Failed(str(e)) from None
        except ExpFreeError as e:
            raise _Failed(str(e)) from None
        if done.float_path is not None:
            if done.int8_parity is not None:
                report["int8_parity"] = done.int8_parity
            report["quantization"] = _int8_report(args, fmt, done.float_path, staged, output, model, mode)
        _check_delegation(args, fmt, staged, done.exported if done.float_path is None else None, spec, output,
                          report)
        _commit(fmt, staged, output, args.overwrite)
    except _Failed as e:
        print(f"simattn export: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not fmt.folder:
        report["bytes"] = sum(p.stat().st_size for p in fmt.files(output))
    # the whole command's time (export, checks, int8), beside the exporter's own in report["export"]
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(f"wrote {output}" + (f" ({report['bytes'] / 2 ** 20:.2f} MB)" if "bytes" in report else "")
          + f" in {report['seconds']:.0f} s" + ("" if fmt.runs_here else f"; {fmt.not_here} (no parity check here)"))
    return 0


def _audit_hook(args, spec, report):
    """What the export calls with the graph's audit before writing: print and record it, and with
    --require-exp-free, stop on any exp-like op."""
    from ..deploy.ops import ExpFreeError

    def on_ops(audit) -> None:
        report["audit"] = audit.to_dict()
        print(f"graph audit ({audit.kind} ops{', ' + audit.scope if audit.scope else ''}):")
        print(audit.format())
        if args.require_exp_free:
            report["exp_free_check"] = "failed" if audit.exp_like else "passed"
            if audit.exp_like:
                raise ExpFreeError(f"--require-exp-free: {spec['model']} is not exp-free: the graph contains "
                                   f"{audit.describe_exp_like()}; nothing written")
            print("exp-free: yes")

    return on_ops


def _show_export(exported, report) -> None:
    for note in exported.notes:
        print(f"  {note}")
    report.update(exported.info)


def _show_parity(args, fmt, checks, quantized: bool) -> None:
    scale = " × max(1, max |logit|)" if fmt.relative_atol else ""
    what = "int8 vs fp32 PyTorch" if quantized else f"fp32, atol {args.atol:g}{scale}"
    print(f"parity {fmt.runtime} vs PyTorch ({what}):")
    _print_parity(checks)


def _check_delegation(args, fmt, staged: Path, exported, spec, output: Path, report) -> None:
    """Print and record what of the staged file runs outside the format's fast kernels (formats that can tell);
    with --require-delegated, anything beyond what the format allows outside fails the export."""
    delegation = fmt.delegation(staged, exported) if fmt.delegates_to else None
    if delegation is None:
        return
    report["delegation"] = delegation
    print(f"  {delegation['line']}")
    if args.require_delegated:
        beyond = delegation["beyond_allowance"]
        report["delegated_check"] = "failed" if beyond else "passed"
        if beyond:
            raise _Failed(f"--require-delegated: {spec['model']} does not run wholly in {fmt.delegates_to} "
                          f"(--format {fmt.name}): " + ", ".join(f"{op} ×{n}" for op, n in beyond.items())
                          + f" outside; {output} not written")


def _commit(fmt, staged: Path, output: Path, overwrite: bool) -> None:
    """Move the staged file(s) onto ``output``. A folder already there (an ``.mlpackage``, replaced with
    ``--overwrite`` when it holds nothing the new one does not) leaves only as the new one takes its place, and
    comes back if that fails; Ctrl-C waits until the move is done."""
    from ..deploy.base import kept_interrupts
    from ..utils.io import check_new_folder

    if fmt.folder:
        check_new_folder(output, overwrite, "-o", writes=[p.name for p in staged.iterdir()])
    with kept_interrupts(defer=True):
        for src, dst in zip(fmt.files(staged), fmt.files(output)):
            previous = src.with_name(src.name + ".previous")
            if dst.is_dir():
                os.replace(dst, previous)
            try:
                os.replace(src, dst)
            except BaseException:
                if previous.exists():
                    os.replace(previous, dst)
                raise


def _compare_softmax(args, fmt, spec, fp32_path: Path, output: Path, record, exported, kind) -> Dict[str, Any]:
    from dataclasses import replace

    from .architecture import softmax_twin
    from .latency import compare_latency

    twin_path = side_file(output, ".softmax" + fmt.suffixes[0])
    print(f"exporting the softmax twin to {twin_path} ...", flush=True)
    twin = softmax_twin(spec)
    twin_record = replace(record, extra={**record.extra, "attention": "softmax"})
    # the options the model's export ended with (exporter, dynamic axes), so both graphs are built alike
    twin_exported = fmt.export(twin, twin_path, twin_record, atol=args.atol,
                               **{**fmt.option_values(vars(args)), **exported.options})
    print(f"{fmt.runtime} CPU latency, batch {args.bench_batch}, {args.threads} thread(s) ...", flush=True)
    lat = compare_latency(fp32_path, twin_path, batch=args.bench_batch, threads=args.threads,
                          min_time=args.bench_time)
    m, b = lat["model"], lat["baseline"]
    print(f"  input {'x'.join(map(str, lat['input_shape']))} (from the files' metadata)")
    print(f"  {kind}: {m['median_ms']:.3f} ms (p10 {m['p10_ms']:.3f}, p90 {m['p90_ms']:.3f})   softmax: "
          f"{b['median_ms']:.3f} ms (p10 {b['p10_ms']:.3f}, p90 {b['p90_ms']:.3f})   {kind} speed-up over softmax: "
          f"×{lat['baseline_over_model']:.2f}")
    lat.update(model_attention=kind, baseline_attention="softmax",
               baseline_exporter=twin_exported.options.get("exporter"))
    return lat


def _int8_report(args, fmt, fp32_path: Path, int8_path: Path, output: Path, model, mode: str) -> Dict[str, Any]:
    """What int8 made from the written fp32 file costs on the digits val split (digits models only)."""
    from .checks import quantization_report

    num_classes = getattr(model, "num_classes", None)
    if fmt.read_metadata(fp32_path).extra.get("task") == "semantic_segmentation":
        print(f"  mIoU not measured here: score both files with simattn validate --weights {output}")
        return {"mode": mode, "int8_path": str(output), "miou": None}
    if num_classes != 10:
        print(f"  accuracy not measured: the model has {num_classes} classes; the digits data has 10 "
              "(pass weights trained on digits)")
        return {"mode": mode, "int8_path": str(output), "accuracy": None}
    if not args.weights:
        print("  warning: random weights; the accuracies below are near chance")
    q = quantization_report(fmt, fp32_path, int8_path, threads=args.threads, shown_path=output)
    print(f"  digits val ({q['images']} images): fp32 top-1 {q['fp32_top1']:.2f}%  int8 top-1 {q['int8_top1']:.2f}%"
          f"  (Δ {q['delta_top1']:+.2f}, agreement {q['prediction_agreement']:.1f}%), "
          f"{q['fp32_mb']:.2f} MB → {q['int8_mb']:.2f} MB")
    return {"mode": mode, **q}


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``simattn export``; returns the exit status."""
    args = build_parser().parse_args(argv)
    from ..deploy import ExportError
    from ..utils.extras import EXTRAS, MissingDependency, missing_extra
    try:
        return run(args)
    except ExportError as e:
        print(f"simattn export: {e}", file=sys.stderr)
        return 1
    except MissingDependency as e:
        print(f"simattn export: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top in EXTRAS:  # a package the format's own require does not list, or one of another step
            what = "simattn export" + (f" --format {args.format}" if args.format else "")
            print(f"simattn export: error: {missing_extra(top, what)}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
