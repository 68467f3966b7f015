"""``simattn convert``: a pretrained softmax ViT → the same network with another attention kind, in two stages.

1. attention transfer (:class:`~simattn.convert.trainers.TransferTrainer`), ``convert.transfer_epochs`` epochs;
2. distillation fine-tune (:class:`~simattn.convert.trainers.DistillTrainer`), the rest of the ``epochs`` budget;

and, with ``compare``, two baselines at the whole budget: plain fine-tuning of the swapped model (no transfer, no
distillation) and training the student from scratch. Every stage is a run of the training engine in its own folder
(``transfer``, ``distill``, ``baselines/finetune``, ``baselines/scratch``; :class:`simattn.engine.stages.StagedRun`
owns the folders and their resume), and stage 2's final weights are copied to ``<output>/final.safetensors``, the
converted model.
"""
from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..engine.amp import run_precision
from ..engine.core import session
from ..engine.data import build_eval_loader
from ..engine.dist import barrier
from ..engine.stages import StagedRun
from ..classify.evaluation import evaluate
from ..classify.task import Trainer, open_datasets
from ..classify.transforms import build_transform, data_config_for
from ..utils.io import atomic_path, atomic_write_json
from .config import ConvertConfig
from .report import write_report
from .student import build_student, check_kind, load_teacher
from .trainers import DistillTrainer, TransferTrainer

__all__ = ["convert", "STAGES"]

#: stage → its run folder under the output
STAGES = {"transfer": "transfer", "distill": "distill", "finetune": "baselines/finetune", "scratch": "baselines/scratch"}
#: files the conversion itself writes into the output folder
OUTPUTS = ("final.safetensors", "results.json", "report.md", "convert.png")


def _curve(summary: Dict[str, Any], offset: int = 0) -> List[List[float]]:
    return [[r["epoch"] + offset, r["val_top1"]] for r in summary.get("history", []) if "val_top1" in r]


def convert(cfg: ConvertConfig, teacher_weights: str, model: Optional[str] = None,
            model_kwargs: Optional[Dict[str, Any]] = None, teacher_attn: Optional[str] = None) -> Dict[str, Any]:
    """Convert ``teacher_weights`` to ``cfg.convert.to`` with the budget ``cfg.epochs``; returns the results written
    to ``<cfg.output>/results.json`` (single process, or DDP under torchrun)."""
    from ..models.sources import resolve_source
    check_kind(cfg.convert.to)
    teacher_weights = resolve_source(teacher_weights)  # once: the teacher and the student's start read this source
    with session(cfg) as dist:
        stages = StagedRun(cfg, dist, "convert", STAGES, OUTPUTS, "conversion")
        return _convert(cfg, stages, teacher_weights, model, model_kwargs, teacher_attn)


def _convert(cfg: ConvertConfig, stages: StagedRun, teacher_weights: str, model: Optional[str],
             model_kwargs: Optional[Dict[str, Any]], teacher_attn: Optional[str]) -> Dict[str, Any]:
    dist, options = stages.dist, cfg.convert
    say = print if dist.is_main else (lambda *a, **k: None)
    # inputs first: nothing in the output folder changes before the teacher and the data are read
    teacher, spec = load_teacher(teacher_weights, model, model_kwargs, teacher_attn)
    kind = options.to
    if spec.get("attn_type") == kind:
        raise ValueError(f"the teacher {teacher_weights} already uses {kind} attention: nothing to convert "
                         "(fine-tune it with simattn train --initial-checkpoint)")
    _, val_set, classes = open_datasets(cfg)
    num_classes = len(classes)
    out = stages.open(inputs={"--weights": teacher_weights})
    teacher_classes = getattr(teacher, "num_classes", num_classes)
    if teacher_classes != num_classes:
        raise ValueError(f"the teacher {spec['model']} has {teacher_classes} classes but dataset {cfg.dataset!r} has "
                         f"{num_classes}: distillation needs the teacher's classifier for this dataset")
    student_model, student_kwargs, report = build_student(spec, kind, options.attn_kwargs, init_from=teacher_weights)
    model_kwargs_rec = {k: v for k, v in student_kwargs.items() if k != "num_classes"}
    # stage configs name the student network (checkpoints and weights metadata record it)
    base = cfg.stage_config(model=spec["model"], model_kwargs=model_kwargs_rec)
    metadata = {"attention": kind, "teacher": str(teacher_weights), "teacher_model": spec["model"],
                "teacher_attention": spec.get("attn_type")}
    say(f"teacher {spec['model']} ({spec.get('attn_type')}) from {teacher_weights} → student attn_type={kind}; "
        f"{report.summary()}", flush=True)

    # the teacher and the swapped model without training, on the recipe's evaluation preprocessing
    data_config = data_config_for(student_model, base)
    val_set.transform = build_transform(data_config)
    val_loader = build_eval_loader(val_set, cfg.batch_size, cfg.workers, dist,
                                   cfg.pin_memory and dist.device.type == "cuda")
    amp, amp_dtype, _ = run_precision(dist.device, cfg.amp, cfg.amp_dtype)  # the training stages print its note
    evaluate_kw = dict(amp=amp, amp_dtype=amp_dtype)
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

    stage_results, stage_times = _run_stages(cfg, stages, base, spec, teacher, teacher_weights, metadata, say)
    results.update(stage_results)
    results["final"] = dict(results["distill"]["final"], weights=str(out / "final.safetensors"))
    results["stage_time_s"] = stage_times
    if dist.is_main:
        with atomic_path(out / "final.safetensors") as tmp:
            shutil.copyfile(out / STAGES["distill"] / "final.safetensors", tmp)
        atomic_write_json(results, out / "results.json")
        say(write_report(results, out), flush=True)
    barrier()
    return results


