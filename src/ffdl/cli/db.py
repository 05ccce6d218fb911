"""``ffdl db upgrade|status|backup|restore``: the store's schema and its backups, without a
running server.

All read the platform's settings as ``ffdl up`` does (``--home``, its ``config.yaml``,
``FFDL_*``), so they act on the database ``ffdl up`` would open; ``--database-url``
overrides it. ``ffdl up`` upgrades at start anyway; ``ffdl db upgrade`` lets an operator
migrate first (say before a rolling restart of replicas), and ``status`` says where the
schema stands. ``backup`` and ``restore`` copy a SQLite database consistently
(``ffdl.server.store.backup``; PostgreSQL has pg_dump). A developer's ``ffdl db revision
-m MESSAGE`` (hidden) drafts a migration from the difference between the models and the
head revision.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from ffdl.client.settings import ClientSettings

if TYPE_CHECKING:
    from ffdl.server.store.db import Store

# Plain text: addresses such as [::1]:5432 are not markup.
console = Console(highlight=False, markup=False)
err_console = Console(stderr=True, highlight=False, markup=False)

db_app = typer.Typer(
    help="The platform database: schema status and upgrade, backup and restore.",
    no_args_is_help=True,
)

Home = Annotated[Path | None, typer.Option(help="Platform home (default: FFDL_HOME or ~/.ffdl).")]
DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        metavar="URL",
        help="The database (default: FFDL_DATABASE_URL, config.yaml, or home's ffdl.db), "
        "e.g. postgresql+psycopg://USER:PASSWORD@HOST:5432/DB.",
    ),
]


def _open(home: Path | None, database_url: str | None) -> Store:
    """The store ``ffdl up`` would open; any problem as one line and exit code 1."""
    from pydantic import ValidationError

    from ffdl.server.settings import Settings
    from ffdl.server.store.db import Store

    try:
        settings = Settings.load(
            (home or ClientSettings().home).expanduser(), database_url=database_url
        )
        return Store(settings.db_url)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        )
        _fail(f"invalid settings: {problems}")
    except (ValueError, RuntimeError) as exc:
        _fail(str(exc))


def _fail(message: str) -> NoReturn:
    err_console.print(Text(f"ffdl db: {message}", style="red"), soft_wrap=True)
    raise typer.Exit(1)


@db_app.command("upgrade")
def upgrade_command(home: Home = None, database_url: DatabaseUrl = None) -> None:
    """Migrate the database to this ffdl's schema (what `ffdl up` does at start)."""
    from ffdl.server.store.db import StoreUnavailable
    from ffdl.server.store.schema import head_revision, upgrade

    store = _open(home, database_url)
    if store.path is not None:
        store.path.parent.mkdir(parents=True, exist_ok=True)
    try:
        applied = upgrade(store)
    except StoreUnavailable as exc:
        _fail(str(exc))
    finally:
        store.dispose()
    if applied:
        console.print(f"applied {' '.join(applied)}; now at head {applied[-1]}", soft_wrap=True)
    else:
        console.print(f"already at head {head_revision()}", soft_wrap=True)


@db_app.command("status")
def status_command(home: Home = None, database_url: DatabaseUrl = None) -> None:
    """Show the database's schema revision and this ffdl's head revision.

    Exits 1 when the database is newer than this ffdl, 0 otherwise.
    """
    from ffdl.server.store.db import StoreUnavailable
    from ffdl.server.store.schema import describe, head_revision, state

    store = _open(home, database_url)
    console.print(f"database: {store.address}", soft_wrap=True)
    if store.path is not None and not store.path.exists():
        store.dispose()
        console.print(
            f"no database yet (ffdl up or ffdl db upgrade creates it at head {head_revision()})",
            soft_wrap=True,
        )
        return
    try:
        schema = state(store)
    except StoreUnavailable as exc:
        _fail(str(exc))
    finally:
        store.dispose()
    for line in describe(schema):
        console.print(line, soft_wrap=True)
    if not schema.known:
        raise typer.Exit(1)


@db_app.command("revision", hidden=True)
def revision_command(
    message: Annotated[str, typer.Option("--message", "-m", help="What the change does.")],
) -> None:
    """For ffdl's developers: draft a migration from the models' difference with head.

    Writes ``src/ffdl/server/store/migrations/versions/NNNN_<message>.py`` (review it:
    autogenerate misses renames and some type changes).
    """
    import tempfile

    from alembic import command

    from ffdl.server.store.db import Store
    from ffdl.server.store.schema import alembic_config, head_revision, upgrade

    with tempfile.TemporaryDirectory() as scratch:
        store = Store(f"sqlite:///{Path(scratch) / 'head.db'}")
        try:
            upgrade(store)
            rev_id = f"{int(head_revision()) + 1:04d}"
            with store.engine.connect() as conn:
                config = alembic_config(conn)
                script = command.revision(config, message=message, autogenerate=True, rev_id=rev_id)
        finally:
            store.dispose()
    scripts = script if isinstance(script, list) else [script]
    for made in scripts:
        if made is not None:
            console.print(f"wrote {made.path}", soft_wrap=True)


BackupFile = Annotated[Path, typer.Argument(metavar="FILE", help="The backup file.")]
Force = Annotated[bool, typer.Option("--force", help="Replace what is there.")]


def _sqlite_file(store: Store, action: str) -> Path:
    path = store.path
    store.dispose()
    if path is None:
        _fail(
            f"{action} works on a SQLite database; {store.address} is PostgreSQL: use "
            "pg_dump -Fc and pg_restore (docs/operator/backups.md)"
        )
    return path


@db_app.command("backup")
def backup_command(
    file: BackupFile, home: Home = None, database_url: DatabaseUrl = None, force: Force = False
) -> None:
    """Copy the SQLite database to FILE, consistently, while the platform runs or not.

    Keep HOME/jobs and HOME/secret.key with it: they are not in the database.
    """
    from ffdl.server.store.backup import BackupError, backup

    source = _sqlite_file(_open(home, database_url), "backup")
    started = time.monotonic()
    try:
        copied = backup(source, file, force=force)
    except BackupError as exc:
        _fail(str(exc))
    took = time.monotonic() - started
    console.print(
        f"backed up {source} to {file} in {took:.1f} s: {copied.describe()}", soft_wrap=True
    )
    console.print(
        f"not in it, copy them too: {source.parent / 'jobs'} (the jobs' files) and "
        f"{source.parent / 'secret.key'} (tokens and credentials are sealed with it)",
        soft_wrap=True,
    )


@db_app.command("restore")
def restore_command(
    file: BackupFile, home: Home = None, database_url: DatabaseUrl = None, force: Force = False
) -> None:
    """Replace the SQLite database with the backup FILE (the platform stopped).

    Refused while the platform runs on it, and when it holds jobs unless --force; it is
    replaced whole, never merged. Put the backup's HOME/jobs and HOME/secret.key back too.
    """
    from ffdl.server.store.backup import BackupError, restore

    store = _open(home, database_url)
    target = _sqlite_file(store, "restore")
    try:
        restored = restore(file, target, force=force, alive_within=timedelta(seconds=30))
    except BackupError as exc:
        _fail(str(exc))
    console.print(f"restored {target} from {file}: {restored.describe()}", soft_wrap=True)
    missing = [p for p in (target.parent / "jobs", target.parent / "secret.key") if not p.exists()]
    if missing:
        console.print(
            f"put back from the backup too: {' and '.join(str(p) for p in missing)}; "
            "then ffdl up (running jobs restart from their checkpoints, as after a crash)",
            soft_wrap=True,
        )
