"""Frozen-feature evaluations of a backbone: weighted k-NN (DINO's, k=20) and a linear probe.

Features: the pooled/CLS output (``model(x)`` of a timm model built with ``num_classes=0``) for k-NN; for the
linear probe, ``model.forward_linear_probe_features(x)`` when the model has it (XCiT-SimA: both class-attention CLS
outputs and the pooled patch tokens of the last two blocks, as in the paper), else the same pooled/CLS features.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .data import build_image_dataset
from ..utils.runlog import progress

__all__ = ["feature_fn", "extract_features", "knn_classify", "linear_probe", "eval_transform",
           "recalibrate_batchnorm", "evaluate_backbone"]


def feature_fn(model: nn.Module, kind: str = "pooled") -> Callable[[torch.Tensor], torch.Tensor]:
    """The function mapping images to frozen features: ``'pooled'`` (CLS/pooled, what DINO's head sees) or
    ``'linear_probe'`` (the model's ``forward_linear_probe_features`` if it has one, else pooled)."""
    if kind not in ("pooled", "linear_probe"):
        raise ValueError(f"unknown feature kind {kind!r}; expected 'pooled' or 'linear_probe'")
    if kind == "linear_probe" and hasattr(model, "forward_linear_probe_features"):
        return model.forward_linear_probe_features
    if getattr(model, "num_classes", 0):
        # A classifier: take the features before the head, not the logits.
        return lambda x: model.forward_head(model.forward_features(x), pre_logits=True)
    return model


@torch.no_grad()
def extract_features(model: nn.Module, dataset: Dataset, kind: str = "pooled", batch_size: int = 256,
                     device: torch.device | str = "cpu", workers: int = 0,
                     show_progress: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """Features (N, D) as fp32 on the CPU and labels (N,) of a labelled image dataset, with the model in eval mode."""
    was_training = model.training
    model.eval()
    fn = feature_fn(model, kind)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers)
    feats, labels = [], []
    for x, y in progress(loader, f"features ({kind})", enabled=show_progress):
        feats.append(fn(x.to(device)).float().cpu())
        labels.append(torch.as_tensor(y))
    model.train(was_training)
    return torch.cat(feats), torch.cat(labels)


@torch.no_grad()
def knn_classify(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                 k: int = 20, temperature: float = 0.07, chunk: int = 1024) -> float:
    """Top-1 accuracy (%) of DINO's weighted k-NN: cosine similarity, the k nearest training features vote for
    their class with weight exp(similarity / temperature)."""
    if len(train_x) == 0 or len(test_x) == 0:
        raise ValueError("knn_classify: empty training or test features")
    if k < 1:
        raise ValueError(f"knn_classify: k must be >= 1, got {k}")
    num_classes = int(max(train_y.max(), test_y.max())) + 1
    k = min(k, len(train_x))
    train_x = F.normalize(train_x.float(), dim=1)
    correct = 0
    for start in range(0, len(test_x), chunk):
        query = F.normalize(test_x[start:start + chunk].float(), dim=1)
        sim, idx = (query @ train_x.T).topk(k, dim=1)
        votes = torch.zeros(len(query), num_classes).scatter_add_(1, train_y[idx], (sim / temperature).exp())
        correct += (votes.argmax(1) == test_y[start:start + chunk]).sum().item()
    return 100.0 * correct / len(test_x)


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor, *,
                 epochs: int = 100, lr: float = 1e-3, batch_size: int = 256, momentum: float = 0.9,
                 weight_decay: float = 0.0, seed: int = 0) -> float:
    """Top-1 accuracy (%) of a linear classifier trained by SGD (cosine lr) on frozen features.

    Features are standardized with the training set's mean and std first (a fixed, non-learned BatchNorm), so one
    learning rate suits backbones whose feature scales differ widely (random init vs trained).
    """
    if epochs < 1:
        raise ValueError(f"linear_probe: epochs must be >= 1, got {epochs}")
    generator = torch.Generator().manual_seed(seed)
    mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    num_classes = int(max(train_y.max(), test_y.max())) + 1
    clf = nn.Linear(train_x.shape[1], num_classes)
    nn.init.normal_(clf.weight, std=0.01, generator=generator)
    nn.init.zeros_(clf.bias)
    opt = torch.optim.SGD(clf.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    steps_per_epoch = -(-len(train_x) // batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * steps_per_epoch)
    for _ in range(epochs):
        order = torch.randperm(len(train_x), generator=generator)
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            loss = F.cross_entropy(clf(train_x[batch]), train_y[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    with torch.no_grad():
        return 100.0 * (clf(test_x).argmax(1) == test_y).float().mean().item()


def recalibrate_batchnorm(model: nn.Module, dataset: Dataset, batch_size: int = 256,
                          device: torch.device | str = "cpu", workers: int = 0) -> nn.Module:
    """A copy of ``model`` whose BatchNorm running statistics are re-estimated on ``dataset`` (weights unchanged),
    via torch's ``update_bn``; ``model`` itself is returned when it has no BatchNorm.

    A randomly initialized network's running statistics (mean 0, variance 1) describe no data at all; comparing it
    with a trained one whose statistics were estimated while training would credit the training with the difference.
    """
    import copy

    from torch.optim.swa_utils import update_bn
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return model
    model = copy.deepcopy(model)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers)
    update_bn((x for x, _ in loader), model, device=torch.device(device))
    return model.eval()


def eval_transform(model: nn.Module, img_size: int, crop_pct: float = 1.0):
    """timm's evaluation transform (resize, center crop, normalize with the model's mean/std)."""
    from timm.data import create_transform, resolve_data_config
    cfg = resolve_data_config({"input_size": (3, img_size, img_size), "crop_pct": crop_pct}, model=model)
    return create_transform(**cfg, is_training=False)


def evaluate_backbone(model: nn.Module, cfg: Any, device: torch.device | str = "cpu", show_progress: bool = True,
                      recalibrate_bn: bool = False) -> Dict[str, Any]:
    """k-NN and (if ``cfg.eval.linear_epochs > 0``) linear-probe top-1 of a frozen backbone.

    ``cfg`` is an ssl recipe (:class:`simattn.ssl.config.SslConfig`: its ``data`` and ``eval`` sections, ``workers``
    and ``seed``); training images are the k-NN memory bank and the probe's training set, validation images are
    classified. ``recalibrate_bn`` evaluates a copy whose BatchNorm statistics are re-estimated on the training
    images first.
    """
    evaluation = cfg.eval
    tf = eval_transform(model, evaluation.img_size, evaluation.crop_pct)
    data = dataclasses.asdict(cfg.data)
    train_ds = build_image_dataset(data, "train", tf)
    val_ds = build_image_dataset(data, "val", tf)
    if recalibrate_bn:
        model = recalibrate_batchnorm(model, train_ds, evaluation.batch_size, device, cfg.workers)
    common = dict(batch_size=evaluation.batch_size, device=device, workers=cfg.workers, show_progress=show_progress)
    train_x, train_y = extract_features(model, train_ds, "pooled", **common)
    val_x, val_y = extract_features(model, val_ds, "pooled", **common)
    out: Dict[str, Any] = {
        "knn_top1": knn_classify(train_x, train_y, val_x, val_y, evaluation.knn_k, evaluation.knn_temperature),
        "knn_k": evaluation.knn_k,
        "feature_dim": train_x.shape[1],
    }
    if evaluation.linear_epochs > 0:
        if hasattr(model, "forward_linear_probe_features"):
            train_x, train_y = extract_features(model, train_ds, "linear_probe", **common)
            val_x, val_y = extract_features(model, val_ds, "linear_probe", **common)
        out["linear_top1"] = linear_probe(train_x, train_y, val_x, val_y, epochs=evaluation.linear_epochs,
                                          lr=evaluation.linear_lr, batch_size=evaluation.linear_batch_size,
                                          seed=cfg.seed)
        out["linear_feature_dim"] = train_x.shape[1]
    return out
