"""ImageNet-style image folders (``root/<split>/<class>/<image>``) that skip unreadable images instead of crashing.

A large folder almost always holds a few broken files (truncated downloads, HTML saved as .jpg). Decoding happens
lazily in loader workers, so an unreadable image is replaced by ``None`` with a warning, and
:func:`collate_skipping_unreadable` drops it from the batch and reports how many it dropped; the training and
validation loops add those counts up for their summaries.

What counts as data: hidden folders and files (``.ipynb_checkpoints``, ``.DS_Store``) are neither classes nor
images; files with an image extension are samples, but only regular ones are read: a FIFO, a device or a link to
one named ``x.png`` (reading would block or never end) or a dangling link is an unreadable sample, ``None`` with a
warning, so that the skipped counts include it. Links to folders are followed only when they lead out of
everything already walked: a link to a folder inside the dataset (another class, the split folder), to a folder
above it, or to a folder the walk has already listed (by its real path) is skipped with a warning, so a link loop
neither repeats images nor gives one class another's images. Images are decoded by
:func:`simattn.data.images.read_image`, which keeps the range of 16-bit images.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import default_collate
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

__all__ = ["SkippingImageFolder", "image_folder", "collate_skipping_unreadable", "list_class_folders", "list_images"]

_logger = logging.getLogger(__name__)


def _hidden(name: str) -> bool:
    return name.startswith(".")


def list_class_folders(directory: str | os.PathLike) -> List[str]:
    """The class folder names of ``directory``, sorted: its sub-folders (links to folders included), hidden ones left
    out."""
    return sorted(e.name for e in os.scandir(directory) if e.is_dir() and not _hidden(e.name))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class _Walked:
    """The folders one dataset walk has listed (real paths), and the dataset's own folder: a link to a folder is
    followed only when it leads out of both."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.path.realpath(root)
        self.folders: set = set()

    def refuse(self, link: str) -> Optional[str]:
        """Why the folder link ``link`` is not followed, or None."""
        target = os.path.realpath(link)
        if _inside(target, self.root):
            return "a link to a folder inside the dataset (its images are listed where they are)"
        if _inside(self.root, target):
            return "a link to a folder above the dataset (a loop)"
        if any(_inside(target, f) or _inside(f, target) for f in self.folders):
            return "a link to a folder already listed (or one above it)"
        return None


def list_images(directory: str | os.PathLike, extensions: Tuple[str, ...] = IMG_EXTENSIONS,
                walked: Optional[_Walked] = None, unreadable: Optional[List[str]] = None) -> List[str]:
    """Every image file under ``directory`` (recursively, sorted): regular files with one of ``extensions``, hidden
    files and folders left out. Links to folders are followed only out of the folders already walked (``walked``:
    shared by the classes of one dataset; by default ``directory`` alone) and the dataset's own folder. Entries
    with an image extension that are not regular files (a FIFO, a device, a link to one, a dangling link) are left
    out with a warning, and appended to ``unreadable`` when given."""
    found: List[str] = []
    walked = walked if walked is not None else _Walked(directory)

    def walk(folder: str, ancestors: frozenset) -> None:
        walked.folders.add(os.path.realpath(folder))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            _logger.warning("skipping unreadable folder %s: %s", folder, e.strerror or e)
            return
        for entry in entries:
            if _hidden(entry.name):
                continue
            try:
                info = os.stat(entry.path)  # follows links; a dangling link raises
            except OSError as e:
                _logger.warning("skipping %s: %s", entry.path, e.strerror or e)
                if unreadable is not None and entry.name.lower().endswith(extensions):
                    unreadable.append(entry.path)
                continue
            if stat.S_ISDIR(info.st_mode):
                key = (info.st_dev, info.st_ino)
                if key in ancestors:
                    _logger.warning("skipping %s: a link back to a folder above it (a loop)", entry.path)
                    continue
                why = walked.refuse(entry.path) if entry.is_symlink() else None
                if why:
                    _logger.warning("skipping %s: %s", entry.path, why)
                    continue
                walk(entry.path, ancestors | {key})
            elif entry.name.lower().endswith(extensions):
                if stat.S_ISREG(info.st_mode):
                    found.append(entry.path)
                else:
                    _logger.warning("skipping %s: not a regular file", entry.path)
                    if unreadable is not None:
                        unreadable.append(entry.path)

    top = os.stat(directory)
    walk(os.fspath(directory), frozenset({(top.st_dev, top.st_ino)}))
    return found


