"""Hugging Face Hub ids (``ORG/NAME``, ``ORG/NAME@REVISION``) -> a snapshot directory in huggingface_hub's cache.

Everything about where files come from is huggingface_hub's: its cache (``HF_HUB_CACHE``/``HF_HOME``), endpoint
(``HF_ENDPOINT``), token (``HF_TOKEN`` or a saved login), offline mode (``HF_HUB_OFFLINE``), resumed downloads and
its progress bars (shown on a terminal). What OASR adds is the choice of files: the repo's file list is read first
and only what the detected format's converter reads is fetched, so a Whisper repo carrying fp32 shards, Flax and
TensorFlow copies beside ``model.safetensors`` costs one weight file, and a transformers repo whose model_type OASR
does not serve is refused after fetching ``config.json`` alone. The result is a local directory that
``resolve_source`` loads like any other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from oasr.errors import HubUnavailableError, ModelNotFoundError, UnsupportedModelError

log = logging.getLogger(__name__)

# A repo id as the Hub spells it (a namespace, then a name; letters, digits, '-', '_', '.'), optionally pinned to a
# branch, tag or commit after '@'. Anything else (a path starting with '.', '/' or '~', three segments) is no hub id.
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[^\s@]+))?$")

# The files each format's converter reads (``oasr.models.converters``), beyond its weights. Nothing else a repo holds
# (README, vocab.json + merges.txt when tokenizer.json is there, other frameworks' weights) is fetched.
_TRANSFORMERS_FILES = ("config.json", "generation_config.json", "preprocessor_config.json", "processor_config.json",
                       "tokenizer.json")
_CTRANSLATE2_FILES = ("config.json", "model.bin", "tokenizer.json")
_NATIVE_FILES = ("oasr.json", "model.safetensors", "tokenizer.json")
_SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weight files of a transformers checkpoint, in the order the converter prefers them (safetensors_io.find_weights).
_TRANSFORMERS_WEIGHTS = ("model.safetensors", _SAFETENSORS_INDEX, "pytorch_model.bin")
SERVED_FORMATS = ("transformers (config.json + model.safetensors, sharded safetensors or pytorch_model.bin)",
                  "CTranslate2 Whisper (model.bin)", "OASR native (oasr.json)", "NeMo (.nemo)")


@dataclass(frozen=True)
class HubRef:
    """A model repo on the Hub and the revision asked for (None: the default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class FileSelection:
    """What to fetch from a repo: its format (a ``CONVERTERS`` name, or ``nemo``) and the files it needs, as far as
    the file list tells; a sharded checkpoint's shard names come from its index once that is fetched."""

    format: str
    files: tuple[str, ...]


def parse_hub_id(text: str) -> HubRef | None:
    """``ORG/NAME`` or ``ORG/NAME@REVISION`` -> a ``HubRef``; anything else -> None."""
    match = _HUB_ID.match(text)
    if match is None or ".." in match["repo"]:
        return None
    return HubRef(match["repo"], match["revision"])


def select_files(ref: HubRef, names: Collection[str]) -> FileSelection:
    """The files of one repo (top-level names) that OASR's loader reads, by the format they show; refuses a repo
    with none it can read, saying what it reads."""
    present = set(names)

    def needs(required: tuple[str, ...], optional: tuple[str, ...] = ()) -> tuple[str, ...]:
        missing = [name for name in required if name not in present]
        if missing:
            raise UnsupportedModelError(f"{ref}: the repo has no {', '.join(missing)}, which OASR reads for this "
                                        "format; " + _serves())
        return required + tuple(name for name in optional if name in present and name not in required)

    if "oasr.json" in present:
        return FileSelection("native", needs(_NATIVE_FILES))
    weights = next((name for name in _TRANSFORMERS_WEIGHTS if name in present), None)
    if "config.json" in present and weights is not None:
        # Mistral's releases (Voxtral) carry their vocabulary as tekken.json instead of tokenizer.json.
        vocabulary = "tekken.json" if "tokenizer.json" not in present and "tekken.json" in present else "tokenizer.json"
        return FileSelection("huggingface", needs(("config.json", vocabulary, weights), _TRANSFORMERS_FILES))
    if "config.json" in present and "model.bin" in present:
        return FileSelection("ctranslate2", needs(_CTRANSLATE2_FILES))
    archives = sorted(name for name in present if name.endswith(".nemo"))
    if len(archives) == 1:
        return FileSelection("nemo", (archives[0],))
    if archives:
        raise UnsupportedModelError(f"{ref}: the repo holds several NeMo archives ({', '.join(archives)}); fetch the "
                                    "one you want (hf download) and pass its path as the model")
    raise UnsupportedModelError(f"{ref}: no checkpoint OASR can read in this repo; " + _serves())


def _serves() -> str:
    return "OASR reads " + "; ".join(SERVED_FORMATS) + ". Served transformers model types: " + ", ".join(
        served_model_types())


def served_model_types() -> tuple[str, ...]:
    # The transformers converter's own table, so this list never drifts from what loads.
    from oasr.models.converters.huggingface import _MODEL_TYPES

    return tuple(_MODEL_TYPES)


def fetch(ref: HubRef) -> Path:
    """The local snapshot directory of ``ref`` holding the files its format needs, downloaded into the cache on
    first use (or found there when offline or the Hub cannot be reached)."""
    from huggingface_hub import snapshot_download

    with _translated_errors(ref):
        names, offline = _list_files(ref)
        selection = select_files(ref, names)
        files = selection.files
        if selection.format == "huggingface":
            _check_model_type(ref, _fetch_one(ref, "config.json", offline))
            if _SAFETENSORS_INDEX in files:
                files += _shards(_fetch_one(ref, _SAFETENSORS_INDEX, offline))
        log.info("%s: %s checkpoint, fetching %s", ref, selection.format, ", ".join(files))
        snapshot = snapshot_download(ref.repo_id, revision=ref.revision, allow_patterns=list(files),
                                     local_files_only=offline)
    return Path(snapshot)


def _list_files(ref: HubRef) -> tuple[list[str], bool]:
    """The repo's top-level file names, and whether they came from the cache (offline mode, or the Hub unreachable:
    then every later step reads the cache too)."""
    from huggingface_hub import HfApi, constants

    if not constants.is_offline_mode():
        try:  # model_info, not list_repo_tree: one request, which huggingface_hub does not retry for half a minute
            info = HfApi().model_info(ref.repo_id, revision=ref.revision)
            return [sibling.rfilename for sibling in info.siblings or () if "/" not in sibling.rfilename], False
        except _connection_errors() as exc:
            names = _cached_files(ref, unreachable=exc)
            log.warning("cannot reach the Hub at %s (%s): loading %s from the cache", constants.ENDPOINT, exc, ref)
            return names, True
    return _cached_files(ref, unreachable=None), True


def _cached_files(ref: HubRef, unreachable: Exception | None) -> list[str]:
    from huggingface_hub import constants, get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        return [entry.path for entry in get_cached_repo_tree(ref.repo_id, revision=ref.revision)
                if "/" not in entry.path]
    except CachedRepoTreeNotFoundError:
        where = f"the cache ({constants.HF_HUB_CACHE})"
        pull = (f"run `oasr pull {ref}` on a host with network access, copy its HF_HUB_CACHE directory here and "
                "point HF_HUB_CACHE at it")
        if unreachable is None:
            raise HubUnavailableError(f"{ref} is not in {where} and HF_HUB_OFFLINE is set: {pull}") from None
        raise HubUnavailableError(
            f"cannot reach the Hub at {constants.ENDPOINT} ({_cause(unreachable)}) and {ref} is not in {where}: "
            f"check the network (or HF_ENDPOINT), or {pull}, then set HF_HUB_OFFLINE=1") from None


def _fetch_one(ref: HubRef, filename: str, offline: bool) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(ref.repo_id, filename, revision=ref.revision, local_files_only=offline))


