"""``simattn export --format executorch|coreml``: capture at a fixed size, audit, quantize, lower, write, verify."""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch
from torch import nn

__all__ = ["export_edge", "compare_outputs"]


class _ParityFailed(RuntimeError):
    pass


def compare_outputs(ref: torch.Tensor, out: torch.Tensor) -> Dict[str, float]:
    """Max |difference|, cosine similarity and argmax agreement (%) of two (N, classes) outputs."""
    ref, out = ref.float(), out.float()
    return {"max_abs_diff": float((ref - out).abs().max()),
            "cosine": float(torch.nn.functional.cosine_similarity(ref.flatten(), out.flatten(), dim=0)),
            "argmax_agreement": float((ref.argmax(-1) == out.argmax(-1)).float().mean() * 100)}


def _print_ops(title: str, ops: Mapping[str, int]) -> None:
    print(title + (", ".join(f"{op}×{n}" for op, n in ops.items()) if ops else "none"))


def export_edge(model: nn.Module, spec: Mapping[str, Any], output: Path, metadata: Mapping[str, Any], *, fmt: str,
                quantize: Optional[str], calibration: Optional[torch.Tensor], precision: str,
                require_exp_free: bool, atol: float, threads: int, report: Dict[str, Any],
                real_inputs: Mapping[str, torch.Tensor]) -> int:
    """Write ``model`` as a ``.pte`` (``fmt='executorch'``) or ``.mlpackage`` (``'coreml'``) at ``output``;
    fills ``report``; returns the exit status (1: parity or ``require_exp_free`` failed, nothing written)."""
    from ..utils.edge import aten_op_counts, capture, exp_like_ops
    from ..models import prepare_for_export

    input_size = tuple(metadata["input_size"])
    model = prepare_for_export(model, input_size[1:])
    print(f"capturing with torch.export at 1x{'x'.join(map(str, input_size))} (fixed size) ...", flush=True)
    program = capture(model, input_size)
    counts = aten_op_counts(program)
    exp_like = exp_like_ops(counts)
    report["aten_ops"], report["exp_like"] = counts, exp_like
    resample = {op: n for op, n in counts.items() if "upsample" in op}
    if resample:  # the fixed-size preparation is meant to remove every per-call resample
        raise RuntimeError(f"the captured graph still resamples ({resample}); {spec['model']} is not prepared for a "
                           "fixed input size")
    _print_ops(f"graph: {sum(counts.values())} ATen calls; exp-like: ", exp_like)
    if require_exp_free:
        report["exp_free_check"] = "failed" if exp_like else "passed"
        if exp_like:
            print(f"simattn export: --require-exp-free: {spec['model']} is not exp-free: the graph contains "
                  f"{', '.join(f'{op}×{n}' for op, n in exp_like.items())}; nothing written", file=sys.stderr)
            return 1
        print("exp-free: yes")
    if fmt == "executorch":
        return _executorch(model, program, output, metadata, quantize, calibration, atol, threads, report,
                           real_inputs)
    return _coreml(program, output, metadata, precision, report)


def _executorch(model, program, output: Path, metadata, quantize, calibration, atol, threads, report,
                real_inputs) -> int:
    from ..utils.edge import (capture, delegation_summary, executorch_method, lower_executorch, quantize_pt2e,
                              read_pte_metadata, run_executorch)
    from ..utils.io import atomic_path

    input_size = tuple(metadata["input_size"])
    if quantize:
        print(f"int8 {quantize} quantization (PT2E, XNNPACK quantizer: linear and conv, per-channel) ...",
              flush=True)
        images = [calibration[i:i + 1] for i in range(len(calibration))] if calibration is not None else None
        program = capture(quantize_pt2e(model, input_size, quantize, images), input_size)
    print("lowering to ExecuTorch (XNNPACK partitioner) ...", flush=True)
    edge = lower_executorch(program, metadata)
    summary = delegation_summary(edge)
    report["delegation"] = summary
    print(f"  XNNPACK took {summary['delegated_nodes']} nodes in {summary['subgraphs']} subgraphs; "
          f"{summary['portable_nodes']} run in portable kernels")
    _print_ops("  not delegated: ", summary["not_delegated"])
    buffer = edge.to_executorch().buffer
    inputs = {f"random_1x{'x'.join(map(str, input_size))}": torch.randn(1, *input_size,
                                                                        generator=torch.Generator().manual_seed(0)),
              **real_inputs}
    try:
        with atomic_path(output) as tmp:
            with open(tmp, "wb") as f:
                f.write(buffer)
            run = executorch_method(tmp, threads)
            parity = {}
            for name, x in inputs.items():
                with torch.no_grad():
                    ref = model(x)
                parity[name] = {"shape": list(x.shape), **compare_outputs(ref, run_executorch(run, x))}
                # fp32 must match, to atol relative to the logits' scale (XNNPACK sums in another order);
                # int8 is reported (its accuracy is what validate measures)
                bound = atol * max(1.0, float(ref.abs().max()))
                parity[name]["ok"] = bool(quantize or parity[name]["max_abs_diff"] <= bound)
            report["parity"] = parity
            what = "int8 vs fp32 PyTorch" if quantize else f"fp32, atol {atol:g} × max(1, max |logit|)"
            print(f"parity ExecuTorch vs PyTorch ({what}):")
            for name, r in parity.items():
                print(f"  {name:<28} {'x'.join(map(str, r['shape'])):<14} max abs diff {r['max_abs_diff']:.3g}, "
                      f"cosine {r['cosine']:.5f}, argmax agreement {r['argmax_agreement']:.0f}%  "
                      f"{'ok' if r['ok'] else 'FAIL'}")
            if not all(r["ok"] for r in parity.values()):
                raise _ParityFailed(f"ExecuTorch output differs from PyTorch beyond {atol:g} (relative to the logits' "
                                    f"scale); {output} not written")
            report["metadata"] = read_pte_metadata(tmp)
    except _ParityFailed as e:
        print(f"simattn export: {e}", file=sys.stderr)
        return 1
    report["bytes"] = len(buffer)
    print("metadata: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in report["metadata"].items()))
    print(f"wrote {output} ({len(buffer) / 2 ** 20:.2f} MB)")
    return 0


def _coreml(program, output: Path, metadata, precision: str, report) -> int:
    from ..utils.edge import convert_coreml, kept_interrupts, read_coreml_metadata, save_coreml

    print(f"converting to Core ML (mlprogram, {precision} compute) ...", flush=True)
    mlmodel = convert_coreml(program, metadata, precision)
    output.parent.mkdir(parents=True, exist_ok=True)
    # an .mlpackage is a folder: write it beside the target, then swap it in, so a failure or an interrupt leaves
    # the existing output as it was
    work = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    try:
        staged = work / output.name
        save_coreml(mlmodel, staged)
        report["metadata"] = read_coreml_metadata(staged)
        with kept_interrupts(defer=True):  # the old package leaves only as the new one takes its place
            previous = work / "previous"
            if output.exists():
                os.replace(output, previous)
            try:
                os.replace(staged, output)
            except BaseException:
                if previous.exists():
                    os.replace(previous, output)
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["precision"] = precision
    print("metadata: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in report["metadata"].items()))
    print(f"wrote {output}; Core ML runs it on macOS/iOS only (no parity check here)")
    return 0
