"""What ``ffdl up`` tells the person who started it: where the platform is, how to point
the ``ffdl`` command at it from another shell, and the dashboard's sign-in link.

The link carries the administrator's token in its fragment (the browser never sends it to
the server; the dashboard reads it). A token is a credential, so the link is printed only to
a terminal: a service's output goes to a journal that others may read, and there the lines
say where the token is kept instead.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from ffdl.client.config import ConfigError, read_client_file
from ffdl.server.settings import Settings, default_home


def announce(settings: Settings) -> None:
    """Print ``connect_lines`` to standard output (the link only when it is a terminal)."""
    print("\n".join(connect_lines(settings, terminal=sys.stdout.isatty())), flush=True)


def connect_lines(settings: Settings, *, terminal: bool) -> list[str]:
    """The lines to print once the platform serves."""
    client_file = settings.client_config_path
    lines = [f"ffdl is up at {settings.api_url} (home {settings.home})"]
    if _same(settings.home, default_home()):
        lines.append("  the ffdl command finds it (this is its default home): ffdl list")
    else:
        lines.append(
            "  to use it from another shell: "
            f"export FFDL_CONFIG={shlex.quote(str(client_file))}; then ffdl list"
        )
    token = _token(client_file) if terminal else None
    if token:
        lines.append(f"  dashboard: {settings.api_url}/#token={token}")
    else:
        lines.append(f"  dashboard: {settings.api_url}/ (sign in with the token in {client_file})")
    lines.append(f"  API docs: {settings.api_url}/docs")
    return lines


def _token(client_file: Path) -> str | None:
    try:
        return read_client_file(client_file).get("token") or None
    except ConfigError:
        return None


def _same(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()
