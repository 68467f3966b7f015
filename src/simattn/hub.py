"""``simattn hub save``: trained weights as the folder timm shares models in, on disk or on the Hugging Face Hub.

::

    simattn hub save --weights runs/digits/final.safetensors --output hub/sima-digits
    simattn hub save --weights runs/digits/final.safetensors --output hub/sima-digits --push my-org/sima-digits

The folder (:mod:`simattn.models.hub`) holds timm's ``config.json`` (architecture, ``num_classes``,
``num_features``, ``model_args``, ``pretrained_cfg`` with the preprocessing; for a segmenter also the task, class
names and palette), ``model.safetensors`` with the weights record, and a ``README.md`` model card: the run's
metrics, data and recipe (from the record and the ``summary.json`` / ``config.yaml`` beside the weights), and the
simattn, timm and torch versions. After ``import simattn``, timm's ``create_model`` given ``local-dir:DIR`` and
``pretrained=True`` rebuilds a classifier with the same logits, and every simattn command takes
``--weights local-dir:DIR`` or ``--weights hf-hub:ORG/NAME``. ``--push`` uploads the folder with ``huggingface_hub`` (a token from ``HF_TOKEN`` or
``hf auth login``).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

__all__ = ["main", "save_options", "build_save_parser", "run_save", "model_card", "push_folder"]

SUBCOMMANDS = {
    "save": "write weights as the folder timm reads (config.json, model.safetensors, README.md); --push uploads it",
}

#: the most characters of the run's config.yaml quoted in the model card
MAX_RECIPE_CHARS = 20000


def save_options():
    """The options of ``simattn hub save``, each declared once."""
    from .utils.recipe import Opt, check_path, maybe
    path = dict(type=maybe(str), check=check_path)
    return {
        "weights": Opt(None, "the weights (required): a .safetensors file simattn wrote, a run's last.pth, or "
                       "another folder (local-dir:DIR, hf-hub:ORG/NAME)", **path),
        "output": Opt(None, "the folder to write (required unless --push): new or empty, or one hub save wrote "
                      "with --overwrite",
                      **path),
        "overwrite": Opt(False, "replace the folder's config.json, model.safetensors and README.md (a folder "
                         "holding any other file is refused)"),
        "use_ema": Opt(False, "a last.pth: save its EMA weights"),
        "push": Opt(None, "also upload the folder to this Hugging Face Hub repository (ORG/NAME; created if absent)",
                    type=maybe(str), check=_check_repo_id),
        "private": Opt(False, "with --push: create the repository private"),
    }


def _check_repo_id(text: str) -> Optional[str]:
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    if text.count("/") != 1:
        return "allowed: a Hub repository as ORG/NAME"
    try:
        validate_repo_id(text)
    except HFValidationError as e:
        return f"allowed: a Hub repository as ORG/NAME ({str(e).splitlines()[0][:200]})"
    return None


def build_save_parser() -> argparse.ArgumentParser:
    from .utils.recipe import command_parser
    return command_parser("simattn hub save", SUBCOMMANDS["save"], save_options())


def _check_inputs(args: Mapping[str, Any]) -> None:
    """The one-line refusals that come before any work."""
    from . import deploy
    from .models.hub import CARD_NAME, CONFIG_NAME, WEIGHTS_NAME, hub_name
    from .models.sources import resolve_source
    from .utils.io import check_new_folder

    if args["weights"] is None:
        raise ValueError("--weights is required (simattn hub save --weights W.safetensors --output DIR)")
    if args["output"] is None and args["push"] is None:
        raise ValueError("--output DIR or --push ORG/NAME is required: where the folder goes")
    if args["private"] and args["push"] is None:
        raise ValueError("--private applies to --push only (the repository it creates)")
    if hub_name(args["weights"]) is None and deploy.for_path(args["weights"]) is not None:
        raise ValueError(f"--weights {args['weights']} is an exported file; hub save takes the weights it was "
                         "exported from (.safetensors, or a run's last.pth)")
    source = args["weights"] = resolve_source(args["weights"])  # once: the steps below read this source
    if args["output"] is not None:
        weights = os.path.realpath(source.path)
        folder = os.path.realpath(args["output"])
        if args["overwrite"] and os.path.commonpath([weights, folder]) == folder:
            raise ValueError(f"--weights {args['weights']} is inside --output {args['output']}, which --overwrite "
                             "replaces: copy the weights elsewhere or choose another --output")
        check_new_folder(args["output"], args["overwrite"], writes=(CONFIG_NAME, WEIGHTS_NAME, CARD_NAME))
    if args["push"] is not None:
        from huggingface_hub import get_token
        if not get_token():
            raise ValueError(f"--push {args['push']} needs a Hugging Face token: set HF_TOKEN or run `hf auth login`")


def run_save(argv: List[str]) -> Dict[str, Any]:
    """``simattn hub save`` with arguments ``argv``; returns what was written (``folder``, ``files``, ``pushed``)."""
    from .detect.model import detector_config, load_detector
    from .models.factory import attention_kind, load_model
    from .models.hub import hub_config, save_hub_folder
    from .utils.recipe import checked_flags

    args = checked_flags(build_save_parser().parse_args(argv), save_options())
    _check_inputs(args)
    source = args["weights"]
    path = source.path
    detector = load_detector(source, use_ema=args["use_ema"])
    if detector is not None:  # not a timm model: its folder is read by simattn detect
        model, record = detector
        config = detector_config(model, record)
    else:
        record = source.record
        if record is None:
            raise ValueError(f"weights {args['weights']} do not name their model (no simattn record): hub save "
                             "takes files simattn wrote (train, segment, detect, ssl, convert)")
        model, spec = load_model(None, source, use_ema=args["use_ema"])
        record.model_kwargs = dict(spec["config"])
        record.num_classes = getattr(model, "num_classes", record.num_classes)
        config = hub_config(model, record.model, record.data_config, **_task_entries(record))
    run = _run_facts(path)
    card = model_card(record, config, run, params=sum(p.numel() for p in model.parameters()),
                      attention=attention_kind(model), repo=args["push"])
    metadata = record.to_metadata()
    result: Dict[str, Any] = {"weights": str(args["weights"]), "model": record.model, "pushed": None}
    if args["output"] is not None:
        folder = save_hub_folder(model, config, metadata, args["output"], card, overwrite=args["overwrite"])
        result["folder"] = str(folder)
        print(f"wrote {folder} (config.json, model.safetensors, README.md); load it with "
              f"{_how_to_load(f'local-dir:{folder}', record)}", flush=True)
        if args["push"] is not None:
            result["pushed"] = push_folder(folder, args["push"], private=args["private"])
    else:
        with tempfile.TemporaryDirectory(prefix="simattn-hub-") as tmp:
            folder = save_hub_folder(model, config, metadata, Path(tmp) / "folder", card)
            result["pushed"] = push_folder(folder, args["push"], private=args["private"])
    if result["pushed"]:
        print(f"uploaded to {result['pushed']}; load it with {_how_to_load(f'hf-hub:' + args['push'], record)}",
              flush=True)
    return result


def _how_to_load(name: str, record) -> str:
    """How the folder ``name`` is opened: by timm (a classifier) and by every simattn command's ``--weights``."""
    from .models.hub import timm_loader
    simattn_only = record.extra.get("task") in ("semantic_segmentation", "instance_segmentation")
    return f"--weights {name}" if simattn_only else f"{timm_loader(name)} after import simattn, or --weights {name}"


