"""The command line of ``simattn bench model``: its options (the sweep's lists of :class:`~.spec.BenchSpec` values,
each checked by the spec's own declaration), the ``--preset gpu`` table, the parser and the entry point."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ... import deploy
from ...models.factory import parse_model_kwargs
from ...utils.recipe import Opt, flag_name, maybe, option_paths
from ...utils.timing import set_threads
from ...utils.values import OPTIONS_HELP, parse_assignments
from ..cli import check_bench_flags, check_out, refuse_unused, require_cuda, result_files, shared
from ..report import machine_info
from .results import summary_markdown, speedups, runtime_speedups, write_results
from .runner import check_builds
from .spec import CALIBRATION_IMAGES, DEFAULT_ATTN, DEPLOYED_MEASURES, FLOOR_LABEL, SEG_CLASSES, BenchSpec, \
    check_sizes, int8_runtimes, parse_size, runtime_name
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


#: ``--preset gpu``, the GPU table: DeiT-S with SimA against its softmax twin (SDPA; flash where torch picks it)
#: as a classifier at 224, 512 and 1024 px and with a Semantic FPN head at 512×512 and 1024×2048, training and
#: inference throughput and peak memory under bf16 autocast. Each (head, size) starts at the batch below (large
#: for an 80 GB GPU) and halves on CUDA out-of-memory until a step fits (``fill_batch``): the batch is as large as
#: the GPU holds, up to that start, and rows name the batch they ran. Flags given beside the preset still apply,
#: except the grid's own: --img-size, --head, --batch-size.
GPU_GRID: List[Tuple[Optional[str], Union[int, List[int]], int]] = [
    (None, 224, 1024), (None, 512, 256), (None, 1024, 64), ("fpn", 512, 64), ("fpn", [1024, 2048], 8)]
PRESETS: Dict[str, Dict[str, Any]] = {
    "gpu": {"device": "cuda", "attn": ["sima", "softmax"], "precision": ["bf16"], "fill_batch": True,
            "measure": ["throughput", "train-throughput", "memory"]},
}
#: the grid a preset runs instead of --img-size, --head and --batch-size
PRESET_GRIDS = {"gpu": GPU_GRID}
#: flags with three states (given on, given off, not given: the spec's default or the preset's)
_TRI_STATE = ("floor", "fill_batch")


def _unset(opt: Opt, help: Optional[str] = None) -> Opt:
    """A :class:`BenchSpec` option as a flag that defaults to 'not given' (None), so that the spec's own default
    (or a preset's) applies; its help names that default."""
    default = opt.default if not isinstance(opt.default, list) else " ".join(map(str, opt.default))
    return dataclasses.replace(opt, default=None, type=maybe(opt.hint),
                               help=f"{help or opt.help} (default: {default})")


def _sweep(opt: Opt, help: str, default: Any = None) -> Opt:
    """A list flag whose every item is a value of the :class:`BenchSpec` option ``opt`` (a sweep over it), each
    item checked by that one declaration (its choices, or its check)."""
    def check(values: Sequence[Any]) -> Optional[str]:
        choices = opt.choice_list()
        bad = [v for v in values if choices is not None and v not in choices]
        if bad:
            return f"{', '.join(map(repr, bad))} not allowed; allowed: some of {', '.join(map(str, choices))}"
        problems = [opt.check(v) for v in values] if opt.check is not None else []
        return next((p for p in problems if p), None)

    return Opt(default, help, type=List[opt.hint] if default is not None else maybe(List[opt.hint]), check=check)


def _options() -> Dict[str, Opt]:
    """Every option of ``bench model``: the sweep's lists and the spec's own options (their one declaration is
    :class:`BenchSpec`'s), the shared ones of :mod:`simattn.bench.cli`, and the command's."""
    spec = option_paths(BenchSpec)
    return {
        "preset": Opt(None, "a named sweep: gpu = SimA against softmax on DeiT-S at 224, 512 and 1024 px and with a "
                            "Semantic FPN at 512 and 1024x2048, bf16, batches that fill the GPU (--device cuda)",
                      type=maybe(str), choices=list(PRESETS)),
        "models": _sweep(spec["model"], "registered model names", ["sima_deit_small_patch16_224"]),
        "attn": Opt(None, f"attention kinds passed as attn_type ('{DEFAULT_ATTN}' = the model's own, the default); "
                          "LABEL=KIND runs a kind again under another label (e.g. explicit=softmax)",
                    type=maybe(List[str])),
        "img_size": Opt(None, f"input sizes: N (N×N px) or HxW (e.g. 512 1024x2048); each a multiple of the model's "
                              f"patch size (and, with --head, of 32) (default: {spec['img_size'].default})",
                        type=maybe(List[Union[int, str]]), check=check_sizes,
                        allowed="sizes N or HxW with positive integers (e.g. 512, 1024x2048)"),
        "head": dataclasses.replace(spec["head"], help="wrap each --models backbone in a segmentation head (fpn: "
                                    f"semantic_fpn, upernet; {SEG_CLASSES} classes, logits at the input size)"),
        "precision": _sweep(spec["precision"], "fp32, or bf16/fp16 autocast (default: fp32 on CPU, bf16 on CUDA)"),
        "device": shared("device", None, "cpu or cuda[:i] (default: cpu; cuda with --preset gpu)"),
        "threads": shared("threads", help="CPU threads in every worker (default: this process's "
                                          "torch.get_num_threads())"),
        "batch_size": dataclasses.replace(_unset(spec["batch_size"]), type=maybe(List[int]),
                                          help="batch of the throughput measurements: one, or one per --img-size "
                                               f"(default: {spec['batch_size'].default})"),
        "fill_batch": _unset(spec["fill_batch"]),
        "measure": _unset(spec["measures"]),
        # one or the other (a mutually exclusive pair): --fixed-order is --sima-order qk_first
        "fixed_order": Opt(False, "force SimA to (q̂k̂ᵀ)v (order='qk_first'): the same N² matmuls as softmax, so the "
                                  "difference is the cost of exp alone (the paper's comparison)"),
        "sima_order": spec["sima_order"],
        "runtime": _sweep(spec["runtime"], "PyTorch, or the model exported and run in that runtime "
                                           "(simattn.deploy; inference only), each at --threads", ["torch"]),
        "int8": Opt(False, f"add an int8 row for each of {', '.join(int8_runtimes())} in --runtime (static, linear/"
                           f"conv/matmul only, calibrated on {CALIBRATION_IMAGES} digits images)"),
        "floor": Opt(None, "the floors: each torch configuration's network with its attention cores replaced by a "
                           f"zero-cost stand-in, measured as its rows are (a row labelled {FLOOR_LABEL}; table "
                           "floor_ratios: each row's time over it), and with latency each row's linear floor: the "
                           "model's nn.Linear layers alone (each on an input of the shape it sees in the model; no "
                           "conv patch embedding) through the same runtime, precision and threads (columns "
                           "floor_ms, of_floor); default: the linear floor when --runtime names a runtime besides "
                           "torch (--no-floor skips it)", type=maybe(bool)),
        "compile": spec["compile"],
        "compile_backend": _unset(spec["compile_backend"]),
        "compile_mode": _unset(spec["compile_mode"]),
        "channels_last": spec["channels_last"],
        **deploy.bench_options(),
        "warmup": spec["warmup"],
        "repeats": spec["repeats"],
        "max_time": spec["max_time"],
        "rounds": shared("rounds", 1, "time the whole sweep this often, interleaved; report the median (steadier on "
                                      "a shared machine)"),
        "baseline": Opt(None, "the --attn label the speed-ups are relative to (default: softmax, when listed)",
                        type=maybe(str)),
        "timeout": shared("timeout", help="seconds before a worker is abandoned (not with --in-process)"),
        "in_process": Opt(False, "measure in this process (debugging)"),
        "output": shared("output", "runs/bench_model", "output folder"),
        "overwrite": shared("overwrite"),
    }


def build_parser() -> argparse.ArgumentParser:
    from ...utils.recipe import add_option_flags, command_parser
    options = _options()
    order = {name: options.pop(name) for name in ("fixed_order", "sima_order")}
    tri_state = {name: options.pop(name) for name in _TRI_STATE}
    p = command_parser("simattn bench model",
                       "Latency, throughput, exp-like op and FLOP counts and peak memory of registered models, each "
                       "configuration in its own subprocess.", options)
    add_option_flags(p.add_mutually_exclusive_group(), order)
    for name, opt in tri_state.items():
        p.add_argument(flag_name(name), action=argparse.BooleanOptionalAction, default=None,
                       help=opt.help)
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


def _apply_preset(args: argparse.Namespace) -> None:
    """``--preset``: its values for the options not given; the grid's own options given beside it are a one-line
    error."""
    if args.preset is None:
        return
    given = [flag_name(name) for name in ("img_size", "head", "batch_size")
             if getattr(args, name) is not None]
    if given:
        raise ValueError(f"--preset {args.preset} sets the sizes, heads and batches of its table; drop "
                         f"{', '.join(given)}")
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def _grid(args: argparse.Namespace) -> List[Tuple[Optional[str], Union[int, List[int]], Optional[int]]]:
    """(head, size, batch) of each configuration of the sweep: the preset's grid, or --head at every --img-size
    with --batch-size's batch (one for all, or one per size; None: the spec's default)."""
    if args.preset is not None:
        return list(PRESET_GRIDS[args.preset])
    sizes = args.img_size or [option_paths(BenchSpec)["img_size"].default]
    batches = args.batch_size or [None]
    if len(batches) not in (1, len(sizes)):
        raise ValueError(f"--batch-size gives {len(batches)} batches for {len(sizes)} --img-size entries; give one, "
                         "or one per size")
    return [(args.head, parse_size(size), batch) for size, batch in zip(sizes, batches * len(sizes))]


def _runtimes(args: argparse.Namespace) -> List[str]:
    """The --runtime entries, each present on this machine (a missing package: one line naming its extra), and
    --int8 checked against them, before any worker starts."""
    from ... import deploy

    chosen = list(dict.fromkeys(args.runtime))
    for runtime in chosen:
        if runtime != "torch":
            deploy.get(runtime).require(f"simattn bench model --runtime {runtime}")
    int8 = int8_runtimes()
    if args.int8 and not set(chosen) & set(int8):
        raise ValueError(f"--int8 needs --runtime {' or '.join(int8)} (given: {', '.join(chosen)})")
    return chosen


def _measures(args: argparse.Namespace, chosen: Sequence[str]) -> Tuple[List[str], List[str]]:
    """What torch rows and exported rows measure (an exported graph: inference only, said in one line)."""
    measures = list(args.measure or option_paths(BenchSpec)["measures"].default)
    deployed = [m for m in measures if m in DEPLOYED_MEASURES]
    exported = ", ".join(r for r in chosen if r != "torch")
    if exported:
        skipped = [m for m in measures if m not in DEPLOYED_MEASURES]
        if skipped:
            print(f"--runtime {exported}: not measured: {', '.join(skipped)} (inference only)", flush=True)
        if not deployed:
            raise ValueError(f"--runtime {exported} measures {', '.join(DEPLOYED_MEASURES)}; --measure gave none of "
                             "them")
    return measures, deployed


def build_specs(args: argparse.Namespace, threads: int) -> List[BenchSpec]:
    """One checked :class:`BenchSpec` per runtime × model × attention × (head, size) × precision of the parsed,
    checked and preset-applied ``args``; options not given take the spec's defaults."""
    chosen = _runtimes(args)
    measures, deployed = _measures(args, chosen)
    variants = [(r, None) for r in chosen] + [(r, "static") for r in chosen if args.int8 and r in int8_runtimes()]
    floor = args.floor if args.floor is not None else any(r != "torch" for r in chosen)
    given = {name: getattr(args, flag) for name, flag in (
        ("device", "device"), ("fill_batch", "fill_batch"), ("compile_backend", "compile_backend"),
        ("compile_mode", "compile_mode"))
        if getattr(args, flag) is not None}
    given["format_options"] = {flag: getattr(args, flag) for flag in deploy.bench_options()
                               if getattr(args, flag) is not None}
    common = dict(given, threads=threads, sima_order="qk_first" if args.fixed_order else args.sima_order,
                  model_kwargs=parse_model_kwargs(args.model_kwargs), warmup=args.warmup, repeats=args.repeats,
                  max_time=args.max_time, compile=args.compile, channels_last=args.channels_last)
    attns = parse_attn(args.attn or [DEFAULT_ATTN], args.attn_kwargs)
    specs = [BenchSpec(model=m, attn=kind, attn_kwargs=attn_kwargs, label=label if kind != DEFAULT_ATTN else "",
                       img_size=size, head=head, precision=p, runtime=runtime, quantize=quantize,
                       measures=measures if runtime == "torch" else deployed,
                       floor=floor and "latency" in measures, profile="latency" in measures and runtime != "torch",
                       **common, **({"batch_size": batch} if batch else {}))
             for runtime, quantize in variants for m in args.models for head, size, batch in _grid(args)
             for label, kind, attn_kwargs in attns for p in args.precision]
    return with_floor_rows(specs) if args.floor else specs


def with_floor_rows(specs: Sequence[BenchSpec]) -> List[BenchSpec]:
    """``specs`` with, after the last of each group of torch rows that differ only in attention (same model,
    head, size, batch, precision and runtime), the group's attention-free floor: its first row's network with
    every attention core replaced by a zero-cost stand-in (:func:`~.runner.without_attention`)."""
    taken = [s for s in specs if s.label == FLOOR_LABEL]
    if taken:
        raise ValueError(f"--attn label {FLOOR_LABEL!r} names the attention-free floor's rows (--floor); give the "
                         f"{taken[0].attn} entry another label")

    def group(s: BenchSpec):
        return (s.runtime, s.model, s.head, json.dumps(s.img_size), s.batch_size, s.precision)

    first, last = {}, {}
    for i, s in enumerate(specs):
        if s.runtime == "torch":
            first.setdefault(group(s), s)
            last[group(s)] = i
    out = []
    for i, s in enumerate(specs):
        out.append(s)
        if s.runtime == "torch" and last[group(s)] == i:
            out.append(dataclasses.replace(first[group(s)], attention_free=True, label=FLOOR_LABEL, floor=False,
                                           profile=False))
    return out


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line parsed and checked, the preset applied, and the defaults that depend on the device set."""
    args = build_parser().parse_args(argv)
    check_bench_flags(args, _options())
    _apply_preset(args)
    args.device = args.device or option_paths(BenchSpec)["device"].default
    args.precision = args.precision or (["bf16"] if torch.device(args.device).type == "cuda" else ["fp32"])
    args.output = Path(args.output)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``simattn bench model``."""
    args = parse_args(argv)
    require_cuda(args.device)
    check_out(args.output, args.overwrite, result_files("bench_model"))
    if not args.compile:
        refuse_unused(args, ["compile_backend", "compile_mode"], "to --compile")
    for fmt in deploy.formats().values():
        if fmt.runtime not in args.runtime:
            refuse_unused(args, list(fmt.bench_flags()), f"to --runtime {fmt.runtime}")
    if args.in_process:
        refuse_unused(args, ["timeout"], "to workers, not --in-process")
    threads = set_threads(args.threads)
    specs = build_specs(args, threads)
    labels = list(dict.fromkeys(s.label for s in specs))
    if args.baseline is not None and args.baseline not in labels:
        raise ValueError(f"--baseline {args.baseline!r} is not one of the runs' labels ({', '.join(labels)}): "
                         "name an --attn entry")
    baseline = args.baseline or "softmax"
    check_builds(specs)
    meta = {**machine_info(args.device, threads), "sima_order": specs[0].sima_order or "model default",
            "runtime": ", ".join(dict.fromkeys(runtime_name(s) for s in specs)), "preset": args.preset,
            "model_kwargs": specs[0].model_kwargs, "batch_size": sorted({s.batch_size for s in specs}),
            "rounds": args.rounds, "command": "simattn bench model " + " ".join(argv if argv is not None
                                                                                 else sys.argv[1:])}
    print(f"simattn bench model: {len(specs)} configuration(s) on {args.device}, {threads} CPU threads "
          f"(fixed in every worker and runtime), runtime {meta['runtime']}, SimA order: {meta['sima_order']}; "
          f"CPU {meta.get('cpu_name') or meta['cpu']}, features: {', '.join(meta.get('cpu_features') or ['unknown'])}"
          + (f"; GPU {meta['gpu']}" if meta.get("gpu") else ""), flush=True)
    rows = run_specs(specs, rounds=args.rounds, in_process=args.in_process, timeout=args.timeout)
    paths = write_results(rows, args.output, meta, baseline=baseline)
    print(summary_markdown(rows, speedups(rows, baseline), meta, runtime_speedups(rows)))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
