"""webdataset tar shards (the layout ``simattn data pack`` writes, timm's ``_info.json``) as an iterable dataset.

``--data-dir`` is a folder holding ``_info.json`` and the shards it lists, or a shard pattern: a brace pattern
(``/x/train-{000000..000006}.tar``) or a ``pipe:`` URL (``pipe:cat /x/train-{000000..000006}.tar``, ``pipe:aws s3 cp
s3://b/train-{000000..000006}.tar -``). A pattern takes its per-shard counts from the ``_info.json`` next to the shards
(read through the same command for ``pipe:``); it names the shards of one split, and other splits (validation) are
read through the same URL with the file names ``_info.json`` lists for them.

Tars are read by the webdataset package. Which shards a process reads is decided per (rank, DataLoader worker):
:meth:`ShardDataset.configure` (the engine calls it) sets the ranks, the per-epoch shuffle and the seed;
without it a DataLoader over the dataset yields every sample once (its workers split the shards). Shard ``i`` of an
epoch's order goes to rank ``i % world_size`` and, within it, to worker ``(i // world_size) % workers``.

Bad data stops with a one-line :class:`ShardError` (a ValueError, one line even when raised in a DataLoader worker)
naming the shard: a truncated tar, a sample with an image and no label (or mask), a label outside the classes, and a
shard holding another count of samples than ``_info.json`` records. What can be checked without reading the shards
(the info itself, local shards missing or cut short) is checked when the dataset is opened.
"""
from __future__ import annotations

import io
import json
import logging
import os
import random
import shlex
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..utils.values import first_line, quoted
from .segmentation import STORED_READERS

#: undecoded samples each training stream holds to shuffle within and across its shards (webdataset's default)
SAMPLE_SHUFFLE_BUFFER = 1000
#: samples buffered before the first one is yielded (webdataset's default): a stream starts without a full buffer
SAMPLE_SHUFFLE_INITIAL = 100

__all__ = ["ShardDataset", "ShardError", "open_shards", "shard_slots", "IMAGE_EXTENSIONS"]

_logger = logging.getLogger(__name__)

#: member extensions that hold a sample's image
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "gif")
_TASKS = ("classification", "segmentation")


class ShardError(ValueError):
    """A fault of the shards, in one line. A DataLoader worker's exception comes back to the main process as
    ``type(e)("Caught ... Original Traceback ...")``; this class keeps the original message's line from it."""

    def __init__(self, message: Any = "") -> None:
        if isinstance(message, str) and message.startswith("Caught ShardError"):
            last = message.rstrip().splitlines()[-1]
            message = last.partition("ShardError: ")[2] or last
        super().__init__(message)


# ------------------------------------------------------------------------------------------------ locating shards
def _is_pipe(url: str) -> bool:
    return url.startswith("pipe:")


def _pipe_target(url: str) -> Tuple[List[str], int]:
    """The tokens of a ``pipe:`` command and the index of the one naming the shard (the last ending in .tar)."""
    tokens = shlex.split(url[len("pipe:"):])
    for i in range(len(tokens) - 1, -1, -1):
        if tokens[i].endswith(".tar"):
            return tokens, i
    raise ValueError(f"--data-dir {quoted(url)}: a pipe: URL must name its shard (a word ending in .tar), e.g. "
                     "'pipe:cat /data/train-{000000..000009}.tar'")


def is_local(url: str) -> bool:
    """Whether a shard URL names a file on this machine (not a ``pipe:`` command or a remote URL)."""
    return not _is_pipe(url) and "://" not in url


def shard_name(url: str) -> str:
    """The shard's file name in a path or ``pipe:`` URL."""
    if _is_pipe(url):
        tokens, i = _pipe_target(url)
        return tokens[i].rsplit("/", 1)[-1]
    return url.rsplit("/", 1)[-1]


