"""``simattn convert``: a pretrained softmax ViT → the same network with another attention kind, in two stages.

1. attention transfer (:class:`~simattn.convert.trainers.TransferTrainer`), ``convert.transfer_epochs`` epochs;
2. distillation fine-tune (:class:`~simattn.convert.trainers.DistillTrainer`), the rest of the ``epochs`` budget;

and, with ``compare``, two baselines at the whole budget: plain fine-tuning of the swapped model (no transfer, no
distillation) and training the student from scratch. Every stage is a run of the training engine in its own folder
(``transfer``, ``distill``, ``baselines/finetune``, ``baselines/scratch``), and stage 2's final weights are copied to
``<output>/final.safetensors``, the converted model. On ``resume`` a stage whose ``summary.json`` exists is done and
is not run again, and one with a ``last.pth`` continues exactly where it stopped.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch.distributed as torch_dist

from ..train.engine import Trainer, open_datasets
from ..engine.data import build_eval_loader
from ..train.evaluation import evaluate
from ..train.transforms import build_transform, data_config_for
from ..utils.distributed import DistInfo, barrier, cleanup_distributed, init_distributed
from ..utils.io import atomic_path, atomic_write_json
from ..utils.recipe import recipe_name
from ..utils.runs import (check_not_in_use, held_run_folders, lock_run_folder, open_run_folder, release_run_folders,
                          run_files)
from ..utils.timing import set_threads
from .options import ConvertOptions
from .report import write_report
from .student import build_student, check_kind, load_teacher
from .trainers import DistillTrainer, TransferTrainer

__all__ = ["convert", "STAGES"]

#: stage → its run folder under the output
STAGES = {"transfer": "transfer", "distill": "distill", "finetune": "baselines/finetune", "scratch": "baselines/scratch"}
#: files the conversion itself writes into the output folder
OUTPUTS = ("final.safetensors", "results.json", "report.md", "convert.png")


def check_conversion_folder(out: Path) -> None:
    """Refuse (one-line error) to resume ``out`` unless it is a conversion's folder: nothing in it but the stage
    folders and the conversion's own files (an empty folder is a conversion stopped before its first stage). A
    train run's folder holds ``last.pth`` and ``metrics.jsonl``, which no conversion writes at its top."""
    if not out.is_dir():
        raise FileNotFoundError(f"no conversion to resume in {out}")
    stages = {name.split("/")[0] for name in STAGES.values()}
    foreign = [n for n in run_files(out) if not (n in OUTPUTS and (out / n).is_file())
               and not (n in stages and (out / n).is_dir())]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" (+{len(foreign) - 5} more)" if len(foreign) > 5 else "")
        raise ValueError(f"--resume: {out} holds no conversion to resume: it holds {shown}, which simattn convert "
                         "never writes there (another task's run, e.g. simattn train); give the --output of a "
                         "conversion, or start a new one in an empty folder (without --resume)")


def _stage_cfg(cfg, out: Path, **changes: Any):
    """The engine config of one stage: ``cfg`` with ``changes``, its own folder, and resume where it stopped (a
    stage of the resumed conversion killed before its first checkpoint starts again in its folder)."""
    has_state = (out / "last.pth").is_file()
    resume = "auto" if cfg.resume and has_state else None
    overwrite = cfg.overwrite or bool(cfg.resume and not has_state)
    return dataclasses.replace(cfg, output=str(out), resume=resume, overwrite=overwrite, **changes)


def _done(out: Path) -> Optional[Dict[str, Any]]:
    path = out / "summary.json"
    if path.is_file() and (out / "final.safetensors").is_file():
        return json.loads(path.read_text())
    return None


def _curve(summary: Dict[str, Any], offset: int = 0) -> List[List[float]]:
    return [[r["epoch"] + offset, r["val_top1"]] for r in summary.get("history", []) if "val_top1" in r]


