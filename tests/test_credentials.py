"""Passwords in storage URLs never reach a record, a log or the terminal (issue 33, finding 10).

A --tracking-uri ``http://user:PASSWORD@host`` or an --optuna-storage ``postgresql://user:PASSWORD@host/db`` was
recorded (the command tag of every run, the parent run's ``optuna_storage`` param) and echoed in error messages, so
every reader of MLflow or of the terminal saw the password. The tests plant one in each URL flag and look for it in
the MLflow store's bytes, in the log files under runs/logs and in everything the commands print.

A database server with a password is stood in for by SQLite behind a URL with a user and a password
(``PasswordSqlite``, a SQLAlchemy dialect registered here); the tracking server is a real ``mlflow server``.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import logging
import sqlite3
import sys
import threading
from pathlib import Path

import pytest
import yaml
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

from study import inputs, sync
from study.final import cli as final
from study.inputs import redacted
from study.launch import cli as launch
from study.records import tracking
from study.report import cli as report
from tests.test_final import TINY
from tests.test_names import two_studies
from tests.test_reliability import SMOKE, free_port, mlflow_server, refused_port, write

PASSWORD = "Pw-0f-th3-Study"


class PasswordSqlite(SQLiteDialect_pysqlite):
    """SQLite behind a URL that carries a user and a password (which SQLite has no use for): a database server's URL."""

    def create_connect_args(self, url):
        return super().create_connect_args(url._replace(username=None, password=None))


registry.register("pwsqlite", __name__, "PasswordSqlite")


def printed(capsys) -> str:
    captured = capsys.readouterr()
    return captured.out + captured.err


@pytest.mark.parametrize(
    "text, shown",
    [
        ("postgresql://user:PASSWORD@host/db", "postgresql://user:***@host/db"),
        ("error at http://u:p@h:1/api and mysql+pymysql://a:b@c/d", "error at http://u:***@h:1/api and mysql+pymysql://a:***@c/d"),
        ("postgresql://u:pa/ss@h/db", "postgresql://u:***@h/db"),  # an unescaped "/" or "@" in the password is hidden too
        ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),
        ("--tracking-uri=http://u:p@h", "--tracking-uri=http://u:***@h"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),  # no password: nothing to hide
        (
            "http://127.0.0.1:5000/x journal:/runs/j.log sqlite:////abs/mlflow.db",
            "http://127.0.0.1:5000/x journal:/runs/j.log sqlite:////abs/mlflow.db",
        ),
    ],
)
def test_redacted_hides_the_password_of_every_url(text, shown):
    assert redacted(text) == shown


def test_the_command_tag_error_lines_and_log_records_are_redacted(monkeypatch, caplog):
    url = f"postgresql://dml:{PASSWORD}@db.internal/studies"
    monkeypatch.setattr(sys, "argv", ["launch.py", "--optuna-storage", url, "--tracking-uri", f"http://dml:{PASSWORD}@head:5000"])
    command = tracking.reproducibility_tags()["command"]
    assert PASSWORD not in command and "--optuna-storage postgresql://dml:***@db.internal/studies" in command
    error = f"Traceback ...\nMlflowException: API request to http://dml:{PASSWORD}@head:5000/api/2.0/mlflow/runs/create failed"
    assert tracking.first_error_line(error) == "MlflowException: API request to http://dml:***@head:5000/api/2.0/mlflow/runs/create failed"
    inputs.redact_logs()
    with caplog.at_level(logging.WARNING):
        logging.getLogger("study.records.trials").warning("MLflow at %s is unreachable", f"http://dml:{PASSWORD}@head:5000")
        try:
            raise ConnectionError(f"API request to http://dml:{PASSWORD}@head:5000/api failed")
        except ConnectionError:
            logging.getLogger("mlflow").exception("a write failed")
    assert "MLflow at http://dml:***@head:5000 is unreachable" in caplog.text and "http://dml:***@head:5000/api failed" in caplog.text
    assert PASSWORD not in caplog.text


