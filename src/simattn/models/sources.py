"""One resolution of a weights name, for every command that takes weights.

A name is a weights file (``.safetensors``, a training or released ``.pth``), a folder timm reads (``DIR``,
``local-dir:DIR``), ``hf-hub:ORG/NAME[@REV]`` (:mod:`simattn.models.hub`), or a pretrained tag ``model.tag`` that
timm lists (``timm.list_pretrained()``: the peers' released checkpoints registered here, and timm's own).
:func:`resolve_source` turns it into one :class:`WeightsSource` once; the commands pass that on, and the loaders
(:func:`~simattn.models.factory.load_model`, :func:`~simattn.models.factory.load_initial_weights`,
:func:`read_weights_record`) take it as it is. Its file is read once: the record (safetensors
metadata, a training state's entries, or the tag's configuration) and the tensors come from the same read.

A tag's file is downloaded into timm's cache (``torch.hub``'s ``checkpoints`` folder, or the Hugging Face cache by
``huggingface_hub``), where ``timm.create_model(tag, pretrained=True)`` finds it too. A download lands there only
whole: its size is checked against the Content-Length, a web page in its place is refused, it must read as weights,
and it is renamed into place last; an error, Ctrl-C or SIGTERM leaves nothing behind. A cached file that does not
read is named as damaged, with the command that fetches it again. Without a network, a tag whose file is not cached
is one line naming the address and where the file goes.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union
from urllib.parse import urlparse

from ..utils.io import CheckpointError, is_safetensors, load_checkpoint, open_safetensors, unreadable_checkpoint
from .hub import resolve_weights, weights_file
from .released import RELEASED_GLOBALS
from .weights import WeightsRecord, parse_weights_metadata, train_state_record

__all__ = ["WeightsSource", "resolve_source", "read_weights_record", "pretrained_tag", "tag_cache_path",
           "overlay_with_tag_file", "register_exported_records"]

_UNREAD = object()

#: the readers of exported files' records, which each deploy format registers (deploy sits above models):
#: (whether a path is such a file, its record)
_EXPORTED_RECORDS: List[Tuple[Callable[[Path], bool], Callable[[Path], WeightsRecord]]] = []


def register_exported_records(claims: Callable[[Path], bool], read: Callable[[Path], WeightsRecord]) -> None:
    """Make :attr:`WeightsSource.record` read a file that ``claims`` takes (an exported file) with ``read``."""
    _EXPORTED_RECORDS.append((claims, read))


@dataclass(eq=False)
class WeightsSource:
    """Resolved weights: ``name`` as given, ``path`` the local file, ``tag`` the pretrained tag it came from.
    The file is opened once, whatever is asked of it (the record, then the tensors)."""
    name: str
    path: Path
    tag: Optional[str] = None
    _checkpoint: Optional[Dict[str, Any]] = field(default=None, repr=False)
    _record: Any = field(default=_UNREAD, repr=False)
    _kind: Optional[str] = field(default=None, repr=False)
    _safetensors: Any = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        """'tag' (a pretrained tag's file), 'exported' (a file a deploy format reads), 'safetensors' or
        'checkpoint' (a torch file: a training state, a released file, a bare state dict)."""
        if self._kind is None:
            self._kind = ("tag" if self.tag is not None else
                          "exported" if self._exported_reader() is not None else
                          "safetensors" if is_safetensors(self.path) else "checkpoint")
        return self._kind

    @property
    def deployed(self) -> bool:
        return self.kind == "exported"

    def _exported_reader(self) -> Optional[Callable[[Path], WeightsRecord]]:
        return next((read for claims, read in _EXPORTED_RECORDS if claims(self.path)), None)

    def _opened_safetensors(self) -> Any:
        if self._safetensors is None:
            self._safetensors = open_safetensors(self.path)
        return self._safetensors

    def checkpoint(self) -> Dict[str, Any]:
        """The file's contents (``weights_only=True``), read on first use and kept (a ``.pth`` mapped: the record
        is read without the tensors, which are read when used)."""
        if self._checkpoint is None:
            if self.kind == "safetensors":
                handle = self._opened_safetensors()
                try:
                    self._checkpoint = {k: handle.get_tensor(k) for k in handle.keys()}
                except Exception:  # a file cut short after its header
                    raise unreadable_checkpoint(self.path) from None
                return self._checkpoint
            try:
                self._checkpoint = load_checkpoint(self.path, mmap=True, safe_globals=RELEASED_GLOBALS)
            except CheckpointError as e:
                if self.tag is None:
                    raise
                size = self.path.stat().st_size
                raise CheckpointError(f"weights {self.tag}: its cached file {self.path} ({size:,} bytes) is damaged "
                                      f"({str(e).partition(': ')[2].split(';')[0]}): remove it (rm '{self.path}') "
                                      "and run again to download it again") from None
        return self._checkpoint

    @property
    def record(self) -> Optional[WeightsRecord]:
        """What built the weights: the file's record, the tag's configuration, an exported file's record, or None
        when none names a model (a bare state dict)."""
        if self._record is _UNREAD:
            self._record = self._read_record()
        return self._record

    def _read_record(self) -> Optional[WeightsRecord]:
        kind = self.kind
        if kind == "tag":
            return _tag_record(self.tag)
        if kind == "exported":
            return self._exported_reader()(self.path)
        if kind == "safetensors":
            return parse_weights_metadata(dict(self._opened_safetensors().metadata() or {}), self.path)
        return train_state_record(self.checkpoint())

    def __str__(self) -> str:
        return self.name

    def __fspath__(self) -> str:  # path-taking code (``Path(source)``, ``open``) gets the resolved file
        return str(self.path)


def resolve_source(weights: Union[str, Path, WeightsSource], what: str = "weights file",
                   packages: bool = False) -> WeightsSource:
    """``weights`` as one :class:`WeightsSource` (itself when it is one). A path that exists, a folder name or a
    ``hf-hub:`` name is resolved as :func:`~simattn.models.hub.weights_file` does; otherwise a pretrained tag is
    looked up, downloaded once (or found in the cache). One-line errors (``what`` names the weights) for a name that
    is none of these, suggesting the tags of a model named without one. ``packages``: a folder that holds no
    weights (an exported package) is taken as it is, for its reader."""
    if isinstance(weights, WeightsSource):
        return weights
    name = str(weights)
    tag = pretrained_tag(name)
    if tag is not None and Path(name).exists():
        raise ValueError(f"weights {name}: both a pretrained tag and the file or folder {Path(name).resolve()} "
                         f"have this name: pass ./{name} for the file, or run from another folder for the tag")
    if tag is not None:
        return WeightsSource(name, _tag_file(tag), tag=tag)
    try:
        if packages and Path(name).is_dir():
            return WeightsSource(name, resolve_weights(weights))
        return WeightsSource(name, weights_file(weights, what))
    except FileNotFoundError:
        hint = _not_a_tag(name)
        if hint:
            raise FileNotFoundError(f"weights {name}: {hint}") from None
        raise


def _not_a_tag(name: str) -> Optional[str]:
    """What a name that is neither a file nor a downloadable tag is closest to: the tags of its model, a tag with
    no published weights, or the nearest tags and models (None for a name that looks like a path)."""
    import difflib

    import timm
    if "/" in name or os.sep in name or name.startswith(("hf-hub:", "local-dir:")) or not name or Path(name).exists():
        return None  # a path: its own message (a folder without weights) is the true one
    arch = name.partition(".")[0]
    if timm.is_model(arch):
        if "." in name and _pretrained_cfg(name) is not None:
            return ("no weights were published for this tag (it names the preprocessing its recipes use): "
                    "`simattn list pretrained` lists the tags with weights")
        tags = _tags_of(name)
        if tags:
            return f"no such file, and {arch} has pretrained tag(s) {', '.join(tags)}: pass one of them"
        return f"no such file, and {arch} has no pretrained tag with weights: pass a weights file"
    if "." not in name:
        return None
    from . import list_models
    ours = set(list_models())
    known = [t for t in timm.list_pretrained() if t.partition(".")[0] in ours]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.8)
    if close:
        return f"no such file, and no model {arch}; did you mean {' or '.join(close)}?"
    return f"no such file, and no model {arch} (`simattn list pretrained` lists the tags)"


def read_weights_record(weights: Union[str, Path, WeightsSource]) -> Optional[WeightsRecord]:
    """The record of weights (:attr:`WeightsSource.record`): safetensors metadata, the entries of a ``simattn
    train`` state (``last.pth``), or a pretrained tag's configuration; None when they name no model."""
    return resolve_source(weights).record


