"""The two conversion stages as runs of the training engine (:class:`simattn.classify.task.Trainer`), so they get
its optimizers, schedules, AMP, DDP, exact kill-and-resume and atomic checkpoints.

Stage 1, attention transfer (:class:`TransferTrainer`), with one of two targets (``transfer_target``):

- ``attention``: each student attention layer receives the input the teacher's layer received (teacher forcing:
  every layer learns at once and none chases another's error) and learns to reproduce that layer's output, as in
  LoLCATs' attention transfer;
- ``block``: the student runs on its own residual stream and each block's output learns to match the teacher's
  block output (hidden-state alignment, as in MOHAWK, Bick et al., 2024). The gradient of a late block's error
  reaches the earlier attention layers, so they learn to correct what the approximation of the layers before them
  left behind, which teacher forcing cannot see; with few layers and a coarse approximation (SimA on short token
  sequences) this is the better target (the convert_digits recipe measures both).

Either way the loss is a per-layer relative mean squared error ``‖y_s − y_t‖² / ‖y_t‖²`` (so layers whose outputs
are larger do not dominate), averaged over layers, and only the attention blocks' own parameters train:
``qkv`` and ``proj`` by default, plus any parameter a kind adds (XCA's temperature), every other weight frozen.

Why those: LoLCATs (Zhang et al., 2024) and Hedgehog (Zhang et al., 2024) train only the new attention's feature
maps in this phase, with the teacher's q/k/v/o frozen, since the rest of the network is already right and only the
weighting changed. SimA has no feature map: q̂ and k̂ are l1 normalizations of q and k over tokens, which remove any
per-channel scale, so a learned temperature on q or k would be a no-op. What changes the weighting is the q and k
projections themselves (their rows decide which tokens each channel emphasizes), and what restores the output's
magnitude (SimA's outputs are not convex combinations of v) is v and ``proj``. T2R (Kasai et al., 2021) and SUPRA
(Mercat et al., 2024) likewise adapt the q/k projections of the converted model. So the trainable set is the
attention block: ``qkv`` (q, k and v rows) and ``proj``; a per-head output scale is covered by ``proj``'s columns.

Stage 2, distillation fine-tune (:class:`DistillTrainer`): every parameter trains on
``(1 − α)·CE(labels) + α·τ²·KL(softmax(z_t/τ) ‖ softmax(z_s/τ))`` (Hinton et al.), the teacher's logits under the
same augmentation.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..classify.task import Trainer
from .student import LAYOUT_PARAMS, attention_modules

__all__ = ["TransferTrainer", "DistillTrainer", "transfer_parameters", "transfer_loss", "distill_loss"]

#: what stage 1 matches: each attention output on the teacher's input, or each block output on the student's own
TARGETS = ("attention", "block")

ModelFactory = Callable[[Any, int], Tuple[nn.Module, Dict[str, Any]]]


def transfer_parameters(model: nn.Module, names: Sequence[str]) -> List[str]:
    """Freeze ``model`` except, in every attention layer, the sub-modules ``names`` (e.g. ``qkv``, ``proj``) and the
    kind's own parameters; returns the names of the trainable parameters."""
    allowed = set(LAYOUT_PARAMS)
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ValueError(f"transfer_params {list(names)!r}: allowed: a non-empty list of {', '.join(LAYOUT_PARAMS)}")
    for p in model.parameters():
        p.requires_grad_(False)
    trainable = []
    for prefix, attn in attention_modules(model):
        for pname, p in attn.named_parameters():
            owner = pname.split(".", 1)[0]
            if owner in names or owner not in allowed:
                p.requires_grad_(True)
                trainable.append(f"{prefix}.{pname}")
    return trainable


def transfer_loss(student_out: torch.Tensor, teacher_out: torch.Tensor, kind: str = "relative_mse") -> torch.Tensor:
    """One layer's stage-1 loss in fp32: ``mse`` or ``relative_mse`` (MSE over the teacher output's mean square)."""
    s, t = student_out.float(), teacher_out.float()
    mse = F.mse_loss(s, t)
    if kind == "mse":
        return mse
    return mse / t.pow(2).mean().clamp_min(1e-12)


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """τ²·KL(softmax(z_t/τ) ‖ softmax(z_s/τ)), batch mean, in fp32."""
    s = F.log_softmax(student_logits.float() / tau, dim=-1)
    t = F.log_softmax(teacher_logits.float() / tau, dim=-1)
    return F.kl_div(s, t, reduction="batchmean", log_target=True) * tau * tau