@contextlib.contextmanager
def basic_auth_server(user: str, password: str):
    """A loopback server answering /health with 200 to requests carrying ``user:password`` as basic auth, else 401."""
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the name http.server calls
            self.send_response(200 if self.path == "/health" and self.headers.get("Authorization") == expected else 401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def test_a_tracking_server_behind_a_password_is_reached_and_its_password_never_shown():
    with basic_auth_server("dml", PASSWORD) as port:
        tracking.check_reachable(f"http://dml:{PASSWORD}@127.0.0.1:{port}")  # before: urllib took "dml:PW@127.0.0.1" for a host
        with pytest.raises(inputs.UsageError) as refused:
            tracking.check_reachable(f"http://dml:wrong-{PASSWORD}@127.0.0.1:{port}")
    assert "Unauthorized" in str(refused.value) and f"http://dml:***@127.0.0.1:{port}" in str(refused.value)
    assert PASSWORD not in str(refused.value)


def test_a_password_in_a_url_flag_is_never_printed_in_an_error(tmp_path, runs, capsys, monkeypatch):
    two_studies(runs)
    server = f"http://dml:{PASSWORD}@127.0.0.1:{refused_port()}"
    database = f"postgresql://dml:{PASSWORD}@127.0.0.1:{refused_port()}/studies"
    config = str(write(tmp_path / "c.yaml", yaml.safe_dump({**TINY, "epochs": 1})))
    cases = [
        (launch.main, ["--space", str(SMOKE), "--tracking-uri", server]),
        (launch.main, ["--space", str(SMOKE), "--optuna-storage", database]),
        (final.main, ["--config", config, "--tracking-uri", server]),
        (final.main, ["--study", "base", "--tracking-uri", server]),
        (report.main, ["--study", "base", "--tracking-uri", server]),
        (sync.main, ["--study", "base", "--tracking-uri", server]),
    ]
    for main, argv in cases:
        assert main(argv) == 2, argv
        out = printed(capsys)
        assert "dml:***@127.0.0.1" in out and PASSWORD not in out, (argv, out)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    assert report.main(["--study", "base"]) == 2
    out = printed(capsys)
    assert "dml:***@127.0.0.1" in out and PASSWORD not in out


def where_in_store(database: Path, text: str) -> set[tuple[str, str]]:
    """(table, key or column) of the MLflow store's rows that hold ``text``."""
    found = set()
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            columns = [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]
            for row in connection.execute(f"SELECT * FROM {table}"):
                values = dict(zip(columns, row))
                for column, value in values.items():
                    if isinstance(value, str) and text in value:
                        found.add((table, str(values.get("key", column))))
    return found


@pytest.mark.faults
@pytest.mark.slow
def test_a_study_with_passwords_in_its_urls_records_logs_and_prints_none(tmp_path, runs, capsys, monkeypatch):
    """A rehearsal study on a tracking server and a database behind passwords, then its report, sync and final model."""
    port = free_port()
    uri = f"http://dml:{PASSWORD}@127.0.0.1:{port}"
    storage = f"pwsqlite://dml:{PASSWORD}@/{tmp_path / 'optuna.db'}"

    def run(main, *argv: str) -> int:
        monkeypatch.setattr(sys, "argv", [main.__module__, *argv])  # the command line its runs are tagged with
        return main(list(argv))

    with mlflow_server(tmp_path / "server", port):
        flags = ["--space", str(SMOKE), "--rehearse", "0", "--num-samples", "2", "--confirm-budget", "0", "--optuna-storage", storage]
        assert run(launch.main, *flags, "--tracking-uri", uri, "--study-name", "creds") == 0
        assert run(report.main, "--study", "creds", "--tracking-uri", uri) == 0
        assert run(sync.main, "--study", "creds", "--tracking-uri", uri) == 0
        assert run(final.main, "--study", "creds", "--tracking-uri", uri, "--epochs", "1", "--seeds", "1") == 0
    out = printed(capsys)
    assert "dml:***@127.0.0.1" in out and PASSWORD not in out
    logs = sorted((runs / "logs").glob("*.log"))
    assert logs and [log.name for log in logs if PASSWORD in log.read_text(errors="replace")] == []
    database = tmp_path / "server" / "server.db"
    assert "dml:***@" in database.read_bytes().decode(errors="replace")  # the command tags, redacted
    assert PASSWORD.encode() not in database.read_bytes(), where_in_store(database, PASSWORD)  # the study's record included


def test_a_database_error_is_told_by_its_own_line_not_by_sqlalchemys_link():
    """A full disk under MLflow's sqlite store: the end of a study said only "(Background on this error at: ...)"."""
    error = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database or disk is full\n"
        "[SQL: INSERT INTO metrics (key, value) VALUES (?, ?)]\n[parameters: ('val', 0.5)]\n"
        "(Background on this error at: https://sqlalche.me/e/21/e3q8)\n"
    )
    assert tracking.first_error_line(error) == "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database or disk is full"
    assert tracking.first_error_line("RuntimeError: boom\n") == "RuntimeError: boom"  # no statement: the last line
