"""Weights as timm shares them: a folder of ``config.json``, ``model.safetensors`` and a ``README.md`` model card,
on disk (``local-dir:DIR``) or on the Hugging Face Hub (``hf-hub:ORG/NAME``).

:func:`save_hub_folder` writes the folder. ``config.json`` is timm's own (``timm.models.save_config_for_hf``:
``architecture``, ``num_classes``, ``num_features``, ``model_args``, ``pretrained_cfg`` with the preprocessing), so
after ``import simattn`` a classifier loads with ``timm.create_model("local-dir:DIR", pretrained=True)``.
``model.safetensors`` is the state dict timm loads, carrying the weights record (:mod:`simattn.models.weights`) in
its metadata, so every simattn command opens the folder as it opens the file: :func:`resolve_weights` turns
the folder (``DIR`` or ``local-dir:DIR``) and ``hf-hub:ORG/NAME[@REVISION]`` into that file (the latter
downloaded, or taken from the cache, by ``huggingface_hub``), for :mod:`simattn.models.sources`, the one
resolution of a weights name every loader uses.
"""
from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from torch import nn

from ..utils.io import atomic_folder, save_safetensors

__all__ = ["HUB_PREFIXES", "WEIGHTS_NAME", "CONFIG_NAME", "CARD_NAME", "hub_name", "timm_loader", "resolve_weights",
           "weights_file", "download_file", "hub_config", "save_hub_folder"]

#: the model names timm reads from a folder (``local-dir:``) or a Hub repository (``hf-hub:``)
HUB_PREFIXES = ("local-dir:", "hf-hub:")
#: the files of a folder (timm's names)
WEIGHTS_NAME, CONFIG_NAME, CARD_NAME = "model.safetensors", "config.json", "README.md"
#: the suffixes of weights files a folder's listing names, and the files of a run folder, in the order they are shown
WEIGHTS_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
RUN_WEIGHTS = ("final.safetensors", "best.safetensors", "last.pth", "final_ema.safetensors")


def timm_loader(name: str) -> str:
    """The Python line that loads the folder ``name`` (``local-dir:DIR``, ``hf-hub:ORG/NAME``) with timm."""
    return f"timm.create_model({name!r}, pretrained=True)"


def hub_name(weights: Union[str, Path, None]) -> Optional[Tuple[str, str]]:
    """``('local-dir', DIR)`` or ``('hf-hub', 'ORG/NAME[@REV]')`` for a name of either form, else None."""
    if not isinstance(weights, str):
        return None
    for prefix in HUB_PREFIXES:
        if weights.startswith(prefix):
            return prefix[:-1], weights[len(prefix):]
    return None


def resolve_weights(weights: Union[str, Path]) -> Path:
    """The weights file ``weights`` names: a file path as it is; a folder timm reads, ``DIR`` or ``local-dir:DIR``
    → ``DIR/model.safetensors``; ``hf-hub:ORG/NAME[@REV]`` → the downloaded (or cached) ``model.safetensors``.
    One-line errors for a folder that is not a timm folder (naming the weights files it holds), ``local-dir:`` of a
    file, a repository that does not exist, and a Hub that cannot be reached."""
    source = hub_name(weights)
    if source is None:
        path = Path(weights)
        # a folder of weights files; any other (an exported Core ML package) is left to its reader
        holds_weights = path.is_dir() and ((path / CONFIG_NAME).is_file() or any(
            p.is_file() and p.suffix in WEIGHTS_SUFFIXES for p in path.iterdir()))
        return _folder_weights(path, str(weights)) if holds_weights else path
    kind, where = source
    if kind == "local-dir":
        folder = Path(where)
        if where and folder.is_file():
            raise FileNotFoundError(f"weights {weights}: {folder} is a file, not a folder; name the file without "
                                    "local-dir: (local-dir: takes the folder simattn hub save wrote)")
        if not where or not folder.is_dir():
            raise FileNotFoundError(f"weights {weights}: no such folder {folder} (local-dir: takes the folder "
                                    "simattn hub save wrote)")
        return _folder_weights(folder, weights)
    return _download(where)


def weights_file(weights: Union[str, Path], what: str = "weights file") -> Path:
    """:func:`resolve_weights`, with a one-line FileNotFoundError when no file is there (``what``: how it names the
    weights); a folder that holds no weights is named as one."""
    path = resolve_weights(weights)
    if path.is_file():
        return path
    if path.is_dir():
        raise FileNotFoundError(f"weights {weights} is a folder without weights files: name a weights file, or a "
                                "folder simattn hub save wrote (config.json, model.safetensors)")
    raise FileNotFoundError(f"{what} not found: {path}")


def _folder_weights(folder: Path, name: str) -> Path:
    """``folder/model.safetensors`` of a folder timm reads, else a one-line error: the weights files it holds (a run
    folder's ``final.safetensors``, ``best.safetensors``, ``last.pth``), or the files a timm folder lacks."""
    missing = [n for n in (CONFIG_NAME, WEIGHTS_NAME) if not (folder / n).is_file()]
    if not missing:
        return folder / WEIGHTS_NAME
    order = {n: i for i, n in enumerate(RUN_WEIGHTS)}
    files = sorted((p.name for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHTS_SUFFIXES),
                   key=lambda n: (order.get(n, len(order)), n))
    if files and len(missing) == 2:
        shown = ", ".join(str(folder / n) for n in files[:3]) + (f" (+{len(files) - 3} more)" if len(files) > 3 else "")
        raise FileNotFoundError(f"weights {name}: the folder is not one simattn hub save wrote (no config.json, "
                                f"model.safetensors); name one of its weights files ({shown})")
    raise FileNotFoundError(f"weights {name}: the folder lacks {', '.join(missing)}, so it is not a folder simattn "
                            "hub save wrote (config.json, model.safetensors, README.md); name a weights file instead")


