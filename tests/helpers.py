"""Helpers several test modules share: a folder's file digests, and state dicts in a released checkpoint's layout
(the names, shapes and dtypes its training code saves, recorded under tests/data/<family>_released/)."""
import hashlib
import json
from pathlib import Path
from typing import Dict

import torch

DATA = Path(__file__).parent / "data"


def digests(folder: Path) -> Dict[str, str]:
    """file name → sha256 of each file in ``folder`` (not its sub-folders)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def released_layout(folder: str, tag: str) -> dict:
    """The released layout of ``tag`` in ``tests/data/<folder>``: its own file, else its untagged model's."""
    path = DATA / folder / f"{tag}.json"
    if not path.exists():
        path = DATA / folder / f"{tag.split('.')[0]}.json"
    return json.loads(path.read_text())


def released_state(folder: str, tag: str, values: str = "seeded") -> Dict[str, torch.Tensor]:
    """Tensors in ``tag``'s released layout: ``meta`` (shapes only), ``empty`` (uninitialized, on CPU) or
    ``seeded`` (seed 0: integers 1-99, running variances in [0.5, 1.5), the rest N(0, 0.02²))."""
    gen = torch.Generator().manual_seed(0)
    state = {}
    for key, (shape, dtype) in released_layout(folder, tag)["keys"].items():
        if values != "seeded":
            state[key] = torch.empty(shape, dtype=getattr(torch, dtype), device="meta" if values == "meta" else None)
        elif dtype == "int64":
            state[key] = torch.randint(1, 100, shape, generator=gen)
        elif key.endswith("running_var"):
            state[key] = torch.rand(shape, generator=gen) + 0.5
        else:
            state[key] = torch.randn(shape, generator=gen) * 0.02
    return state
