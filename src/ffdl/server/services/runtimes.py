"""Framework runtimes: which environment a job's command runs on, chosen by its framework.

A manifest's ``framework.name`` and ``framework.version`` select one of the runtimes the
operator declares under ``runtimes:`` in ``config.yaml`` (FfDL chose a learner image the same
way). A runtime is either the platform's own environment (the Python the platform runs on,
with PyTorch and scikit-learn) or a Python environment built from pip requirements, created
once on first use by a learner's controller (``ffdl.learner.runtime``) and cached under the
platform home, keyed by the digest of its definition.

A runtime may also provide programs at paths of their own inside the learner sandbox
(``paths``: FfDL's manifests call ``/opt/conda/bin/python``), bound when a job runs: they
are no part of the environment, nor of its digest.

This module owns the declaration (``RuntimeConfig``), the runtimes in force when the operator
declares none for a framework, matching a framework and version to a runtime, that digest,
and the checks of ``paths`` made at start. Matching is pure; only the defaults and the start
checks look at what is installed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ffdl.core.errors import ManifestError
from ffdl.learner.runtime import RuntimeSpec, missing_program
from ffdl.learner.sandbox import reserved_path

PLATFORM: Literal["platform"] = "platform"
PYTHON: Literal["python"] = "python"
ANY_VERSION = "*"
# Bumped when the way an environment is built changes, so old caches are not reused.
# 2: pip is seeded into the environment.
BUILD_FORMAT = 2


class RuntimeConfig(BaseModel):
    """One runtime an operator declares (an entry of ``runtimes:`` in config.yaml)."""

    model_config = ConfigDict(extra="forbid")

    framework: str = Field(min_length=1, max_length=100)
    # Which manifest versions it serves: dot-separated parts matched against the leading
    # parts of the version, each part may use * and ?; "*" serves every version.
    version: str = Field(default=ANY_VERSION, min_length=1, max_length=100)
    name: str = Field(default="", max_length=200)
    # The framework's runtime for versions no runtime matches (one per framework).
    default: bool = False
    # "platform": the platform's own Python environment; "python": an environment built
    # from ``requirements`` (the default when requirements are given).
    environment: Literal["platform", "python"] | None = None
    requirements: list[str] = Field(default_factory=list)
    # Installer options for a built environment (uv pip install): wheel directories or
    # URLs, another index, no index at all (an offline build from find_links only).
    find_links: list[str] = Field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    no_index: bool = False
    # Programs the runtime provides inside the learner sandbox: absolute path -> "python"
    # (its interpreter) or the name of an executable in its bin directory (``pip``).
    paths: dict[str, str] = Field(default_factory=dict)

    @field_validator("framework")
    @classmethod
    def _lower_framework(cls, value: str) -> str:
        return value.strip().lower()

    @field_validator("version", "name")
    @classmethod
    def _strip(cls, value: str) -> str:
        return value.strip()

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        for requirement in value:
            text = requirement.strip()
            if not text or text.startswith("-"):
                raise ValueError(
                    f"requirement {requirement!r} must name a package (installer options go "
                    "in find_links, index_url, extra_index_urls, no_index)"
                )
        return [r.strip() for r in value]

    @field_validator("find_links")
    @classmethod
    def _absolute_links(cls, value: list[str]) -> list[str]:
        for link in value:
            if not (link.startswith("/") or "://" in link):
                raise ValueError(f"find_links entry {link!r} must be an absolute path or a URL")
        return value

    @model_validator(mode="after")
    def _environment(self) -> RuntimeConfig:
        if self.environment is None:
            self.environment = PYTHON if self.requirements else PLATFORM
        installer = self.requirements or self.find_links or self.index_url
        if self.environment == PLATFORM and (installer or self.extra_index_urls or self.no_index):
            raise ValueError(
                f"runtime {self.label!r}: the platform environment takes no requirements "
                "or installer options; use environment: python"
            )
        return self

    @model_validator(mode="after")
    def _paths(self) -> RuntimeConfig:
        for inside, name in self.paths.items():
            if (problem := _path_problem(inside, name)) is not None:
                raise ValueError(f"runtime {self.label!r}: paths entry {inside!r}: {problem}")
        for inside in self.paths:
            holder = next((p for p in self.paths if inside.startswith(p + "/")), None)
            if holder is not None:
                raise ValueError(
                    f"runtime {self.label!r}: paths entry {inside!r} lies under the entry "
                    f"{holder!r}"
                )
        return self

    @property
    def label(self) -> str:
        """The runtime's name as users see it."""
        if self.name:
            return self.name
        return self.framework if self.version == ANY_VERSION else f"{self.framework}-{self.version}"

    @property
    def built(self) -> bool:
        return self.environment == PYTHON

    def describe(self) -> str:
        where = "the platform's environment" if not self.built else "a built Python environment"
        return f"{self.label} ({where})"


def _path_problem(inside: str, name: str) -> str | None:
    if not inside.startswith("/") or os.path.normpath(inside) != inside or inside == "/":
        return "must be an absolute path, written plainly (no '..', '.', '//' or trailing '/')"
    if (mount := reserved_path(inside)) is not None:
        return f"collides with {mount}, which the learner sandbox mounts itself"
    if not name or "/" in name or name in (".", ".."):
        return f"{name!r} must name an executable of the runtime (python, pip, ...)"
    return None


