"""Path-based data stores, confined to the host directories the operator allows.

A ``local`` or ``mount_volume`` store names a host directory (``connection.path``) that
learners' controllers, which run as root, read training data from and write results into.
Without a bound any user could stage ``/etc`` or write into ``/root``, so the directory must
lie under one of ``settings.allowed_store_paths`` (``store_paths`` in config.yaml, default
``HOME/stores``), after resolving every symbolic link. A container is a relative path inside
the store (the manifest refuses absolute paths and ``..``); resolved, it must stay under the
same allowed directory, so a symbolic link planted in the store cannot lead out of it.

Submit checks this once (``check_store_paths``); the lifecycle manager asks again at each
deploy through ``training_data_path`` and ``results_path``, since a link can appear after
submit. Every refusal is a ``StoreError``: HTTP 400, code C103, naming the field and path.
"""

from __future__ import annotations

from pathlib import Path

from ffdl.core.errors import ManifestError
from ffdl.core.manifest import Container, DataStore, Manifest
from ffdl.core.redact import redact_url
from ffdl.server.settings import Settings

PATH_STORE_TYPES = frozenset({"local", "mount_volume"})


class StoreError(ManifestError):
    """A data store path the platform may not use (outside the allow-list, or leading out)."""

    default_code = "C103"


def check_store_paths(settings: Settings, manifest: Manifest) -> None:
    """Refuse any path-based store, or container in one, outside the allowed directories."""
    for index, store in enumerate(manifest.data_stores):
        if store.type not in PATH_STORE_TYPES:
            continue
        field = f"data_stores[{index}]"
        base, root = _store_root(settings, store, f"{field}.connection.path")
        for section, container in (
            ("training_data", store.training_data),
            ("training_results", store.training_results),
        ):
            if container is not None:
                _inside(base, container, root, f"{field}.{section}.container")


def training_data_path(settings: Settings, manifest: Manifest) -> Path | None:
    """The resolved host directory the job's training data is staged from, or None when the
    job's (first) data store has no training data or is not path-based.

    Raises ``StoreError`` (C103) when the path now lies outside the allowed directories.
    """
    store = manifest.data_store()
    if store is None or store.type not in PATH_STORE_TYPES or store.training_data is None:
        return None
    base, root = _store_root(settings, store, "data_stores[0].connection.path")
    return _inside(base, store.training_data, root, "data_stores[0].training_data.container")


def results_path(settings: Settings, manifest: Manifest, job_id: str) -> Path | None:
    """The resolved host directory the job's results are stored into
    (``<path>/<training_results.container>/<job_id>``), or None when the job's (first) data
    store has no results container or is not path-based.

    Raises ``StoreError`` (C103) when the path now lies outside the allowed directories.
    """
    store = manifest.data_store()
    if store is None or store.type not in PATH_STORE_TYPES or store.training_results is None:
        return None
    field = "data_stores[0].training_results.container"
    base, root = _store_root(settings, store, "data_stores[0].connection.path")
    container = _inside(base, store.training_results, root, field)
    target = _resolve(container / job_id, field)
    if not target.is_relative_to(root):
        raise StoreError(field, f"{job_id!r} in it leads out of the allowed store paths")
    return target


def _store_root(settings: Settings, store: DataStore, field: str) -> tuple[Path, Path]:
    """The store's resolved directory and the allowed directory it lies under."""
    raw = store.connection.get("path", "").strip()
    shown = redact_url(raw)
    if not raw.startswith("/"):
        raise StoreError(field, f"must be an absolute host path, got {shown!r}")
    if "\x00" in raw:
        raise StoreError(field, "must not contain NUL characters")
    allowed = settings.allowed_store_paths
    base = _resolve(Path(raw), field)
    for root in allowed:
        if base.is_relative_to(root):
            return base, root
    roots = ", ".join(str(root) for root in allowed)
    raise StoreError(
        field,
        f"{shown!r} is outside the allowed store paths ({roots}); an operator allows more "
        "with store_paths in config.yaml",
    )


def _inside(base: Path, container: Container, root: Path, field: str) -> Path:
    resolved = _resolve(base / container.container, field)
    if not resolved.is_relative_to(root):
        raise StoreError(field, f"{container.container!r} leads out of the allowed store paths")
    return resolved


def _resolve(path: Path, field: str) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symbolic link loop
        raise StoreError(field, f"cannot be resolved: {exc}") from None
