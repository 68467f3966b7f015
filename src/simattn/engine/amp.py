"""Mixed precision for the engine and its tasks: ``torch.autocast`` in the recipe's dtype and, for fp16, the loss
scaling that keeps small gradients from flushing to zero (bf16 and fp32 need none)."""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Optional, Tuple

import torch

__all__ = ["autocast", "grad_scaler", "run_precision", "MixedPrecision"]


def autocast(device: torch.device, enabled: bool, dtype: str = "float16"):
    """``torch.autocast`` for ``device`` in ``dtype`` ('float16' | 'bfloat16'), or a no-op when not ``enabled``."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))


def grad_scaler(device: torch.device, enabled: bool, dtype: str = "float16") -> Optional[torch.amp.GradScaler]:
    """The loss scaler fp16 autocast needs (None for bf16, fp32, or when not ``enabled``)."""
    if not enabled or dtype != "float16":
        return None
    return torch.amp.GradScaler(device.type)


def cpu_has_native(dtype: str) -> bool:
    """Whether this CPU does ``dtype`` ('float16' | 'bfloat16') arithmetic in hardware (oneDNN's own check: AVX-512
    FP16 / AMX, AVX-512 BF16 / AMX); without it autocast emulates the dtype, several times slower than fp32."""
    check = {"float16": "_is_mkldnn_fp16_supported", "bfloat16": "_is_mkldnn_bf16_supported"}[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):
        return False


def run_precision(device: torch.device, enabled: bool, dtype: str = "float16") -> Tuple[bool, str, Optional[str]]:
    """The autocast a recipe's run uses: ``(enabled, dtype, note)``. On a CPU without arithmetic in the recipe's
    ``amp_dtype`` the run is fp32 instead (emulated, a DeiT forward took 9.5x fp32's time in fp16 and a ViT-S 5x in
    bf16 on an AVX2 CPU), and ``note`` says so in one line; otherwise the recipe's own and no note."""
    if not enabled or device.type != "cpu" or cpu_has_native(dtype):
        return enabled, dtype, None
    short = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    bf16 = (" (this CPU has bf16 arithmetic: --amp-dtype bfloat16 for bf16 autocast)"
            if dtype == "float16" and cpu_has_native("bfloat16") else "")
    return False, dtype, (f"note: amp {dtype} on a CPU without {short} arithmetic is emulated, several times slower "
                          f"than fp32: running in fp32{bf16}; --no-amp silences this")


class MixedPrecision:
    """The autocast and loss scaling of one training run (``enabled``: the recipe's ``amp``; ``dtype``: its
    ``amp_dtype``, as :func:`run_precision` gives them for the device; ``note`` says what it changed). Without a
    scaler each call is the plain fp32 step."""

    def __init__(self, device: torch.device, enabled: bool, dtype: str = "float16") -> None:
        enabled, dtype, self.note = run_precision(device, enabled, dtype)
        self.device, self.enabled, self.dtype = device, enabled, dtype
        self.scaler = grad_scaler(device, enabled, dtype)

    def autocast(self):
        return autocast(self.device, self.enabled, self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring the gradients back to their true scale (before clipping or changing them)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step (the scaler skips it when the fp16 gradients overflowed) and the scale's update."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> Optional[Dict[str, Any]]:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
