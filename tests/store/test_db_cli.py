"""``ffdl db upgrade`` and ``ffdl db status`` through the real command line, on a real
SQLite file in a platform home and on the session's PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text
from typer.testing import CliRunner, Result

from ffdl.cli.main import app
from ffdl.server.store.db import Store
from ffdl.server.store.schema import current_revision, head_revision, script_directory
from tests.postgres import PostgresServer


def ffdl(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def test_upgrade_and_status_on_a_homes_sqlite_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    head = head_revision()

    fresh = ffdl("db", "status", "--home", str(home))
    assert fresh.exit_code == 0, fresh.output
    assert f"database: {home / 'ffdl.db'}" in fresh.stdout
    assert "no database yet" in fresh.stdout

    first = ffdl("db", "upgrade", "--home", str(home))
    assert first.exit_code == 0, first.output
    every = " ".join(reversed([script.revision for script in script_directory().walk_revisions()]))
    assert first.stdout.strip() == f"applied {every}; now at head {head}"
    assert (home / "ffdl.db").is_file()

    again = ffdl("db", "upgrade", "--home", str(home))
    assert again.exit_code == 0 and again.stdout.strip() == f"already at head {head}"

    status = ffdl("db", "status", "--home", str(home))
    assert status.exit_code == 0
    assert f"current revision: {head}" in status.stdout and "up to date" in status.stdout


def test_a_newer_database_is_refused_by_upgrade_and_flagged_by_status(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert ffdl("db", "upgrade", "--home", str(home)).exit_code == 0
    store = Store(f"sqlite:///{home / 'ffdl.db'}")
    try:
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))

        refused = ffdl("db", "upgrade", "--home", str(home))
        assert refused.exit_code == 1
        assert "revision 0999, newer than this ffdl knows" in refused.stderr
        assert current_revision(store) == "0999"

        status = ffdl("db", "status", "--home", str(home))
        assert status.exit_code == 1
        assert "current revision: 0999" in status.stdout
        assert "newer than this ffdl" in status.stdout
    finally:
        store.dispose()


def test_database_url_points_the_commands_at_postgresql(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.create_database()
    home = str(tmp_path / "home")
    pending = ffdl("db", "status", "--home", home, "--database-url", url)
    assert pending.exit_code == 0, pending.output
    assert f"database: 127.0.0.1:{postgres.port}" in pending.stdout
    assert "pending: 0001" in pending.stdout

    upgraded = ffdl("db", "upgrade", "--home", home, "--database-url", url)
    assert upgraded.exit_code == 0, upgraded.output
    assert upgraded.stdout.startswith("applied 0001")
    assert not (tmp_path / "home" / "ffdl.db").exists()
    store = Store(url)
    try:
        assert current_revision(store) == head_revision()
    finally:
        store.dispose()

    # The password never reaches the output, even when the server is away.
    away = url.replace(f":{postgres.port}/", ":1/")
    unreachable = ffdl("db", "upgrade", "--home", home, "--database-url", away)
    assert unreachable.exit_code == 1
    assert "database unreachable at 127.0.0.1:1" in unreachable.stderr
    assert "not-a-secret" not in unreachable.output