def check_paths(declared: list[RuntimeConfig], home: Path) -> None:
    """Refuse ``paths`` entries a learner's sandbox could never provide (ValueError naming
    the entry): one inside the platform home or holding it (the jobs' own directories are
    there), and, on the platform's environment, one naming an executable it lacks (a built
    environment is checked once it is built, when a job runs)."""
    root = str(home.resolve())
    for runtime in declared:
        for inside in runtime.paths:
            if inside == root or inside.startswith(root + "/") or root.startswith(inside + "/"):
                raise ValueError(
                    f"runtime {runtime.label!r}: paths entry {inside!r}: collides with the "
                    f"platform home {root}"
                )
        if runtime.paths and not runtime.built:
            python = os.path.abspath(sys.executable)
            own = RuntimeSpec(name=runtime.label, python=python, paths=dict(runtime.paths))
            if (missing := missing_program(own)) is not None:
                raise ValueError(missing)


def unsandboxed_paths(declared: list[RuntimeConfig]) -> str | None:
    """The warning for runtimes whose ``paths`` cannot be provided (no sandbox), if any."""
    listed = [f"{r.label}: {', '.join(r.paths)}" for r in declared if r.paths]
    if not listed:
        return None
    return (
        "runtime paths are provided in the learner sandbox only; without it (--no-sandbox) "
        "they are not, and a command calling them runs whatever the host has there, if "
        f"anything ({'; '.join(listed)})"
    )


@dataclass(frozen=True, slots=True)
class Resolution:
    """The runtime a job runs on, and the submit warning when it is a fallback."""

    runtime: RuntimeConfig
    warning: str | None = None


def _major_minor(distribution: str) -> str | None:
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
    parts = version.split("+", 1)[0].split(".")
    return ".".join(parts[:2])


@lru_cache(maxsize=1)
def platform_runtimes() -> tuple[RuntimeConfig, ...]:
    """The runtimes in force for frameworks the operator declares nothing for: PyTorch and
    scikit-learn at their installed versions, and ``custom``/``python`` for any version, all
    on the platform's own environment."""
    runtimes = [
        RuntimeConfig(framework="custom", default=True),
        RuntimeConfig(framework="python", default=True),
    ]
    for framework, distribution in (("pytorch", "torch"), ("scikit-learn", "scikit-learn")):
        installed = _major_minor(distribution)
        runtimes.append(
            RuntimeConfig(framework=framework, version=installed or ANY_VERSION, default=True)
        )
    return tuple(runtimes)


def check_runtimes(declared: list[RuntimeConfig]) -> list[RuntimeConfig]:
    """Refuse declarations that would make resolution ambiguous (raises ValueError)."""
    names: set[str] = set()
    defaults: set[str] = set()
    for runtime in declared:
        if runtime.label in names:
            raise ValueError(f"runtimes: two runtimes are named {runtime.label!r}")
        names.add(runtime.label)
        if runtime.default:
            if runtime.framework in defaults:
                raise ValueError(f"runtimes: {runtime.framework!r} has more than one default")
            defaults.add(runtime.framework)
    return declared


def effective_runtimes(declared: list[RuntimeConfig]) -> list[RuntimeConfig]:
    """The operator's runtimes, plus the platform's for every framework they leave out."""
    frameworks = {runtime.framework for runtime in declared}
    return list(declared) + [r for r in platform_runtimes() if r.framework not in frameworks]


def version_matches(pattern: str, version: str) -> bool:
    if pattern == ANY_VERSION:
        return True
    wanted, given = pattern.split("."), version.strip().split(".")
    if len(wanted) > len(given):
        return False
    return all(fnmatch.fnmatchcase(part, want) for want, part in zip(wanted, given, strict=False))


def _default_of(candidates: list[RuntimeConfig]) -> RuntimeConfig:
    # The one marked default; without one, the first declared for the framework.
    return next((r for r in candidates if r.default), candidates[0])


def _listing(runtimes: list[RuntimeConfig]) -> str:
    by_framework: dict[str, list[str]] = {}
    for runtime in runtimes:
        versions = by_framework.setdefault(runtime.framework, [])
        versions.append("any version" if runtime.version == ANY_VERSION else runtime.version)
    return "; ".join(f"{name} ({', '.join(v)})" for name, v in sorted(by_framework.items()))


def resolve(runtimes: list[RuntimeConfig], framework: str, version: str) -> Resolution:
    """The runtime for a manifest's framework and version.

    A runtime whose version pattern matches wins (one naming the version exactly first,
    then the first declared); a version none matches gets the framework's default with a
    warning; a framework with no runtime is a ManifestError on ``framework.name`` that lists
    what exists.
    """
    name, version = framework.strip().lower(), version.strip()
    candidates = [r for r in runtimes if r.framework == name]
    if not candidates:
        raise ManifestError(
            "framework.name",
            f"framework {framework!r} has no runtime on this platform; "
            f"frameworks and versions available: {_listing(runtimes)}",
        )
    if not version:
        return Resolution(_default_of(candidates))
    exact = [r for r in candidates if r.version == version]
    matching = exact or [r for r in candidates if version_matches(r.version, version)]
    if matching:
        return Resolution(matching[0])
    fallback = _default_of(candidates)
    return Resolution(
        fallback,
        warning=(
            f"framework {name} version {version} has no runtime on this platform; the job "
            f"runs on {fallback.describe()}, the default for {name}"
        ),
    )


def runtime_digest(runtime: RuntimeConfig, python: str = sys.executable) -> str:
    """What keys a built environment's cache: its packages, installer options and Python."""
    definition = {
        "format": BUILD_FORMAT,
        "python": python,
        "python_version": sys.version,
        "requirements": runtime.requirements,
        "find_links": runtime.find_links,
        "index_url": runtime.index_url,
        "extra_index_urls": runtime.extra_index_urls,
        "no_index": runtime.no_index,
    }
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
