"""The Optuna journal survives a torn write: a partial last record (a killed writer, a full disk) never corrupts it."""

from __future__ import annotations

import json

import optuna
import pytest

from study.journal import cut_torn_tail, repair
from study.search import open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)


def make_study(path, name: str = "s", trials: int = 3) -> None:
    study = optuna.create_study(study_name=name, storage=open_storage(f"journal:{path}"))
    for i in range(trials):
        trial = study.ask()
        study.tell(trial, float(i))


def values(path, name: str = "s") -> list[float]:
    study = optuna.load_study(study_name=name, storage=open_storage(f"journal:{path}"))
    return [t.value for t in study.trials]


@pytest.mark.parametrize("torn", [b'{"op_code":4,"worker_id":"x","tri', b"{", b'{"op_code"'])
def test_appending_after_a_torn_record_keeps_the_journal_readable(tmp_path, torn):
    path = tmp_path / "journal.log"
    make_study(path)
    with open(path, "ab") as fh:
        fh.write(torn)  # the writer died mid-record, or the disk filled
    study = optuna.load_study(study_name="s", storage=open_storage(f"journal:{path}"))
    study.tell(study.ask(), 9.0)  # appended after the torn record
    # a fresh reader (a --resume, study.sync) reads every record, and the torn one is kept aside, not lost silently
    assert values(path) == [0.0, 1.0, 2.0, 9.0]
    assert all(json.loads(line) for line in path.read_bytes().splitlines())
    assert (tmp_path / "journal.log.torn").read_bytes() == torn + b"\n"


def test_a_journal_already_glued_by_an_older_writer_is_repaired_on_open(tmp_path):
    path = tmp_path / "journal.log"
    make_study(path)
    lines = path.read_bytes().splitlines(keepends=True)
    torn = b'{"op_code":6,"worker_id":"dead'
    glued = (
        b"".join(lines[:-2]) + torn + b"".join(lines[-2:])
    )  # what Optuna's own backend leaves: a torn record, a good one on its line, more
    path.write_bytes(glued)
    with pytest.raises(json.JSONDecodeError):
        list(optuna.storages.journal.JournalFileBackend(str(path)).read_logs(0))  # the defect: every read fails
    assert values(path) == [0.0, 1.0, 2.0]  # the good record after the torn one is kept
    assert path.read_bytes() == b"".join(lines)
    assert torn in (tmp_path / "journal.log.torn").read_bytes()


def test_cut_torn_tail_and_repair_leave_a_sound_journal_alone(tmp_path):
    path = tmp_path / "journal.log"
    make_study(path)
    before = path.read_bytes()
    assert cut_torn_tail(str(path)) == 0 and repair(str(path)) == 0
    assert path.read_bytes() == before
    assert not (tmp_path / "journal.log.torn").exists()


def test_cut_torn_tail_of_a_journal_of_one_torn_line(tmp_path):
    path = tmp_path / "journal.log"
    path.write_bytes(b'{"op_code":0,"wor')
    assert cut_torn_tail(str(path)) == len(b'{"op_code":0,"wor')
    assert path.read_bytes() == b""
