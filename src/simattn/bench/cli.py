"""``simattn bench <what>``: dispatch to the benchmark modules."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Optional, Sequence

BENCHES = {
    "attention": ("simattn.bench.attention", "attention kinds vs softmax SDPA and the official SimA, by token count"),
    "data": ("simattn.bench.data", "decode + augment throughput of a folder, tar shards and a saved HF dataset of "
                                   "the same images, beside the model's training throughput"),
    "model": ("simattn.bench.model.cli", "latency, throughput, exp/FLOP counts and memory of registered models"),
    "paper": ("simattn.bench.paper", "the papers' tables and figures regenerated on this machine, their numbers "
                                     "beside ours (--only picks parts: simattn bench paper --help lists them)"),
}


def xcit_models() -> List[str]:
    """The registered models of the XCiT layout (``sima_xcit``): what ``bench paper --xcit-model`` takes."""
    import timm

    from .. import models  # noqa: F401  (registers the models)
    return sorted(timm.list_models(module="sima_xcit"))


def _bench_options():
    """The options several benchmarks take, each declared once (type, range, help); a benchmark picks them with
    :func:`shared`, giving its own default and help where they differ."""
    from ..utils.recipe import Opt, check_device, check_path, maybe
    count = dict(type=maybe(int), low=1)
    seconds = dict(type=maybe(float), low=0.0, low_open=True)
    return {
        "device": Opt("cpu", "cpu or cuda[:i]", check=check_device),
        "threads": Opt(None, "CPU threads (default: torch's current count)", **count),
        "batch": Opt(None, "batch", **count),
        "repeats": Opt(None, "timed runs per measurement", **count),
        "rounds": Opt(None, "interleaved timing rounds (median reported)", **count),
        "max_time": Opt(None, "stop a measurement's timed runs after this (s)", **seconds),
        "timeout": Opt(None, "seconds before a worker is abandoned", **seconds),
        "output": Opt(None, "where the results go", type=maybe(str), check=check_path, flags=("--out",)),
        "overwrite": Opt(False, "replace the results an earlier run left at --output (only the files this benchmark "
                                "writes: a folder holding others is refused)"),
    }


_KEEP = object()


def shared(name: str, default: Any = _KEEP, help: Optional[str] = None):
    """The shared option ``name`` (its one declaration in :func:`_bench_options`) with a benchmark's own default and
    help text; its type and allowed values stay the shared ones."""
    import dataclasses
    import typing

    spec = _bench_options()[name]
    changes = {"help": help} if help is not None else {}
    if default is not _KEEP:
        changes["default"] = default
        if default is not None:  # a benchmark with a real default takes no null
            changes["type"] = next(a for a in typing.get_args(spec.type) if a is not type(None))
    return dataclasses.replace(spec, **changes)


def some_of(choices: Sequence[str]):
    """An ``Opt`` check for a list option whose every item is one of ``choices``."""
    def check(values) -> Optional[str]:
        bad = [v for v in values if v not in choices]
        return f"{', '.join(map(repr, bad))} not allowed; allowed: some of {', '.join(choices)}" if bad else None

    return check


def check_bench_flags(args, specs: Dict[str, Any]) -> None:
    """Check every option of a benchmark (``specs``: name → ``Opt``, the ones its parser was made from) on ``args``,
    in place; a one-line ValueError naming the flag, the value and what is allowed, before any work."""
    from ..utils.recipe import checked_flags
    vars(args).update(checked_flags(args, specs))


def refuse_unused(args, unused: List[str], why: str) -> None:
    """A one-line ValueError when any of the options ``unused`` (attribute names, None or False when not given)
    was given: ``why`` says what they apply to."""
    from ..utils.recipe import flag_name

    given = [flag_name(name) for name in unused
             if getattr(args, name) is not None and getattr(args, name) is not False]
    if given:
        raise ValueError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} {why}")


def check_out(path, overwrite: bool, writes: Optional[Sequence[str]] = None, flag: str = "--output") -> None:
    """``--output`` under the one output policy, a one-line ValueError before any work: a file (``writes`` None;
    :func:`~simattn.utils.io.check_new_file`) or a folder of the files named in ``writes``
    (:func:`~simattn.utils.io.check_new_folder`). An existing one is refused without ``overwrite``; with it, a folder
    holding anything else is refused too, naming it."""
    from ..utils.io import check_new_file, check_new_folder

    if writes is None:
        check_new_file(path, overwrite, flag)
    else:
        check_new_folder(path, overwrite, flag, writes=writes)


def result_files(stem: str, suffixes: Sequence[str] = ("json", "csv", "md", "png")) -> List[str]:
    """The names of a benchmark's results in its folder: ``<stem>.json``, ``.csv``, ``.md`` and ``.png``."""
    return [f"{stem}.{suffix}" for suffix in suffixes]


def require_cuda(device: str) -> None:
    """For ``--device cuda[:i]``: a one-line ValueError (exit code 2 from the command line) when torch sees no CUDA
    device, before a benchmark does any work."""
    import torch

    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise ValueError(f"no CUDA device: --device {device} needs a GPU, and CUDA is not available to torch "
                         f"{torch.__version__} ({built})")


def main(argv: List[str]) -> int:
    from ..utils.subcommands import run_subcommand

    def bench(module: str) -> Callable[[List[str]], Any]:
        return lambda args: importlib.import_module(module).main(args)

    return run_subcommand("simattn bench", argv, {name: (bench(module), help_)
                                                   for name, (module, help_) in BENCHES.items()}, noun="benchmark")