def push_folder(folder: Path, repo_id: str, *, private: bool = False) -> str:
    """Upload ``folder`` to the Hub repository ``repo_id`` (created when absent) with ``huggingface_hub``; returns
    the repository's URL. Network and Hub failures are one-line ValueErrors naming the Hub."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        repo_id = getattr(url, "repo_id", None) or repo_id
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="simattn hub save")
    except HfHubHTTPError as e:
        raise ValueError(f"--push {repo_id}: the Hugging Face Hub refused the upload: "
                         f"{str(e).splitlines()[0][:200]}") from None
    except OSError as e:  # no network: the connection fails below huggingface_hub's own errors
        raise ValueError(f"--push {repo_id}: cannot reach the Hugging Face Hub (huggingface.co) over the network: "
                         f"{type(e).__name__}: {str(e)[:200]}") from None
    return f"https://huggingface.co/{repo_id}"


def _task_entries(record) -> Dict[str, Any]:
    """config.json's entries besides timm's: the class names (timm's ``label_names``) and, for a segmenter, the
    task, the dataset's label values, palette and ignored value."""
    extra = record.extra
    entries: Dict[str, Any] = {}
    if isinstance(extra.get("classes"), list):
        entries["label_names"] = [str(c) for c in extra["classes"]]
    for key in ("task", "dataset", "label_ids", "palette", "ignore_index"):
        if extra.get(key) is not None:
            entries[key] = extra[key]
    return entries


def _run_facts(weights: Path) -> Dict[str, Any]:
    """What the run folder beside ``weights`` says: ``summary`` (summary.json) and ``recipe`` (config.yaml's text)."""
    facts: Dict[str, Any] = {}
    summary = weights.parent / "summary.json"
    if summary.is_file():
        try:
            facts["summary"] = json.loads(summary.read_text())
        except (OSError, ValueError):
            pass  # a damaged summary leaves the card without the run's metrics, not the weights unshared
    recipe = weights.parent / "config.yaml"
    if recipe.is_file():
        try:
            facts["recipe"] = recipe.read_text()[:MAX_RECIPE_CHARS]
        except (OSError, UnicodeDecodeError):
            pass
    return facts


def _scalars(mapping: Any, prefix: str = "") -> Dict[str, Any]:
    if not isinstance(mapping, Mapping):
        return {}
    return {f"{prefix}{k}": v for k, v in mapping.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _metrics(record, summary: Mapping[str, Any]) -> Dict[str, Any]:
    """The run's headline numbers: the summary's final/best/EMA scores, else those the record holds."""
    found: Dict[str, Any] = {}
    for section in ("final", "best", "ema"):
        found.update(_scalars(summary.get(section), f"{section} "))
    evaluation = summary.get("eval") if isinstance(summary.get("eval"), Mapping) else {}
    for section in ("bbox", "segm"):  # a detector's last COCO evaluation
        found.update(_scalars(evaluation.get(section), f"{section} "))
    if not found:
        found.update(_scalars(record.extra.get("metrics")))
        found.update(_scalars({k: record.extra[k] for k in ("miou", "epoch") if k in record.extra}))
    return found


def _dataset(record, summary: Mapping[str, Any], recipe: Optional[str]) -> Optional[str]:
    if record.extra.get("dataset"):
        return str(record.extra["dataset"])
    if recipe:
        from .utils.values import load_yaml
        try:
            config = load_yaml(recipe, "config.yaml")
        except ValueError:
            config = None
        if isinstance(config, Mapping) and config.get("dataset"):
            return str(config["dataset"])
    return None


def model_card(record, config: Mapping[str, Any], run: Mapping[str, Any], *, params: int,
               attention: Optional[str] = None, repo: Optional[str] = None) -> str:
    """The folder's ``README.md``: timm's model card (``generate_readme``: front matter, details, usage) with the
    run's metrics, recipe and the versions that wrote it."""
    import timm
    import torch
    from timm.models._hub import generate_readme

    from . import __version__
    from .models.hub import timm_loader

    summary = run.get("summary") or {}
    kind = {"semantic_segmentation": "segmenter", "instance_segmentation": "detector"}.get(
        record.extra.get("task"), "classifier")
    task = {"segmenter": "image-segmentation", "detector": "object-detection"}.get(kind, "image-classification")
    dataset = _dataset(record, summary, run.get("recipe"))
    attention = attention or record.extra.get("attention") or record.model_kwargs.get("attn_type")
    size = (config.get("pretrained_cfg") or {}).get("input_size")
    details: Dict[str, Any] = {"Model type": {"segmenter": "Semantic segmentation",
                                              "detector": "Object detection and instance segmentation (Mask R-CNN)"
                                              }.get(kind, "Image classification"),
                               "Architecture": record.model, "Params (M)": f"{params / 1e6:.2f}"}
    if record.model_kwargs.get("backbone"):
        details["Backbone"] = record.model_kwargs["backbone"]
    if attention:
        details["Attention"] = attention
    if size:
        details["Image size"] = f"{size[1]} x {size[2]}"
    details["Classes"] = record.num_classes
    if dataset:
        details["Dataset"] = dataset
    load = f"hf-hub:{repo}" if repo else "local-dir:PATH/TO/THIS/FOLDER"
    usage = ("```python\nimport simattn  # registers the SimA families with timm\nimport timm\n\n"
             f"model = {timm_loader(load)}.eval()\n```\n\n"
             f"Or with the simattn commands: `simattn validate --weights {load}`.\n")
    if kind != "classifier":
        command = "validate" if kind == "segmenter" else "detect eval --config RECIPE"
        usage = (f"```bash\nsimattn {command} --weights {load}\n```\n\nThe {kind} loads through simattn "
                 "(`--weights`), which rebuilds it from the record in `model.safetensors`.\n")
    text = generate_readme({"tags": [task, "timm", "simattn"] + ([attention] if attention else []),
                            "description": f"{record.model} trained with {record.producer or 'simattn'} "
                                           f"(softmax-free attention: {attention or 'see model_args'}).",
                            "details": details, "usage": usage},
                           repo.split("/")[-1] if repo else record.model, task_name=task)
    metrics = _metrics(record, summary)
    if metrics:
        text += "\n## Results\n\n| metric | value |\n|---|---|\n"
        text += "".join(f"| {k} | {v:.4g} |\n" if isinstance(v, float) else f"| {k} | {v} |\n"
                        for k, v in metrics.items())
    if run.get("recipe"):
        text += f"\n## Training recipe\n\nThe run's `config.yaml`:\n\n```yaml\n{run['recipe'].rstrip()}\n```\n"
    elif record.extra.get("recipe"):
        text += f"\n## Training recipe\n\n`{record.extra['recipe']}` (simattn's shipped recipes: `-c NAME`)\n"
    text += (f"\n## Versions\n\n- weights written by {record.producer or 'simattn'} "
             f"{record.simattn_version or '(version not recorded)'}\n- folder written by simattn {__version__}, "
             f"timm {timm.__version__}, torch {torch.__version__}\n")
    return text


def main(argv: List[str]) -> int:
    from .utils.subcommands import run_subcommand
    return run_subcommand("simattn hub", argv, {"save": (run_save, SUBCOMMANDS["save"])})
