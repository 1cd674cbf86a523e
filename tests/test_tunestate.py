"""A study's Tune state kept resumable (study/launch/tunestate.py), on state files written by hand."""

from __future__ import annotations

import json
import os
import pickle
import shutil

from study.launch import tunestate


def write_state(folder, snapshot: str, trials: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    state = {"trial_data": [[{"id": n}, {}] for n in range(trials)], "runner_data": {}}
    (folder / f"experiment_state-{snapshot}.json").write_text(json.dumps(state))
    (folder / f"search_gen_state-{snapshot}.json").write_bytes(pickle.dumps({"counter": trials}))  # Tune pickles it


def test_a_readable_snapshot_is_copied_and_a_torn_one_never_is(tmp_path):
    write_state(tmp_path, "a", 3)
    assert tunestate.keep_good_state(str(tmp_path)) is True
    assert sorted(p.name for p in (tmp_path / ".last-good").iterdir()) == ["experiment_state-a.json", "search_gen_state-a.json"]
    state = tmp_path / "experiment_state-a.json"
    state.write_bytes(state.read_bytes()[:20])  # cut short, as by a full disk
    assert tunestate.keep_good_state(str(tmp_path)) is False
    assert json.loads((tmp_path / ".last-good" / "experiment_state-a.json").read_text())["trial_data"][2][0] == {"id": 2}


def test_recover_puts_the_good_copy_back_whole_and_keeps_the_torn_files(tmp_path):
    write_state(tmp_path, "a", 3)
    tunestate.keep_good_state(str(tmp_path))
    (tmp_path / "experiment_state-a.json").unlink()
    (tmp_path / "search_gen_state-a.json").unlink()
    write_state(tmp_path, "b", 5)  # a later snapshot: its experiment state torn, its searcher state whole
    (tmp_path / "experiment_state-b.json").write_text('{"trial_data": [[{"id": 0')
    assert tunestate.resumable(str(tmp_path)) is True  # the good copy
    assert tunestate.recover(str(tmp_path)) == ["experiment_state-b.json"]
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert names == ["experiment_state-a.json", "experiment_state-b.json.torn", "search_gen_state-a.json"]
    assert tunestate.recover(str(tmp_path)) == []  # whole again: nothing to do


def test_an_experiment_state_without_what_tune_restores_from_is_put_back_from_the_good_copy(tmp_path):
    """Valid JSON that is not Tune's state (a hand edit, another file copied over it): Tune's restore logged "Failed to
    restore the run state" and started the experiment afresh, and --resume said nothing; now such a file counts as
    torn, and the good copy is put back."""
    write_state(tmp_path, "a", 3)
    tunestate.keep_good_state(str(tmp_path))
    state = tmp_path / "experiment_state-a.json"
    for text in ("{}", "[]", '"x"', '{"trial_data": {}, "runner_data": {}}', '{"trial_data": [], "runner_data": []}'):
        state.write_text(text)
        assert not tunestate.readable(state), text
        assert tunestate.keep_good_state(str(tmp_path)) is False  # never copied over the good one
    assert tunestate.recover(str(tmp_path)) == ["experiment_state-a.json"]
    assert json.loads(state.read_text())["trial_data"][2][0] == {"id": 2}


def test_without_a_good_copy_a_torn_state_is_not_called_resumable(tmp_path):
    write_state(tmp_path, "a", 3)
    (tmp_path / "search_gen_state-a.json").write_bytes(b"")
    assert tunestate.resumable(str(tmp_path)) is False
    assert tunestate.recover(str(tmp_path)) == []  # nothing to put back: left as it is
    (tmp_path / "before-the-first-snapshot").mkdir()
    assert tunestate.resumable(str(tmp_path / "before-the-first-snapshot")) is True  # --resume starts its trials afresh
    assert tunestate.resumable(str(tmp_path / "never-started")) is False  # no experiment folder: --resume refuses it


def test_a_resumed_studys_older_snapshot_is_not_copied_again(tmp_path):
    """Tune restores from the greatest name of each kind; a resumed driver writes its snapshot under a new session's
    name beside the first driver's, which stays (113 MB at 5,000 trials). Only the newest is copied."""
    write_state(tmp_path, "2026-11-26_10-00-00", 3)
    write_state(tmp_path, "2026-11-26_11-00-00", 5)
    assert tunestate.keep_good_state(str(tmp_path)) is True
    copies = sorted(p.name for p in (tmp_path / ".last-good").iterdir())
    assert copies == ["experiment_state-2026-11-26_11-00-00.json", "search_gen_state-2026-11-26_11-00-00.json"]
    (tmp_path / "experiment_state-2026-11-26_11-00-00.json").write_text('{"trial_data": [[{"id": 0')  # the newest torn
    assert tunestate.keep_good_state(str(tmp_path)) is False  # the older, whole one is not what Tune would restore
    assert tunestate.recover(str(tmp_path)) == ["experiment_state-2026-11-26_11-00-00.json"]
    restored = json.loads((tmp_path / "experiment_state-2026-11-26_11-00-00.json").read_text())
    assert len(restored["trial_data"]) == 5


def test_a_snapshot_rewritten_while_it_is_copied_leaves_the_last_good_copy_whole(tmp_path, monkeypatch):
    """Tune rewrites its state files in place (not atomically) while the keeper may be copying them: a copy that reads
    the file half rewritten must not become the good copy, since --resume then has none to put back."""
    write_state(tmp_path, "a", 3)
    assert tunestate.keep_good_state(str(tmp_path)) is True
    write_state(tmp_path, "a", 5)  # Tune's next snapshot, under the same names
    copy = tunestate.shutil.copyfile

    def copy_while_tune_rewrites(source, target):
        copy(source, target)
        with open(target, "r+b") as torn:  # what the copy read: the file cut short mid-rewrite
            torn.truncate(len(torn.read()) // 2)

    monkeypatch.setattr(tunestate.shutil, "copyfile", copy_while_tune_rewrites)
    assert tunestate.keep_good_state(str(tmp_path)) is False
    good = tmp_path / ".last-good"
    assert json.loads((good / "experiment_state-a.json").read_text())["trial_data"][2][0] == {"id": 2}
    assert pickle.loads((good / "search_gen_state-a.json").read_bytes()) == {"counter": 3}
    assert sorted(p.name for p in good.iterdir()) == ["experiment_state-a.json", "search_gen_state-a.json"]  # no tmp left
    monkeypatch.setattr(tunestate.shutil, "copyfile", copy)
    assert tunestate.keep_good_state(str(tmp_path)) is True  # the next try copies the new snapshot whole
    assert pickle.loads((good / "search_gen_state-a.json").read_bytes()) == {"counter": 5}


def test_a_snapshot_caught_before_all_its_files_arrived_does_not_replace_a_whole_copy(tmp_path):
    write_state(tmp_path, "a", 3)
    assert tunestate.keep_good_state(str(tmp_path)) is True
    (tmp_path / "search_gen_state-a.json").unlink()  # Tune uploads its files one by one
    assert tunestate.keep_good_state(str(tmp_path)) is False
    assert sorted(p.name for p in (tmp_path / ".last-good").iterdir()) == ["experiment_state-a.json", "search_gen_state-a.json"]


def make_checkpoints(trial, numbers):
    for n in numbers:
        folder = trial / f"checkpoint_{n:06d}"
        folder.mkdir(parents=True)
        (folder / "bundle.pt").write_bytes(bytes([n]) * 10)


def test_the_checkpoint_the_snapshot_names_comes_back_after_tune_deleted_it(tmp_path):
    trial = tmp_path / "train_trial_a_1"
    make_checkpoints(trial, [0, 1])
    tunestate.keep_checkpoint_links(trial)  # Tune's on_checkpoint of checkpoint 1
    kept = trial / tunestate.KEPT / "checkpoint_000001" / "bundle.pt"
    assert kept.stat().st_ino == (trial / "checkpoint_000001" / "bundle.pt").stat().st_ino  # a link, not a copy
    for n in range(2, 7):  # checkpoints 2..6, Tune keeping the newest 2 (num_to_keep=2) after each
        make_checkpoints(trial, [n])
        tunestate.keep_checkpoint_links(trial)
        for old in sorted(trial.glob("checkpoint_*"))[:-2]:
            shutil.rmtree(old)
    assert sorted(p.name for p in (trial / tunestate.KEPT).iterdir()) == [f"checkpoint_00000{n}" for n in (3, 4, 5, 6)]
    assert tunestate.put_back_checkpoints(str(tmp_path)) == ["train_trial_a_1/checkpoint_000003", "train_trial_a_1/checkpoint_000004"]
    assert (trial / "checkpoint_000004" / "bundle.pt").read_bytes() == bytes([4]) * 10  # the snapshot's, whole
    assert sorted(p.name for p in trial.glob("checkpoint_*")) == [f"checkpoint_00000{n}" for n in (3, 4, 5, 6)]
    assert tunestate.put_back_checkpoints(str(tmp_path)) == []  # nothing missing any more
    tunestate.drop_checkpoint_links(trial)  # the trial ended: its links go, Tune's own checkpoints stay
    assert not (trial / tunestate.KEPT).exists() and (trial / "checkpoint_000006" / "bundle.pt").is_file()


def test_the_checkpoint_the_good_copy_names_is_kept_when_newer_ones_followed_it(tmp_path):
    """With a checkpoint every epoch, the good copy of Tune's state (up to 10 s old) can name a checkpoint more than 4
    old: the last 2 written before the copy keep their links, beside the newest 4."""
    trial = tmp_path / "train_trial_a_1"
    write_state(tmp_path / tunestate.GOOD, "2026-11-28_10-00-00", 1)
    copied = (tmp_path / tunestate.GOOD / "experiment_state-2026-11-28_10-00-00.json").stat().st_mtime
    for n in range(8):  # checkpoints 0..7, one a second, the good copy taken between 2 and 3
        make_checkpoints(trial, [n])
        os.utime(trial / f"checkpoint_{n:06d}", (copied + n - 2.5, copied + n - 2.5))
        tunestate.keep_checkpoint_links(trial)
        for old in sorted(trial.glob("checkpoint_*"))[:-2]:  # Tune's num_to_keep=2
            shutil.rmtree(old)
    assert sorted(p.name for p in (trial / tunestate.KEPT).iterdir()) == [f"checkpoint_00000{n}" for n in (1, 2, 4, 5, 6, 7)]
    assert tunestate.put_back_checkpoints(str(tmp_path))[:2] == ["train_trial_a_1/checkpoint_000001", "train_trial_a_1/checkpoint_000002"]
    assert (trial / "checkpoint_000002" / "bundle.pt").read_bytes() == bytes([2]) * 10