class SkippingImageFolder(ImageFolder):
    """``torchvision.datasets.ImageFolder`` whose items are ``None`` (with a warning) for files PIL cannot decode;
    class folders and samples are found by :func:`list_class_folders` and :func:`list_images`."""

    def __init__(self, root: str, transform: Optional[Callable] = None) -> None:
        from .images import read_image
        super().__init__(root, transform=transform, loader=read_image)

    def find_classes(self, directory: str | os.PathLike) -> Tuple[List[str], Dict[str, int]]:
        classes = list_class_folders(directory)
        if not classes:
            raise FileNotFoundError(f"image folder {directory} is empty: expected one sub-folder per class")
        return classes, {name: i for i, name in enumerate(classes)}

    @staticmethod
    def make_dataset(directory, class_to_idx, extensions=None, is_valid_file=None,
                     allow_empty: bool = False) -> List[Tuple[str, int]]:
        extensions = tuple(e.lower() for e in (extensions or IMG_EXTENSIONS))
        samples: List[Tuple[str, int]] = []
        empty = []
        walked = _Walked(directory)  # one walk over every class: no folder is listed twice, under two classes
        for name, index in sorted(class_to_idx.items(), key=lambda item: item[1]):
            folder = os.path.join(directory, name)
            why = walked.refuse(folder) if os.path.islink(folder) else None
            unreadable: List[str] = []
            if why:  # a class folder that is a link to another class's images, or to a folder above the dataset
                _logger.warning("class %s: skipping %s: %s", name, folder, why)
                paths = []
            else:
                paths = list_images(folder, extensions, walked, unreadable)
            if not paths:
                empty.append(name)
            else:  # the unreadable entries are samples that read as None, so that the skipped counts include them
                paths = sorted(paths + unreadable)
            samples.extend((path, index) for path in paths)
        if empty and not allow_empty:
            raise FileNotFoundError(f"Found no valid file for the classes {', '.join(empty)}")
        return samples

    def __getitem__(self, index: int) -> Optional[Tuple[Any, int]]:
        path, target = self.samples[index]
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # opening a FIFO or device would block or never end
                raise OSError("not a regular file")
            sample = self.loader(path)
        except Exception as e:  # PIL raises UnidentifiedImageError, OSError (truncated), ValueError, SyntaxError
            _logger.warning("skipping unreadable image %s: %s: %s", path, type(e).__name__, e)
            return None
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target


def image_folder(root: str | os.PathLike, split: Optional[str] = None,
                 transform: Optional[Callable] = None) -> SkippingImageFolder:
    """Open ``root/split`` (``root`` itself when ``split`` is None) with one-line errors for a missing folder, a folder
    without class sub-folders, or class folders without images."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    folder = root / split if split else root
    if split and not folder.is_dir():
        raise FileNotFoundError(f"image folder {root} has no '{split}' split folder (expected {folder}/<class>/<image>)")
    if not list_class_folders(folder):
        raise FileNotFoundError(f"image folder {folder} is empty: expected one sub-folder per class")
    try:
        return SkippingImageFolder(str(folder), transform=transform)
    except FileNotFoundError as e:  # class folders without any file that has an image extension
        raise FileNotFoundError(
            f"image folder {folder} holds no images with a known extension ({', '.join(IMG_EXTENSIONS)}): "
            f"{str(e).splitlines()[0]}") from None


def collate_skipping_unreadable(batch: Sequence[Optional[Tuple[Any, Any]]]) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """``default_collate`` over the readable samples: ``(images, targets, skipped)`` where ``skipped`` counts the
    ``None`` items (unreadable images) that were dropped."""
    kept: List[Tuple[Any, Any]] = [item for item in batch if item is not None]
    skipped = len(batch) - len(kept)
    if not kept:  # every image of the batch was unreadable: evaluation skips it, training stops with an error
        return torch.empty(0), torch.empty(0, dtype=torch.long), skipped
    images, targets = default_collate(kept)
    return images, targets, skipped