def _with_name(url: str, name: str) -> str:
    """``url`` with its shard's file name replaced by ``name`` (same folder, same command)."""
    if _is_pipe(url):
        tokens, i = _pipe_target(url)
        head = tokens[i].rsplit("/", 1)
        tokens[i] = (head[0] + "/" + name) if len(head) == 2 else name
        return "pipe:" + shlex.join(tokens)
    head = url.rsplit("/", 1)
    return (head[0] + "/" + name) if len(head) == 2 else name


def _read_info(location: str) -> Dict[str, Any]:
    if _is_pipe(location):
        from webdataset import gopen
        try:
            with gopen(location) as f:
                text = f.read()
        except Exception as e:
            raise FileNotFoundError(f"cannot read the _info.json next to the shards ({quoted(location)}): "
                                    f"{first_line(e, with_type=True)}") from None
        if not text:
            raise FileNotFoundError(f"no _info.json next to the shards ({quoted(location)} printed nothing)")
    else:
        if not os.path.isfile(location):
            raise FileNotFoundError(f"no _info.json next to the shards: {location} not found (simattn data pack "
                                    "writes it with the shards)")
        with open(location, "rb") as f:
            text = f.read()
    try:
        info = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{location}: not valid JSON ({first_line(e, with_type=True)})") from None
    if not isinstance(info, dict) or not isinstance(info.get("splits"), dict):
        raise ValueError(f"{location}: expected an object with 'splits' (the _info.json simattn data pack writes)")
    return info


def _split_entry(info: Dict[str, Any], split: str, where: str) -> Tuple[List[str], List[int]]:
    entry = info["splits"].get(split)
    if not isinstance(entry, dict):
        raise ValueError(f"{where} has no split {split!r}; it has {', '.join(map(repr, info['splits'])) or 'none'}")
    names, lengths = entry.get("filenames"), entry.get("shard_lengths")
    if (not isinstance(names, list) or not isinstance(lengths, list) or len(names) != len(lengths) or not names
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths)):
        raise ValueError(f"{where}: split {split!r} needs 'filenames' and as many non-negative 'shard_lengths'")
    if entry.get("num_samples") is not None and entry["num_samples"] != sum(lengths):
        raise ValueError(f"{where}: split {split!r} records num_samples={entry['num_samples']} but its "
                         f"shard_lengths sum to {sum(lengths)}")
    return [str(n) for n in names], [int(n) for n in lengths]


