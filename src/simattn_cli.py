"""The ``simattn`` command's entry point.

It lives outside the ``simattn`` package because importing that package registers every model with timm, which
loads torch, timm and torchvision (seconds); the usage text and the subcommand table need none of them. A
subcommand's module (and so torch) is imported only when that subcommand runs, by
:func:`simattn.commands.run_command`.
"""
from __future__ import annotations

import difflib
import sys
from typing import List, Optional

#: subcommand → (module with ``main(argv)``, one-line help)
COMMANDS = {
    "bench": ("simattn.bench.cli", "benchmarks: attention kernels, whole models, the paper's tables"),
    "train": ("simattn.train.cli", "train a model from a YAML recipe (torchrun for DDP)"),
    "validate": ("simattn.validate", "top-1/top-5 accuracy and loss of a model + weights"),
    "demo": ("simattn.demo", "train SimA and softmax twins on the embedded digits data and compare"),
    "export": ("simattn.export.cli", "export to ONNX, ExecuTorch, Core ML, OpenVINO or TFLite (fp32 or int8), audit "
                                     "exp-like ops, check parity"),
    "viz": ("simattn.viz.cli", "q̂/k̂ token-importance heatmaps"),
    "ssl": ("simattn.ssl.cli", "DINO self-supervised pretraining with k-NN / linear evaluation"),
    "segment": ("simattn.segment.cli", "semantic segmentation (Semantic FPN, UperNet) on any backbone, mIoU"),
    "detect": ("simattn.detect.cli", "Mask R-CNN detection with a SimA backbone"),
    "convert": ("simattn.convert.cli", "turn a pretrained softmax ViT into a SimA (or other softmax-free) ViT"),
    "data": ("simattn.data.cli", "dataset tools: pack any dataset into webdataset shards (timm's _info.json)"),
    "hub": ("simattn.hub", "share weights as timm does: a local-dir:/hf-hub: folder (config.json, model.safetensors, "
                           "model card), --push to the Hugging Face Hub"),
    "list": ("simattn.listing", "list attention kinds, models, shipped recipes and pretrained tags (PATTERN filters)"),
    "build-kernels": ("simattn.kernels.cpu.sima", "compile SimA's CPU kernel for this machine (setup runs it)"),
}


def version() -> str:
    """The installed distribution's version (read from its metadata: no import of the package, so no torch)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("simattn")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def usage() -> str:
    lines = ["usage: simattn <command> [options]", "       simattn --version", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'simattn <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"simattn {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS), n=3)
        known = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(COMMANDS)}"
        print(f"simattn: unknown command {name!r}; {known} (simattn --help lists them)", file=sys.stderr)
        return 2
    from simattn.commands import run_command

    return run_command(name, COMMANDS[name][0], rest)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