@functools.lru_cache(maxsize=16)  # one download (or cache look-up) per repository and process
def _download(model_id: str) -> Path:
    name = f"hf-hub:{model_id}"
    for filename in (CONFIG_NAME, WEIGHTS_NAME):  # config.json too: the snapshot is then timm's whole folder
        path = download_file(model_id, filename, name, missing="(not a folder simattn hub save or timm wrote)")
    return path


def download_file(model_id: str, filename: str, name: str, missing: str = "") -> Path:
    """``filename`` of the Hub repository ``ORG/NAME[@REVISION]``, downloaded by ``huggingface_hub`` (or taken from
    its cache); one-line ValueErrors naming the weights as ``name`` (``missing``: what a file it lacks means)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    from timm.models._hub import hf_split

    repo, revision = hf_split(model_id)
    if model_id.endswith("@"):
        raise ValueError(f"weights {name}: nothing follows the @ (hf-hub:ORG/NAME@REVISION names a branch, tag or "
                         "commit): name the revision, or drop the @ for the default branch")
    if not repo or repo.count("/") != 1:
        raise ValueError(f"weights {name}: expected hf-hub:ORG/NAME (optionally @REVISION)")
    # without a network huggingface_hub retries for half a minute: look the Hub's host up first, and take the
    # cached copy at once when it cannot be found
    offline = not _hub_reachable()
    try:
        return Path(hf_hub_download(repo, filename, revision=revision, local_files_only=offline))
    except RepositoryNotFoundError:
        raise ValueError(f"weights {name}: no such repository on the Hugging Face Hub (or it is private: log in "
                         "with `hf auth login`)") from None
    except RevisionNotFoundError:
        raise ValueError(f"weights {name}: the repository has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        from huggingface_hub import constants
        cache = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
        raise ValueError(f"weights {name}: cannot reach the Hugging Face Hub (huggingface.co: no network, or "
                         f"HF_HUB_OFFLINE is set) and {repo}/{filename} is not cached (in {cache}); connect to the "
                         "network, or download it elsewhere and pass the file (a folder: local-dir:DIR)") from None
    except EntryNotFoundError:  # after its subclass LocalEntryNotFoundError
        raise ValueError(f"weights {name}: the repository has no {filename} {missing}".rstrip()) from None
    except HfHubHTTPError as e:
        raise ValueError(f"weights {name}: the Hugging Face Hub answered "
                         f"{str(e).splitlines()[0][:200]}") from None
    except OSError as e:  # a connection that fails below huggingface_hub's own errors
        raise ValueError(f"weights {name}: cannot reach the Hugging Face Hub (huggingface.co) over the network: "
                         f"{type(e).__name__}: {str(e)[:200]}") from None


def _hub_reachable() -> bool:
    """Whether the Hub's host name resolves (False offline, or with ``HF_HUB_OFFLINE`` set)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.getaddrinfo(url.hostname, url.port or (443 if url.scheme == "https" else 80))
    except (OSError, UnicodeError):
        return False
    return True


def hub_config(model: nn.Module, architecture: str, data_config: Optional[Mapping[str, Any]] = None,
               **extra: Any) -> Dict[str, Any]:
    """timm's ``config.json`` for ``model`` (registered as ``architecture``): timm's ``save_config_for_hf`` with
    ``data_config`` (the weights' preprocessing) in ``pretrained_cfg`` and ``extra`` as more top-level entries
    (``label_names``, ``task``, ``palette``, ...)."""
    from timm.models._hub import save_config_for_hf  # not re-exported by timm.models

    model_config: Dict[str, Any] = dict(extra)
    # a segmenter carries its backbone's pretrained_cfg: the folder's architecture is the segmenter's own
    model_config["pretrained_cfg"] = {"architecture": architecture}
    data_config = {k: tuple(v) if isinstance(v, list) else v for k, v in (data_config or {}).items()
                   if v is not None}
    with tempfile.TemporaryDirectory(prefix="simattn-hub-") as tmp:
        path = Path(tmp) / CONFIG_NAME
        save_config_for_hf(model, str(path), model_config=model_config, data_config=data_config or None)
        return json.loads(path.read_text())


def save_hub_folder(model: nn.Module, config: Mapping[str, Any], metadata: Mapping[str, str],
                    output: Union[str, Path], card: str, *, overwrite: bool = False) -> Path:
    """Write ``output`` as timm's folder: ``config.json`` (``config``, from :func:`hub_config`),
    ``model.safetensors`` (the model's state dict with ``metadata``, the weights record) and ``README.md``
    (``card``), all at once (:func:`~simattn.utils.io.atomic_folder`: a folder that is not empty is refused unless
    ``overwrite``)."""
    with atomic_folder(output, overwrite=overwrite) as tmp:
        (tmp / CONFIG_NAME).write_text(json.dumps(dict(config), indent=2) + "\n")
        save_safetensors(model, tmp / WEIGHTS_NAME, metadata=metadata)
        (tmp / CARD_NAME).write_text(card, encoding="utf-8")
    return Path(output)