def _check_local_shard(path: str) -> None:
    """A local shard exists and ends as a whole tar does (512-byte blocks, the zero end-of-archive blocks)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        raise FileNotFoundError(f"shard {path} not found") from None
    ok = size >= 1024 and size % 512 == 0
    if ok:
        with open(path, "rb") as f:
            f.seek(size - 1024)
            ok = not any(f.read(1024))
    if not ok:
        raise ShardError(f"shard {path} is truncated ({size} bytes, no end-of-archive blocks): pack it again")


def resolve_shards(root: Any, split: str) -> Tuple[Dict[str, Any], List[str], List[int], str]:
    """(info, shard URLs, their recorded sample counts, where the info came from) of ``split`` of ``root``."""
    text = "" if root is None else str(root).strip()
    if not text:
        raise ValueError("dataset 'wds' needs --data-dir: a folder with _info.json and its shards, or a shard "
                         "pattern such as 'DIR/train-{000000..000009}.tar' or 'pipe:cat DIR/train-{000000..000009}.tar'")
    if not _is_pipe(text) and "{" not in text and os.path.isdir(text):
        where = os.path.join(text, "_info.json")
        info = _read_info(where)
        names, lengths = _split_entry(info, split, where)
        urls = [os.path.join(text, n) for n in names]
    else:
        from webdataset.shardlists import expand_urls
        try:
            urls = [u for u in expand_urls(text) if u.strip()]
        except Exception as e:  # unbalanced braces
            raise ValueError(f"--data-dir {quoted(text)}: not a shard pattern "
                             f"({first_line(e, with_type=True)})") from None
        if not urls:
            raise ValueError(f"--data-dir {quoted(text)}: the pattern names no shard")
        if not _is_pipe(text) and not urls[0].endswith(".tar"):
            raise FileNotFoundError(f"--data-dir {quoted(text)}: no such folder, and not a shard pattern (.tar "
                                    "files, e.g. 'DIR/train-{000000..000009}.tar')")
        where = _with_name(urls[0], "_info.json")
        info = _read_info(where)
        recorded = {name: (s, n) for s, entry in info["splits"].items() if isinstance(entry, dict)
                    for name, n in zip(entry.get("filenames") or [], entry.get("shard_lengths") or [])}
        named = [shard_name(u) for u in urls]
        missing = [n for n in named if n not in recorded]
        if missing:
            raise ValueError(f"--data-dir {quoted(text)}: shard {missing[0]} is not listed in {where} "
                             f"({len(missing)} of {len(named)} are not): the pattern does not match the packed shards")
        splits = sorted({recorded[n][0] for n in named})
        if len(splits) > 1:
            raise ValueError(f"--data-dir {quoted(text)}: the pattern names shards of several splits "
                             f"({', '.join(splits)}); name one split's shards")
        if splits[0] == split:
            _split_entry(info, split, where)
            lengths = [int(recorded[n][1]) for n in named]
        else:  # another split of the same dataset, read the same way
            names, lengths = _split_entry(info, split, where)
            urls = [_with_name(urls[0], n) for n in names]
    for url in urls:
        if is_local(url):
            _check_local_shard(url)
    return info, urls, lengths, where


# ------------------------------------------------------------------------------------------------ distribution
def shard_slots(num_shards: int, world_size: int, workers: int, seed: int, epoch: int,
                shuffle: bool) -> List[List[List[int]]]:
    """``slots[rank][worker]``: the shard indices each (rank, worker) reads in ``epoch``, in order. The order is a
    permutation drawn from (seed, epoch) when ``shuffle``, else the packed order."""
    order = list(range(num_shards))
    if shuffle:
        order = np.random.default_rng(np.random.SeedSequence([seed, epoch])).permutation(num_shards).tolist()
    workers = max(1, workers)
    slots: List[List[List[int]]] = [[[] for _ in range(workers)] for _ in range(world_size)]
    for i, shard in enumerate(order):
        slots[i % world_size][(i // world_size) % workers].append(shard)
    return slots


def slot_sizes(num_shards: int, world_size: int, workers: int) -> List[List[int]]:
    """How many shards each (rank, worker) reads per epoch (the same every epoch)."""
    return [[len(s) for s in rank] for rank in shard_slots(num_shards, world_size, workers, 0, 0, False)]


# ------------------------------------------------------------------------------------------------ the dataset
class ShardDataset(IterableDataset):
    """The samples of one split's shards, through ``transform`` (classification: ``transform(PIL image)``, label;
    segmentation: ``transform(uint8 image, int64 mask)`` as :class:`~simattn.data.segmentation.SegmentationDataset`).

    Attributes: ``classes``, ``urls``, ``lengths`` (recorded samples per shard); segmentation also ``palette``,
    ``label_ids``, ``ignore_index``, ``stems`` (the sample keys).
    """

    def __init__(self, root: Any, split: str = "train", transform: Optional[Callable] = None,
                 task: str = "classification") -> None:
        info, self.urls, self.lengths, where = resolve_shards(root, split)
        self.source, self.split, self.task = str(root), split, task
        stored = info.get("task", "classification")
        if stored != task:
            raise ValueError(f"{where}: these shards hold {stored} samples, not {task} ones")
        classes = info.get("classes")
        if not isinstance(classes, list) or not classes:
            raise ValueError(f"{where}: 'classes' must list the class names")
        if info.get("num_classes") is not None and info["num_classes"] != len(classes):
            raise ValueError(f"{where}: num_classes={info['num_classes']} but 'classes' lists {len(classes)}")
        self.classes: List[str] = [str(c) for c in classes]
        self.name = str(info.get("name", "wds"))
        self.transform = transform
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64).tolist()
        if task == "segmentation":
            from .segmentation import color_palette
            self.ignore_index = int(info.get("ignore_index", 255))
            self.void_label = self.ignore_index
            self.palette = [tuple(int(v) for v in c) for c in (info.get("palette") or color_palette(len(classes)))]
            self.label_ids = [int(v) for v in (info.get("label_ids") or range(len(classes)))]
            self.stems = ["%08d" % i for i in range(len(self))]
        # the stream: set by configure() before the loader starts; the epoch lives in shared memory so that
        # persistent DataLoader workers see set_epoch() of the main process
        self.rank, self.world_size, self.seed, self.shuffle, self.seeded = 0, 1, 0, False, False
        self.with_index = False
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return int(sum(self.lengths))

    def configure(self, rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = False,
                  seeded: bool = False) -> "ShardDataset":
        """Read the shards of ``rank`` out of ``world_size``, in a per-epoch order drawn from (seed, epoch) when
        ``shuffle``; ``seeded``: every sample's random transform runs under a seed of (seed, epoch, its index)."""
        self.rank, self.world_size, self.seed, self.shuffle, self.seeded = rank, world_size, seed, shuffle, seeded
        return self

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def my_shards(self, worker: int = 0, workers: int = 1) -> List[int]:
        return shard_slots(len(self.urls), self.world_size, workers, self.seed, self.epoch,
                           self.shuffle)[self.rank][worker]

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        samples = (s for shard in self.my_shards(worker, workers) for s in self._raw_shard(shard))
        if self.shuffle:
            # Shuffling shards alone would replay each shard's packed order every epoch (and a split packed into
            # one shard would never be shuffled): a buffer of undecoded samples mixes them, drawn from the same
            # (seed, epoch) plus this stream's rank and worker, so a resumed run sees the same order.
            from webdataset.filters import shuffle
            rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
            samples = shuffle(SAMPLE_SHUFFLE_BUFFER, initial=SAMPLE_SHUFFLE_INITIAL,
                              rng=random.Random(int(rng.integers(2 ** 63))))(samples)
        yield from self._read(samples)

    def encode_prediction(self, pred: np.ndarray) -> np.ndarray:
        from .segmentation import SegmentationDataset
        return SegmentationDataset.encode_prediction(self, pred)

    # ----- one shard
    def _raw_shard(self, shard: int) -> Iterator[Tuple[int, str, Dict[str, Any]]]:
        """(index in the split, shard name, webdataset sample) of shard ``shard``, its count checked."""
        from webdataset.tariterators import tarfile_samples
        url, expected = self.urls[shard], self.lengths[shard]
        name = shard_name(url)
        count = 0
        samples = tarfile_samples([{"url": url}])
        while True:
            try:
                sample = next(samples)
            except StopIteration:
                break
            except Exception as e:  # tarfile.ReadError (truncated), a failing pipe command, a duplicate member
                raise ShardError(f"shard {name} cannot be read ({first_line(e, with_type=True)}): it is truncated "
                                 "or no tar file; pack it again") from None
            if count >= expected:
                raise ShardError(f"shard {name} holds more samples than the {expected} _info.json records for it: "
                                 "the info does not match the shards")
            yield self.offsets[shard] + count, name, sample
            count += 1
        if count != expected:
            raise ShardError(f"shard {name} holds {count} samples but _info.json records {expected}: the info does "
                             "not match the shards")

    def raw_samples(self) -> Iterator[Tuple[int, str, Dict[str, Any]]]:
        """Every sample undecoded (its members' bytes), in the packed order: (index, shard name, sample)."""
        for shard in range(len(self.urls)):
            yield from self._raw_shard(shard)

    def _read(self, samples: Iterator[Tuple[int, str, Dict[str, Any]]]) -> Iterator[Any]:
        for index, name, sample in samples:
            item = self.decode(sample, name)
            if item is None:
                yield None
                continue
            if self.seeded:
                from .seeding import sample_seed, seeded_rngs
                with seeded_rngs(sample_seed(self.seed, self.epoch, 0, index)):
                    item = self._transform(item)
            else:
                item = self._transform(item)
            yield (*item, index) if self.with_index else item

    def _transform(self, item: Tuple[Any, Any]) -> Tuple[Any, Any]:
        image, target = item
        if self.task == "segmentation":
            if self.transform is None:
                from .seg_transforms import SegEvalTransform
                self.transform = SegEvalTransform(scale=None)
            return tuple(self.transform(image, target))
        return (self.transform(image) if self.transform is not None else image), target

    @staticmethod
    def image_member(sample: Dict[str, Any]) -> Optional[str]:
        """The extension of the sample's image member (None: it has none)."""
        return next((e for e in IMAGE_EXTENSIONS if e in sample), None)

    def decode(self, sample: Dict[str, Any], name: str) -> Optional[Tuple[Any, Any]]:
        """(RGB PIL image, label) or (uint8 image array, int64 mask) of a raw sample of shard ``name``, checked;
        None when the image does not decode (logged)."""
        from .images import read_image
        key = sample.get("__key__")
        ext = self.image_member(sample)
        if ext is None:
            raise ShardError(f"shard {name}: sample {key} has no image (members: "
                             f"{', '.join(k for k in sample if not k.startswith('__'))}; expected one of "
                             f"{', '.join('.' + e for e in IMAGE_EXTENSIONS)})")
        target_key = "mask.png" if self.task == "segmentation" else "cls"
        if target_key not in sample:
            what = "mask" if self.task == "segmentation" else "label"
            raise ShardError(f"shard {name}: sample {key} has an image and no {what} (expected {key}.{target_key})")
        try:
            image = read_image(io.BytesIO(sample[ext]))
        except Exception as e:  # like an image folder: an unreadable image is skipped with a warning
            _logger.warning("skipping unreadable image %s in shard %s: %s", key, name, first_line(e, with_type=True))
            return None
        if self.task == "segmentation":
            return np.array(image), self._mask(sample[target_key], image.size, key, name)
        try:
            label = int(sample[target_key].decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            raise ShardError(f"shard {name}: sample {key} has label {quoted(sample[target_key][:40])}; expected an "
                             "integer") from None
        if not 0 <= label < len(self.classes):
            raise ShardError(f"shard {name}: sample {key} has label {label}, outside the {len(self.classes)} "
                             f"classes of _info.json (0..{len(self.classes) - 1})")
        return image, label

    def _mask(self, data: bytes, size: Tuple[int, int], key: str, name: str) -> np.ndarray:
        from PIL import Image

        from .segmentation import check_train_ids, read_index_mask
        try:
            raw = read_index_mask(lambda: Image.open(io.BytesIO(data)), f"{key}.mask.png", (size[1], size[0]))
            check_train_ids(raw, len(self.classes), f"sample {key}", self.ignore_index)
        except ValueError as e:
            raise ShardError(f"shard {name}: {e}") from None
        return raw.astype(np.int64)

    def __repr__(self) -> str:
        return f"ShardDataset({self.source!r}, {self.split!r}, {len(self.urls)} shards, {len(self)} samples)"


def open_shards(root: Any, split: str = "train", transform: Optional[Callable] = None,
                task: str = "classification") -> ShardDataset:
    """The ``split`` of the shards at ``root`` (a folder with ``_info.json``, a brace pattern or a ``pipe:`` URL)."""
    return ShardDataset(root, split, transform, task)


def _segmentation_shards(root: Any, split: str, classes_file: Any, transform: Optional[Callable]) -> ShardDataset:
    return open_shards(root, split, transform, task="segmentation")  # classes come from _info.json


STORED_READERS["wds"] = _segmentation_shards
