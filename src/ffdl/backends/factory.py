"""Opening the configured backend: the one place that chooses a backend by its config.

Everything else talks to the ``Backend`` protocol only. The Ray backend is imported here
lazily, so that Ray is needed (and loaded) only when an operator chooses it.
"""

from __future__ import annotations

from ffdl.backends.base import Backend, BackendConfigError
from ffdl.backends.local import LocalBackend, LocalConfig
from ffdl.backends.ray_config import RayConfig
from ffdl.backends.simulated import SimulatedBackend, SimulatedSetup

RAY_MISSING = "the Ray backend needs Ray: pip install 'ffdl[ray]'"


def open_backend(config: LocalConfig | RayConfig | SimulatedSetup) -> Backend:
    """The backend ``config`` describes; ``BackendConfigError`` when it cannot be had here."""
    if isinstance(config, SimulatedSetup):
        return SimulatedBackend(config)
    if isinstance(config, RayConfig):
        try:
            from ffdl.backends.ray_backend import RayBackend
        except ImportError as exc:
            if _is_ray_missing(exc):
                raise BackendConfigError(RAY_MISSING) from exc
            raise
        backend: Backend = RayBackend(config)
        return backend
    return LocalBackend(config)


def _is_ray_missing(exc: ImportError) -> bool:
    # Only Ray itself being absent is the operator's to fix with an install; a broken
    # import inside ffdl's own module is a bug and propagates as it is.
    name = exc.name or ""
    return name == "ray" or name.startswith("ray.")
