"""The command line of ``simattn bench model``: its options, parser and entry point."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ...models.factory import parse_model_kwargs
from ...utils.timing import set_threads
from ...utils.values import OPTIONS_HELP, parse_assignments
from ..cli import check_bench_flags, check_out, refuse_unused, require_cuda
from ..report import machine_info
from .results import summary_markdown, speedups, runtime_speedups, write_results
from .runner import check_builds
from .spec import CALIBRATION_IMAGES, DEFAULT_ATTN, DEPLOYED_MEASURES, HEADS, MEASURES, PRECISIONS, SEG_CLASSES, \
    SIMA_ORDERS, BenchSpec, check_sizes, int8_runtimes, parse_size, runtime_name, runtimes, validate_spec
from .workers import run_specs

def parse_attn(entries: Sequence[str], kwargs_items: Sequence[str] = ()) -> List[Tuple[str, str, Dict[str, Any]]]:
    """``--attn`` entries and ``--attn-kwargs`` items → ``(label, kind, options)`` per entry.

    An entry is a kind (``sima``) or ``LABEL=KIND`` (``explicit=softmax``: the kind again under another label);
    ``--attn-kwargs`` items are ``LABEL.OPTION=VALUE`` in the one option mini-language
    (:func:`simattn.utils.values.parse_assignments`), e.g. ``sima.order=qk_first softmax.fused=false``.
    """
    labels: Dict[str, str] = {}
    for entry in entries:
        label, sep, kind = entry.partition("=")
        label, kind = label.strip(), (kind if sep else label).strip()
        if not label or not kind or "." in label or ":" in entry:
            raise ValueError(f"--attn {entry!r} is not KIND or LABEL=KIND (e.g. sima, explicit=softmax); options "
                             f"go in --attn-kwargs KIND.OPTION=VALUE")
        if label in labels:
            raise ValueError(f"--attn lists {label!r} twice; give one a label, e.g. {label}2={kind}")
        labels[label] = kind
    options = parse_assignments(kwargs_items, what="--attn-kwargs item")
    for label, value in options.items():
        if label not in labels:
            raise ValueError(f"--attn-kwargs {label!r} is not one of --attn ({', '.join(labels)})")
        if not isinstance(value, dict):
            raise ValueError(f"--attn-kwargs {label}={value!r} gives no option name; write {label}.OPTION=VALUE "
                             f"(e.g. softmax.fused=false)")
    return [(label, kind, dict(options.get(label, {}))) for label, kind in labels.items()]


def _options():
    """Every option of ``bench model`` (the shared ones from :mod:`simattn.bench.cli`) with its allowed values."""
    from ...utils.recipe import Opt, check_path, maybe
    from ..cli import shared, some_of
    return {
        "models": Opt(["sima_deit_small_patch16_224"], "registered model names", type=List[str]),
        "attn": Opt([DEFAULT_ATTN], f"attention kinds passed as attn_type ('{DEFAULT_ATTN}' = the model's own); "
                                    "LABEL=KIND runs a kind again under another label (e.g. explicit=softmax)",
                    type=List[str]),
        "img_size": Opt([224], "input sizes: N (N×N px) or HxW (e.g. 512 1024x2048); each a multiple of the "
                               "model's patch size (and, with --head, of 32)", type=List[Union[int, str]],
                        check=check_sizes, allowed="sizes N or HxW with positive integers (e.g. 512, 1024x2048)"),
        "head": Opt(None, f"wrap each --models backbone in a segmentation head (fpn: semantic_fpn, upernet; "
                          f"{SEG_CLASSES} classes, logits at the input size); default: the model as it is",
                    type=maybe(str), choices=list(HEADS)),
        "precision": Opt(None, "fp32, or bf16/fp16 autocast (default: fp32 on CPU, bf16 on CUDA)",
                         type=maybe(List[str]), check=some_of(list(PRECISIONS))),
        "device": shared("device"),
        "threads": shared("threads", help="CPU threads in every worker (default: this process's "
                                          "torch.get_num_threads())"),
        "batch_size": Opt(8, "batch of the throughput measurements", low=1),
        "measure": Opt(list(MEASURES), f"what to measure: some of {', '.join(MEASURES)}", type=List[str],
                       check=some_of(list(MEASURES))),
        # one or the other (a mutually exclusive pair): --fixed-order is --sima-order qk_first
        "fixed_order": Opt(False, "force SimA to (q̂k̂ᵀ)v (order='qk_first'): the same N² matmuls as softmax, so the "
                                  "difference is the cost of exp alone (the paper's comparison)"),
        "sima_order": Opt(None, f"force this SimA order ({', '.join(SIMA_ORDERS)})", type=maybe(str),
                          choices=list(SIMA_ORDERS)),
        "runtime": Opt(["torch"], f"one or more of {', '.join(runtimes())}: PyTorch, or the model exported and run in "
                                  "that runtime (simattn.deploy; inference only), each at --threads", type=List[str]),
        "int8": Opt(False, f"add an int8 row for each of {', '.join(int8_runtimes())} in --runtime (static, linear/"
                           f"conv/matmul only, calibrated on {CALIBRATION_IMAGES} digits images)"),
        "floor": Opt(None, "with latency, also time each row's linear floor: the model's nn.Linear layers alone "
                           "(each on an input of the shape it sees in the model; no conv patch embedding) through "
                           "the same runtime, precision and threads (columns floor_ms, of_floor); default: on when "
                           "--runtime names a runtime besides torch (--no-floor skips it)", type=maybe(bool)),
        "compile": Opt(False, "time the torch.compile'd model (runtime torch)"),
        "compile_backend": Opt(None, "torch.compile backend with --compile (default inductor; see "
                                     "torch._dynamo.list_backends())", type=maybe(str)),
        "channels_last": Opt(False, "model and inputs in channels-last memory format (runtime torch)"),
        "onnx_exporter": Opt(None, "torch.onnx exporter for --runtime onnxruntime (default auto: dynamo, else "
                                   "TorchScript)", type=maybe(str), choices=["auto", "dynamo", "torchscript"]),
        "warmup": Opt(2, "untimed runs before each measurement", low=0),
        "repeats": shared("repeats", 10, "timed runs per measurement (at least)"),
        "max_time": shared("max_time", 30.0),
        "rounds": shared("rounds", 1, "time the whole sweep this often, interleaved; report the median (steadier on "
                                      "a shared machine)"),
        "baseline": Opt(None, "the --attn label the speed-ups are relative to (default: softmax, when listed)",
                        type=maybe(str)),
        "timeout": shared("timeout", help="seconds before a worker is abandoned (not with --in-process)"),
        "in_process": Opt(False, "measure in this process (debugging)"),
        "out": Opt("runs/bench_model", "output folder", check=check_path),
    }


def build_parser() -> argparse.ArgumentParser:
    from ...utils.recipe import add_option_flags, command_parser
    options = _options()
    order = {name: options.pop(name) for name in ("fixed_order", "sima_order")}
    floor = options.pop("floor")  # three states: --floor, --no-floor, or neither (the default of the runtimes)
    p = command_parser("simattn bench model",
                       "Latency, throughput, exp-like op and FLOP counts and peak memory of registered models, each "
                       "configuration in its own subprocess.", options)
    add_option_flags(p.add_mutually_exclusive_group(), order)
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=None, help=floor.help)
    # sizes are read as text (YAML would read 0x10 as the number 16); check_sizes reads N and HxW
    next(a for a in p._actions if a.dest == "img_size").type = str
    # KEY=VALUE items stay text until parse_assignments reads them: an Opt list flag reads each item as YAML
    # (``attn_kwargs={order: kv_first}`` would become a mapping), and an Opt mapping flag is a recipe's (it extends
    # a mapping default, which argparse cannot)
    p.add_argument("--attn-kwargs", nargs="*", default=[], metavar="KIND.OPTION=VALUE",
                   help=f"options of each --attn entry, {OPTIONS_HELP}: e.g. sima.order=qk_first softmax.fused=false")
    p.add_argument("--model-kwargs", nargs="*", default=[], metavar="KEY=VALUE",
                   help=f"create_model kwargs of every model, {OPTIONS_HELP}: e.g. depth=6 act_layer=relu")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``simattn bench model``."""
    args = build_parser().parse_args(argv)
    check_bench_flags(args, _options())
    args.out = Path(args.out)
    require_cuda(args.device)
    check_out(args.out, folder=True)
    if not args.compile:
        refuse_unused(args, ["compile_backend"], "to --compile")
    if "onnxruntime" not in args.runtime:
        refuse_unused(args, ["onnx_exporter"], "to --runtime onnxruntime")
    if args.in_process:
        refuse_unused(args, ["timeout"], "to workers, not --in-process")
    args.precision = args.precision or (["bf16"] if torch.device(args.device).type == "cuda" else ["fp32"])
    order = "qk_first" if args.fixed_order else args.sima_order
    kwargs = parse_model_kwargs(args.model_kwargs)
    attns = parse_attn(args.attn, args.attn_kwargs)
    chosen = list(dict.fromkeys(args.runtime))
    known, int8 = runtimes(), int8_runtimes()
    unknown = [r for r in chosen if r not in known]
    if unknown:
        raise ValueError(f"--runtime {unknown[0]!r}: expected some of {', '.join(known)}")
    from ... import deploy

    for runtime in chosen:
        if runtime != "torch":  # a missing package: one line naming its extra, before any worker starts
            deploy.get(runtime).require(f"simattn bench model --runtime {runtime}")
    if args.int8 and not set(chosen) & set(int8):
        raise ValueError(f"--int8 needs --runtime {' or '.join(int8)} (given: {', '.join(chosen)})")
    variants = [(r, None) for r in chosen] + [(r, "static") for r in chosen if args.int8 and r in int8]
    measures = tuple(args.measure)
    deployed_measures = tuple(m for m in measures if m in DEPLOYED_MEASURES)
    if any(r != "torch" for r in chosen):
        exported = ", ".join(r for r in chosen if r != "torch")
        skipped = [m for m in measures if m not in DEPLOYED_MEASURES]
        if skipped:
            print(f"--runtime {exported}: not measured: {', '.join(skipped)} (inference only)", flush=True)
        if not deployed_measures:
            raise ValueError(f"--runtime {exported} measures {', '.join(DEPLOYED_MEASURES)}; --measure gave none of "
                             "them")
    threads = set_threads(args.threads)
    floor = args.floor if args.floor is not None else any(r != "torch" for r in chosen)
    floor = floor and "latency" in measures
    specs = [BenchSpec(model=m, attn=kind, attn_kwargs=attn_kwargs, label=label if kind != DEFAULT_ATTN else "",
                       img_size=s, precision=p, device=args.device, threads=threads, batch_size=args.batch_size,
                       sima_order=order, model_kwargs=kwargs,
                       measures=measures if runtime == "torch" else deployed_measures, warmup=args.warmup,
                       repeats=args.repeats, max_time=args.max_time, runtime=runtime, compile=args.compile,
                       compile_backend=args.compile_backend or "inductor", quantize=quantize,
                       channels_last=args.channels_last, onnx_exporter=args.onnx_exporter or "auto", head=args.head,
                       floor=floor, profile="latency" in measures and runtime != "torch")
             for runtime, quantize in variants
             for m in args.models for label, kind, attn_kwargs in attns for s in map(parse_size, args.img_size)
             for p in args.precision]
    for spec in specs:
        validate_spec(spec)
    labels = list(dict.fromkeys(s.label for s in specs))
    if args.baseline is not None and args.baseline not in labels:
        raise ValueError(f"--baseline {args.baseline!r} is not one of the runs' labels ({', '.join(labels)}): "
                         "name an --attn entry")
    baseline = args.baseline or "softmax"
    check_builds(specs)
    meta = {**machine_info(args.device, threads), "sima_order": order or "model default",
            "runtime": ", ".join(dict.fromkeys(runtime_name(s) for s in specs)),
            "model_kwargs": kwargs, "batch_size": args.batch_size, "rounds": args.rounds,
            "command": "simattn bench model " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(f"simattn bench model: {len(specs)} configuration(s) on {args.device}, {threads} CPU threads "
          f"(fixed in every worker and runtime), runtime {meta['runtime']}, SimA order: {meta['sima_order']}; "
          f"CPU {meta.get('cpu_name') or meta['cpu']}, features: {', '.join(meta.get('cpu_features') or ['unknown'])}",
          flush=True)
    rows = run_specs(specs, rounds=args.rounds, in_process=args.in_process, timeout=args.timeout)
    paths = write_results(rows, args.out, meta, baseline=baseline)
    print(summary_markdown(rows, speedups(rows, baseline), meta, runtime_speedups(rows)))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
