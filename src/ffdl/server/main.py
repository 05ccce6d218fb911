"""Running the embedded platform in the foreground (``ffdl up``)."""

from __future__ import annotations

import logging
from pathlib import Path

import uvicorn

from ffdl.backends.local import NO_SANDBOX_WARNING, SandboxUnavailable
from ffdl.server.app import create_app
from ffdl.server.settings import Settings


def serve(
    home: Path | None = None,
    host: str | None = None,
    port: int | None = None,
    sandbox: bool | None = None,
) -> None:
    settings = Settings.load(home, host=host, port=port, sandbox=sandbox)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not settings.sandbox:
        logging.getLogger("ffdl.server").warning(NO_SANDBOX_WARNING)
    try:
        app = create_app(settings)
    except SandboxUnavailable as exc:
        raise SystemExit(f"ffdl: {exc}") from None
    logging.getLogger("ffdl.server").info(
        "ffdl is up at %s (home %s); API docs at %s/docs",
        settings.api_url,
        settings.home,
        settings.api_url,
    )
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")


def _main() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ffdl.server.main")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--no-sandbox", action="store_true")
    args = parser.parse_args()
    serve(args.home, args.host, args.port, sandbox=False if args.no_sandbox else None)


if __name__ == "__main__":
    _main()