def convert(cfg, options: ConvertOptions, teacher_weights: str, model: Optional[str] = None,
            model_kwargs: Optional[Dict[str, Any]] = None, teacher_attn: Optional[str] = None) -> Dict[str, Any]:
    """Convert ``teacher_weights`` to ``options.to`` with the budget ``cfg.epochs``; returns the results written to
    ``<cfg.output>/results.json`` (single process, or DDP under torchrun)."""
    check_kind(options.to)
    options.validate(cfg.epochs)
    if cfg.resume and not cfg.output:
        raise ValueError("option 'resume': give the folder of the conversion to continue (--output DIR)")
    if cfg.resume:
        check_conversion_folder(Path(cfg.output))
    created_group = not (torch_dist.is_available() and torch_dist.is_initialized())
    dist = init_distributed(cfg.device, cfg.dist_timeout)
    held = held_run_folders()
    try:
        return _convert(cfg, options, teacher_weights, model, model_kwargs, teacher_attn, dist)
    finally:
        release_run_folders(keep=held)  # the output and stage folders are free again once the conversion is over
        if created_group:
            cleanup_distributed()


def _convert(cfg, options: ConvertOptions, teacher_weights: str, model: Optional[str],
             model_kwargs: Optional[Dict[str, Any]], teacher_attn: Optional[str], dist: DistInfo) -> Dict[str, Any]:
    set_threads(cfg.threads)
    say = print if dist.is_main else (lambda *a, **k: None)
    if cfg.output and dist.is_main:  # another live conversion there: refused before the teacher and data are read
        check_not_in_use(Path(cfg.output))
    # inputs first: nothing in the output folder changes before the teacher and the data are read
    teacher, spec = load_teacher(teacher_weights, model, model_kwargs, teacher_attn)
    kind = options.to
    if spec.get("attn_type") == kind:
        raise ValueError(f"the teacher {teacher_weights} already uses {kind} attention: nothing to convert "
                         "(fine-tune it with simattn train --initial-checkpoint)")
    _, val_set, classes = open_datasets(cfg)
    num_classes = len(classes)
    if cfg.resume:  # the stage folders decide what is done; the conversion's own files are rewritten
        out = Path(cfg.output)
        barrier()  # every process has read the folder before the main one holds it
        if dist.is_main:
            lock_run_folder(out)
            check_conversion_folder(out)  # again, under the lock: another command may have written there meanwhile
    else:
        out = open_run_folder(cfg.output, recipe_name(cfg.recipe), "convert", overwrite=cfg.overwrite,
                              replaced=OUTPUTS, is_main=dist.is_main, inputs={"--weights": teacher_weights})
    teacher_classes = getattr(teacher, "num_classes", num_classes)
    if teacher_classes != num_classes:
        raise ValueError(f"the teacher {spec['model']} has {teacher_classes} classes but dataset {cfg.dataset!r} has "
                         f"{num_classes}: distillation needs the teacher's classifier for this dataset")
    student_model, student_kwargs, report = build_student(spec, kind, options.attn_kwargs, init_from=teacher_weights)
    model_kwargs_rec = {k: v for k, v in student_kwargs.items() if k != "num_classes"}
    # engine configs name the student network (checkpoints and weights metadata record it)
    cfg = dataclasses.replace(cfg, model=spec["model"], model_kwargs=model_kwargs_rec)
    metadata = {"attention": kind, "teacher": str(teacher_weights), "teacher_model": spec["model"],
                "teacher_attention": spec.get("attn_type")}
    say(f"teacher {spec['model']} ({spec.get('attn_type')}) from {teacher_weights} → student attn_type={kind}; "
        f"{report.summary()}", flush=True)

    # the teacher and the swapped model without training, on the recipe's evaluation preprocessing
    data_config = data_config_for(student_model, cfg)
    val_set.transform = build_transform(data_config)
    val_loader = build_eval_loader(val_set, cfg.batch_size, cfg.workers, dist, cfg.pin_memory)
    evaluate_kw = dict(amp=cfg.amp, amp_dtype=cfg.amp_dtype)
    teacher.to(dist.device)
    results: Dict[str, Any] = {
        "teacher": {"weights": str(teacher_weights), "model": spec["model"], "attention": spec.get("attn_type"),
                    **evaluate(teacher, val_loader, dist.device, **evaluate_kw)},
        "student": {"attention": kind, "model_kwargs": student_kwargs, "init": report.as_dict()},
        "zero_shot": evaluate(student_model.to(dist.device), val_loader, dist.device, **evaluate_kw),
        "recipe": cfg.recipe, "epochs": cfg.epochs, "convert": dataclasses.asdict(options),
        "world_size": dist.world_size, "output": str(out),
    }
    say(f"teacher val top-1 {results['teacher']['top1']:.2f}%, zero-shot {kind} student "
        f"{results['zero_shot']['top1']:.2f}%", flush=True)
    del student_model

    def from_file(path: Optional[Path]):
        def factory(stage_cfg, n_classes):
            net, kwargs, _ = build_student(spec, kind, options.attn_kwargs, num_classes=n_classes, init_from=path)
            return net, kwargs
        return factory

    stage_times: Dict[str, float] = {}

    def run_stage(name: str, make, **changes: Any) -> Dict[str, Any]:
        folder = out / STAGES[name]
        summary = _done(folder) if cfg.resume else None
        if summary is not None:
            say(f"== {name}: done earlier ({folder / 'summary.json'})", flush=True)
            return summary
        say(f"== {name}: {changes.get('epochs')} epoch(s) → {folder}", flush=True)
        start = time.perf_counter()
        stage_cfg = _stage_cfg(cfg, folder, **changes)
        summary = make(stage_cfg).run().summary
        stage_times[name] = time.perf_counter() - start
        return summary

    teacher_path = Path(teacher_weights)
    distill_epochs = cfg.epochs - options.transfer_epochs
    init_for_distill = teacher_path
    transfer = None
    if options.transfer_epochs:
        transfer = run_stage(
            "transfer",
            lambda c: TransferTrainer(c, dist, teacher=teacher, model_factory=from_file(teacher_path),
                                      metadata={**metadata, "stage": "attention transfer"},
                                      params=options.transfer_params, loss=options.transfer_loss,
                                      target=options.transfer_target),
            epochs=options.transfer_epochs, lr=options.transfer_lr, warmup_epochs=options.transfer_warmup_epochs,
            batch_size=options.transfer_batch_size or cfg.batch_size, weight_decay=0.0, model_ema=False)
        init_for_distill = out / STAGES["transfer"] / "final.safetensors"
    distill = run_stage(
        "distill",
        lambda c: DistillTrainer(c, dist, teacher=teacher, model_factory=from_file(init_for_distill),
                                 metadata={**metadata, "stage": "distillation"}, alpha=options.distill_alpha,
                                 tau=options.distill_tau),
        epochs=distill_epochs)
    results["transfer"] = _stage_result(transfer) if transfer else None
    results["distill"] = _stage_result(distill, options.transfer_epochs)
    if options.compare:
        results["finetune"] = _stage_result(run_stage(
            "finetune", lambda c: Trainer(c, dist, model_factory=from_file(teacher_path)), epochs=cfg.epochs))
        results["scratch"] = _stage_result(run_stage(
            "scratch", lambda c: Trainer(c, dist, model_factory=from_file(None)), epochs=cfg.epochs))
    results["final"] = dict(results["distill"]["final"], weights=str(out / "final.safetensors"))
    results["stage_time_s"] = stage_times
    if dist.is_main:
        with atomic_path(out / "final.safetensors") as tmp:
            shutil.copyfile(out / STAGES["distill"] / "final.safetensors", tmp)
        atomic_write_json(results, out / "results.json")
        say(write_report(results, out), flush=True)
    barrier()
    return results


def _stage_result(summary: Dict[str, Any], offset: int = 0) -> Dict[str, Any]:
    return {"epochs": summary["epochs"], "final": summary["final"], "best": summary["best"],
            "curve": _curve(summary, offset), "train_time_s": summary.get("train_time_s"),
            "output": str(Path(summary["files"]["last.pth"]).parent)}