def _check_model_type(ref: HubRef, config_file: Path) -> None:
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError):
        raise UnsupportedModelError(f"{ref}: config.json is not a JSON object with a model_type") from None
    if model_type not in served_model_types():
        raise UnsupportedModelError(f"{ref}: transformers model_type {model_type!r} is not served by OASR; served: "
                                    f"{', '.join(served_model_types())}")


def _shards(index_file: Path) -> tuple[str, ...]:
    try:
        return tuple(sorted(set(json.loads(index_file.read_text())["weight_map"].values())))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise UnsupportedModelError(f"{index_file.name} names no weight_map of shard files") from None


def _connection_errors() -> tuple[type[Exception], ...]:
    import httpx2  # huggingface_hub's HTTP client

    return (httpx2.TransportError,)


def _cause(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


@contextlib.contextmanager
def _translated_errors(ref: HubRef) -> Iterator[None]:
    """huggingface_hub's exceptions -> OASR errors that say what happened and what to do."""
    from huggingface_hub import constants
    from huggingface_hub import errors as hub

    token = "set HF_TOKEN to an access token (huggingface.co/settings/tokens)"
    try:
        yield
    except hub.GatedRepoError:
        raise HubUnavailableError(f"{ref.repo_id} is gated: accept its terms on {constants.ENDPOINT}/{ref.repo_id} "
                                  f"with your account, then {token} of that account") from None
    except hub.RepositoryNotFoundError:
        raise HubUnavailableError(f"{ref.repo_id!r} is not a local path, and the Hub at {constants.ENDPOINT} has no "
                                  f"model repo {ref.repo_id} (or it is private: {token} that can read it)") from None
    except hub.RevisionNotFoundError:
        raise HubUnavailableError(f"{ref.repo_id} has no revision {ref.revision!r} (a branch, tag or commit "
                                  "hash)") from None
    except (hub.LocalEntryNotFoundError, hub.IncompleteSnapshotError, hub.OfflineModeIsEnabled) as exc:
        raise HubUnavailableError(
            f"{ref} is not (fully) in the cache ({constants.HF_HUB_CACHE}) and the Hub cannot be used "
            f"({_cause(exc)}): without HF_HUB_OFFLINE and with network access it is fetched; for an offline host, "
            f"run `oasr pull {ref}` where there is network and copy the cache") from None
    except hub.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            raise HubUnavailableError(f"the Hub refused access to {ref} (HTTP {status}): {token} that may read "
                                      "it") from None
        raise HubUnavailableError(f"the Hub failed on {ref}: {_cause(exc)}") from None
    except _connection_errors() as exc:
        raise HubUnavailableError(f"lost the connection to the Hub at {constants.ENDPOINT} while fetching {ref} "
                                  f"({_cause(exc)}); run again to resume the download") from None


def pull(name: str, revision: str | None = None) -> str:
    """``oasr pull``: fetches one alias or hub id (``revision`` applies when the id names none) and returns the line
    saying where its files are."""
    from oasr.models.catalogue import CATALOGUE

    entry = CATALOGUE.get(name)
    ref = parse_hub_id(entry.hub_id if entry is not None else name)
    if ref is None:
        raise ModelNotFoundError(f"{name!r} is neither an alias from `oasr models` nor a Hugging Face Hub id "
                                 "(ORG/NAME or ORG/NAME@REVISION); embedded models and local paths need no pull")
    if revision is not None and ref.revision is None:
        ref = HubRef(ref.repo_id, revision)
    snapshot = fetch(ref)
    return f"{ref}: {snapshot} ({', '.join(sorted(p.name for p in snapshot.iterdir()))})"
