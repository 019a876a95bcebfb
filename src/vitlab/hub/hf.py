"""Hugging Face hub repositories (`hf-hub:owner/name`) through huggingface_hub: its cache (HF_HUB_CACHE /
HF_HOME), its token (`hf auth login`, HF_TOKEN) and its offline mode; vitlab adds no HTTP of its own here.

A repository becomes the snapshot folder that holds config.json and one weights file (model.safetensors,
else pytorch_model.bin); vitlab.load reads that folder as an HF transformers or timm folder.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
import urllib.request
from pathlib import Path

from vitlab.errors import WeightsError
from vitlab.hub.cache import offline
from vitlab.hub.entry import Entry

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
OPTIONAL = ("preprocessor_config.json",)


def _unresolved_endpoint() -> str | None:
    """The hub's host name when it does not resolve (no network, no DNS), else None. huggingface_hub would retry
    such a request 5 times (about 25 s) before falling back to its cache; one lookup decides it at once."""
    host = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname
    if not host or urllib.request.getproxies().get("https"):  # behind a proxy, the proxy resolves the hub
        return None
    try:
        socket.getaddrinfo(host, 443)
    except socket.gaierror:
        return host
    except OSError:  # any other failure: let huggingface_hub try and report it
        return None
    return None


def fetch_repo(entry: Entry, force: bool = False) -> Path:
    """The local snapshot folder of `entry.repo` with config.json and its weights."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise WeightsError(entry.name, "huggingface_hub is not installed", "pip install 'vitlab[hub]'") from None
    no_dns = None if offline() else _unresolved_endpoint()  # no network: the cache only, at once
    local_only = offline() is not None or no_dns is not None
    # huggingface_hub reads HF_HUB_CACHE when it is imported; read it again so a later setting is honoured
    cache_dir = os.environ.get("HF_HUB_CACHE") or None

    def get(filename: str) -> Path:
        return Path(hf_hub_download(entry.repo or "", filename, revision=entry.extra.get("revision"),
                                    cache_dir=cache_dir, local_files_only=local_only,
                                    force_download=force and not local_only))

    def missing(files: str, not_cached: bool) -> WeightsError:
        if local_only:
            why = f"{offline()}=1 forbids downloading" if offline() else f"{no_dns} does not resolve (offline?)"
            return WeightsError(entry.name, f"{files} not in the Hugging Face cache and {why}",
                                f"run `vitlab download {entry.name}` where the network is reachable")
        if not_cached:  # online, but the hub could not be reached
            return WeightsError(entry.name, f"{files} not in the Hugging Face cache and the hub is unreachable",
                                "check the network (or HF_ENDPOINT)")
        return WeightsError(entry.name, f"the repository has no {files}", "vitlab reads HF transformers and timm repos")

    try:
        config = get("config.json")
        not_cached = False
        for name in WEIGHTS:
            try:
                get(name)
                break
            except EntryNotFoundError as err:  # remote: the repo lacks it; local: not cached. Try the next name
                not_cached = not_cached or isinstance(err, LocalEntryNotFoundError)
        else:
            raise missing(" or ".join(WEIGHTS), not_cached)
        for name in OPTIONAL:
            try:
                get(name)
            except (EntryNotFoundError, HfHubHTTPError):
                pass
    except EntryNotFoundError as err:
        raise missing("config.json", isinstance(err, LocalEntryNotFoundError)) from None
    except HfHubHTTPError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        fix = "check the id and your token (`hf auth login`)"
        raise WeightsError(entry.name, f"Hugging Face hub: {first}", fix) from None
    return config.parent