def pretrained_tag(name: str) -> Optional[str]:
    """``name`` when it is a ``model.tag`` timm lists with a download (url, Hugging Face repository or file)."""
    arch, dot, tag = name.partition(".")
    if not dot or not tag or "/" in name or os.sep in name:
        return None
    cfg = _pretrained_cfg(name)
    return name if cfg is not None and (cfg.get("url") or cfg.get("hf_hub_id") or cfg.get("file")) else None


def overlay_with_tag_file(tag: str, overlay: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """timm's ``pretrained_cfg_overlay`` for ``tag`` with ``file`` set to the tag's file as :func:`resolve_source`
    finds or downloads it (whole or not at all), so that timm's loader never downloads; an overlay that names a file
    or a state dict already is kept as it is."""
    overlay = dict(overlay or {})
    if not overlay.get("file") and not overlay.get("state_dict"):
        overlay["file"] = str(resolve_source(tag).path)
    return overlay


def _pretrained_cfg(name: str) -> Optional[Dict[str, Any]]:
    import timm
    from timm.models import get_pretrained_cfg

    from . import list_models  # noqa: F401  (registers simattn's families and their tags with timm)
    if not timm.is_model(name):
        return None
    try:
        cfg = get_pretrained_cfg(name, allow_unregistered=False)
    except RuntimeError:  # a tag the model does not have
        return None
    return cfg.to_dict() if cfg is not None else None


def _tags_of(name: str) -> List[str]:
    import timm
    arch = name.partition(".")[0]
    if "/" in name or os.sep in name or not arch or not timm.is_model(arch):
        return []
    return [t for t in timm.list_pretrained(f"{arch}.*") if pretrained_tag(t)]


def tag_cache_path(tag: str) -> Optional[Path]:
    """Where timm keeps a url tag's file (None for a tag on the Hugging Face Hub or a local file)."""
    return _cache_path(_pretrained_cfg(tag) or {})


def _cache_path(cfg: Dict[str, Any]) -> Optional[Path]:
    if cfg.get("file") or cfg.get("hf_hub_id") or not cfg.get("url"):
        return None
    from timm.models._hub import get_cache_dir
    return Path(get_cache_dir()) / os.path.basename(urlparse(cfg["url"]).path)


def _tag_file(tag: str) -> Path:
    cfg = _pretrained_cfg(tag) or {}
    if cfg.get("file"):
        return weights_file(cfg["file"], f"weights {tag}: its file")
    if cfg.get("hf_hub_id"):
        from .hub import download_file
        return download_file(cfg["hf_hub_id"], cfg.get("hf_hub_filename") or "model.safetensors", name=tag)
    url, cached = cfg["url"], _cache_path(cfg)
    if cached.is_file():
        return cached
    if cached.exists() or cached.is_symlink():
        raise ValueError(f"weights {tag}: {cached}, where its downloaded file goes, is a folder or a broken link: "
                         "move it away and run again")
    host = urlparse(url).hostname or url
    # looked up first: without a network urllib would fail late, or wait on a connection
    if not _resolves(host):
        raise ValueError(f"weights {tag}: its file is not cached and {host} cannot be reached (no network): download "
                         f"{url} where there is one and copy it to {cached} (or pass that file, naming the model "
                         f"{tag})")
    _download(tag, url, cached)
    return cached


#: bytes read per step of a download
_CHUNK = 1 << 20


def _download(tag: str, url: str, dest: Path) -> None:
    """``url`` into ``dest``, whole or not at all: the bytes are counted against the Content-Length, a web page is
    refused, the file must read as weights, and only then is it renamed into place (a temporary file beside it is
    removed on any error, Ctrl-C or SIGTERM). timm's own loader finds the file there."""
    import urllib.error
    import urllib.request

    from tqdm import tqdm

    from ..utils.io import atomic_path

    host = urlparse(url).hostname or url
    request = urllib.request.Request(url, headers={"User-Agent": "simattn"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response, atomic_path(dest) as tmp:
            length = response.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            kind = response.headers.get("Content-Type") or ""
            got = 0
            with open(tmp, "wb") as out, tqdm(total=expected, unit="B", unit_scale=True, desc=f"downloading {tag}",
                                              disable=not sys.stderr.isatty(), leave=False) as bar:
                while True:
                    chunk = response.read(_CHUNK)
                    if not chunk:
                        break
                    if got == 0 and _is_web_page(kind, chunk):
                        raise ValueError(f"weights {tag}: the server at {host} sent a web page, not weights "
                                         f"({kind.split(';')[0] or 'HTML'}; it may want a log-in): open {url} in a "
                                         "browser, download the file and pass it instead of the tag")
                    out.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
            if expected is not None and got != expected:
                raise ValueError(f"weights {tag}: the download from {host} stopped after {got:,} of {expected:,} "
                                 "bytes (nothing was kept): run again to download it again")
            try:
                load_checkpoint(tmp, mmap=True, safe_globals=RELEASED_GLOBALS)
            except CheckpointError:
                raise ValueError(f"weights {tag}: {url} sent {got:,} bytes that are not a weights file (nothing was "
                                 "kept): run again, or download it elsewhere and pass that file instead") from None
    except urllib.error.HTTPError as e:
        raise ValueError(f"weights {tag}: the server at {host} answered HTTP {e.code} {e.reason} for {url}: try "
                         "again later, or download it elsewhere and pass that file instead of the tag") from None
    except OSError as e:  # urllib's connection errors
        raise ValueError(f"weights {tag}: downloading {url} failed ({type(e).__name__}: {str(e)[:160]}; nothing "
                         "was kept): try again, or download it elsewhere and pass that file instead of the "
                         "tag") from None


def _is_web_page(content_type: str, first: bytes) -> bool:
    head = first[:256].lstrip().lower()
    return "text/html" in content_type.lower() or head.startswith((b"<!doctype html", b"<html"))


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
    except (OSError, UnicodeError):
        return False
    return True


def _tag_record(tag: str) -> WeightsRecord:
    """A tag's record: the tag builds its network (timm applies the tag's configuration), its preprocessing is the
    tag's ``pretrained_cfg`` (read from the model built), and it was trained on ImageNet when it has 1000 classes."""
    cfg = _pretrained_cfg(tag) or {}
    num_classes = cfg.get("num_classes")
    extra: Dict[str, Any] = {"tag": tag}
    if num_classes == 1000:
        extra["dataset"] = "imagenet"
    return WeightsRecord(model=tag, model_kwargs={}, num_classes=num_classes, data_config=None,
                         producer=cfg.get("origin_url") or "released", format="pretrained-tag", extra=extra)
