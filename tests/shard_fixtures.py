"""Small webdataset shards for the reader tests, written as the shard format fixes them: ``SPLIT-%06d.tar`` with
samples ``%08d`` (index in the split) holding ``png`` + ``cls`` (or ``mask.png``), and timm's ``_info.json``."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


def png_bytes(array: np.ndarray) -> bytes:
    from PIL import Image
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(array, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size, member.mtime, member.mode = len(data), 0, 0o444
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    tar.addfile(member, io.BytesIO(data))


def write_split(folder: Path, split: str, samples: Sequence[Dict[str, bytes]], shard_samples: int,
                classes: Sequence[str], task: str = "classification", extra: Optional[dict] = None) -> List[int]:
    """Write ``samples`` (each a dict of member extension → bytes) of ``split`` into shards of ``shard_samples``
    and add the split to ``folder/_info.json``; returns the shard lengths."""
    folder.mkdir(parents=True, exist_ok=True)
    names, lengths = [], []
    for shard, start in enumerate(range(0, len(samples), shard_samples)):
        name = f"{split}-{shard:06d}.tar"
        chunk = samples[start:start + shard_samples]
        with tarfile.open(folder / name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, sample in enumerate(chunk, start=start):
                for ext, data in sample.items():
                    _add(tar, f"{i:08d}.{ext}", data)
        names.append(name)
        lengths.append(len(chunk))
    info_path = folder / "_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {
        "name": "test", "task": task, "classes": list(classes), "num_classes": len(classes), "splits": {}}
    info.update(extra or {})
    info["splits"][split] = {"name": split, "num_samples": len(samples), "filenames": names,
                             "shard_lengths": lengths}
    info_path.write_text(json.dumps(info))
    return lengths


def digits_samples(split: str, limit: Optional[int] = None) -> Tuple[List[Dict[str, bytes]], List[Tuple[bytes, int]]]:
    """The embedded digits of ``split`` as shard samples (grey PNG + label), and (pixels, label) of each."""
    from simattn.data.digits import DigitsDataset
    ds = DigitsDataset(split)
    n = len(ds) if limit is None else min(limit, len(ds))
    samples = [{"png": png_bytes(ds.images[i]), "cls": str(int(ds.targets[i])).encode()} for i in range(n)]
    return samples, [(ds.images[i].tobytes(), int(ds.targets[i])) for i in range(n)]


def write_digits(folder: Path, shard_samples: int = 200, limit: Optional[int] = None) -> Path:
    """The digits' train and val splits packed into ``folder``."""
    from simattn.data.digits import DIGITS_CLASSES
    for split in ("train", "val"):
        write_split(folder, split, digits_samples(split, limit)[0], shard_samples, DIGITS_CLASSES)
    return folder


def write_numbered(folder: Path, split: str, lengths: Sequence[int], classes: int = 2) -> None:
    """Shards of tiny images whose label is their sample index modulo ``classes`` (for counting who saw what)."""
    samples = []
    for i in range(sum(lengths)):
        pixels = np.full((4, 4), i % 256, np.uint8)
        samples.append({"png": png_bytes(pixels), "cls": str(i % classes).encode()})
    folder.mkdir(parents=True, exist_ok=True)
    names, start = [], 0
    for shard, n in enumerate(lengths):
        name = f"{split}-{shard:06d}.tar"
        with tarfile.open(folder / name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(start, start + n):
                for ext, data in samples[i].items():
                    _add(tar, f"{i:08d}.{ext}", data)
        names.append(name)
        start += n
    info_path = folder / "_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {
        "name": "numbered", "task": "classification", "classes": [str(c) for c in range(classes)],
        "num_classes": classes, "splits": {}}
    info["splits"][split] = {"name": split, "num_samples": sum(lengths), "filenames": names,
                             "shard_lengths": list(lengths)}
    info_path.write_text(json.dumps(info))