class _WithTeacher(Trainer):
    """A run whose model is built by ``model_factory`` and which also runs a frozen ``teacher``; exported weights
    name the new attention kind and the teacher."""

    producer = "simattn convert"

    def __init__(self, cfg, dist, *, teacher: nn.Module, model_factory: ModelFactory,
                 metadata: Dict[str, Any]) -> None:
        super().__init__(cfg, dist, model_factory=model_factory)
        self.teacher = teacher
        self._metadata = dict(metadata)

    def setup(self) -> None:
        super().setup()
        self.teacher.to(self.device).eval()  # before the student: stage 1 hooks into both

    def export_metadata(self) -> Dict[str, Any]:
        return dict(self._metadata)


class TransferTrainer(_WithTeacher):
    """Stage 1: the student's attention layers learn to reproduce the teacher's (see the module docstring)."""

    def __init__(self, cfg, dist, *, teacher: nn.Module, model_factory: ModelFactory, metadata: Dict[str, Any],
                 params: Sequence[str] = ("qkv", "proj"), loss: str = "relative_mse",
                 target: str = "attention") -> None:
        if target not in TARGETS:
            raise ValueError(f"transfer_target {target!r}: allowed: {', '.join(TARGETS)}")
        super().__init__(cfg, dist, teacher=teacher, model_factory=model_factory, metadata=metadata)
        self.transfer_params, self.loss_kind, self.target = tuple(params), loss, target
        self._teacher_in: Dict[int, torch.Tensor] = {}
        self._teacher_out: Dict[int, torch.Tensor] = {}
        self._student_out: Dict[int, torch.Tensor] = {}
        self._active = False

    def build_model(self, num_classes: int):
        model, kwargs = super().build_model(num_classes)
        self.trainable = transfer_parameters(model, self.transfer_params)
        t_layers, s_layers = attention_modules(self.teacher), attention_modules(model)
        if len(t_layers) != len(s_layers):
            raise ValueError(f"teacher has {len(t_layers)} attention layers, student {len(s_layers)}")
        for i, ((t_name, t_attn), (s_name, s_attn)) in enumerate(zip(t_layers, s_layers)):
            if self.target == "block":  # the module that holds the attention layer: its output is the stream
                t_mod, s_mod = (m.get_submodule(n.rsplit(".", 1)[0]) if "." in n else m
                                for m, n in ((self.teacher, t_name), (model, s_name)))
            else:
                t_mod, s_mod = t_attn, s_attn
                s_attn.register_forward_pre_hook(self._feed_student(i), with_kwargs=True)
            t_mod.register_forward_hook(self._capture(i, self._teacher_out, self._teacher_in))
            s_mod.register_forward_hook(self._capture(i, self._student_out))
        self.n_layers = len(s_layers)
        return model, kwargs

    # hooks: active only inside compute_loss, so evaluation sees the student as it is
    def _capture(self, i: int, outputs: Dict[int, torch.Tensor], inputs: Optional[Dict[int, torch.Tensor]] = None):
        def hook(module, args, output):
            if self._active:
                outputs[i] = output
                if inputs is not None:
                    inputs[i] = args[0]
        return hook

    def _feed_student(self, i: int):
        def hook(module, args, kwargs):
            if self._active:
                return (self._teacher_in[i],) + tuple(args[1:]), kwargs
            return None
        return hook

    def compute_loss(self, images: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self._active = True
        try:
            with torch.no_grad():
                self.teacher(images)
            # through the (DDP-wrapped) student, so gradients are averaged over ranks; its logits are not used
            self.forward_model(images)
            losses = [transfer_loss(self._student_out[i], self._teacher_out[i], self.loss_kind)
                      for i in range(self.n_layers)]
        finally:
            self._active = False
            for captured in (self._teacher_in, self._teacher_out, self._student_out):
                captured.clear()  # the hooks hold these very dicts
        return torch.stack(losses).mean()


class DistillTrainer(_WithTeacher):
    """Stage 2: all parameters, label cross-entropy plus KL to the teacher's logits."""

    def __init__(self, cfg, dist, *, teacher: nn.Module, model_factory: ModelFactory, metadata: Dict[str, Any],
                 alpha: float = 0.5, tau: float = 1.0) -> None:
        super().__init__(cfg, dist, teacher=teacher, model_factory=model_factory, metadata=metadata)
        self.alpha, self.tau = float(alpha), float(tau)

    def compute_loss(self, images: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.forward_model(images)
        with torch.no_grad():
            teacher_logits = self.teacher(images)
        loss = distill_loss(logits, teacher_logits, self.tau) * self.alpha
        if self.alpha < 1.0:
            loss = loss + (1.0 - self.alpha) * self.criterion(logits, target)
        return loss