def _run_stages(cfg: ConvertConfig, stages: StagedRun, base, spec: Dict[str, Any], teacher, teacher_weights: str,
                metadata: Dict[str, Any], say) -> Tuple[Dict[str, Any], Dict[str, float]]:
    """Stage 1 (when it has epochs), stage 2 and, with ``compare``, the baselines, each skipped or resumed as its
    folder says; returns their results and the seconds each stage run here took."""
    options, kind, out = cfg.convert, cfg.convert.to, stages.out
    results: Dict[str, Any] = {}

    def from_file(path: Optional[Path]):
        def factory(stage_cfg, n_classes):
            net, kwargs, _ = build_student(spec, kind, options.attn_kwargs, num_classes=n_classes, init_from=path)
            return net, kwargs
        return factory

    stage_times: Dict[str, float] = {}

    def run_stage(name: str, task_cls: type, changes: Dict[str, Any], **kwargs: Any) -> Dict[str, Any]:
        summary = stages.done(name)
        if summary is not None:
            say(f"== {name}: done earlier ({stages.folder(name) / 'summary.json'})", flush=True)
            return summary
        say(f"== {name}: {changes['epochs']} epoch(s) → {stages.folder(name)}", flush=True)
        start = time.perf_counter()
        summary = stages.run(name, dataclasses.replace(base, **changes), task_cls, **kwargs)
        stage_times[name] = time.perf_counter() - start
        return summary

    teacher_path = Path(teacher_weights)
    init_for_distill = teacher_path
    transfer = None
    if options.transfer_epochs:
        transfer = run_stage(
            "transfer", TransferTrainer,
            dict(epochs=options.transfer_epochs, lr=options.transfer_lr, warmup_epochs=options.transfer_warmup_epochs,
                 batch_size=options.transfer_batch_size or cfg.batch_size, weight_decay=0.0, model_ema=False),
            teacher=teacher, model_factory=from_file(teacher_path),
            metadata={**metadata, "stage": "attention transfer"}, params=options.transfer_params,
            loss=options.transfer_loss, target=options.transfer_target)
        init_for_distill = out / STAGES["transfer"] / "final.safetensors"
    distill = run_stage(
        "distill", DistillTrainer, dict(epochs=cfg.epochs - options.transfer_epochs), teacher=teacher,
        model_factory=from_file(init_for_distill), metadata={**metadata, "stage": "distillation"},
        alpha=options.distill_alpha, tau=options.distill_tau)
    results["transfer"] = _stage_result(transfer) if transfer else None
    results["distill"] = _stage_result(distill, options.transfer_epochs)
    if options.compare:
        results["finetune"] = _stage_result(run_stage("finetune", Trainer, dict(epochs=cfg.epochs),
                                                      model_factory=from_file(teacher_path)))
        results["scratch"] = _stage_result(run_stage("scratch", Trainer, dict(epochs=cfg.epochs),
                                                     model_factory=from_file(None)))
    return results, stage_times


def _stage_result(summary: Dict[str, Any], offset: int = 0) -> Dict[str, Any]:
    return {"epochs": summary["epochs"], "final": summary["final"], "best": summary["best"],
            "curve": _curve(summary, offset), "train_time_s": summary.get("train_time_s"),
            "output": str(Path(summary["files"]["last.pth"]).parent)}
