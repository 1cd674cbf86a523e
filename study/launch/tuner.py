"""The study's one Tuner: the Optuna study opened or created, the Tuner built or restored on --resume, and the race
replayed on its results."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import optuna

from study import checks
from study.inputs import UsageError
from study.launch import tunestate
from study.launch.settings import StudySettings, check_gpu_packing, race_split
from study.records import parent, tracking
from study.records.trials import TrialRecorder
from study.search.journal import journal_file, open_storage
from study.search.race import Selection, race_rules, race_selection, races, rerun_candidates, selection_record
from study.search.trial import FOLD_KEY, confirmed_trial, is_finite_number, race_table


def open_optuna(settings: StudySettings, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """The study's Optuna study: created, or with --resume loaded."""
    name, url = settings.name, settings.record.optuna_storage
    names = set(optuna.get_all_study_names(storage))
    if settings.resume:
        if name not in names:
            raise UsageError(f"--resume: no Optuna study {name!r} in {url}; expected an existing study name")
        return optuna.load_study(study_name=name, storage=storage)
    if name in names:
        raise UsageError(f"--study-name {name}: a study of that name exists in {url}; pass --resume to continue it or choose another name")
    return optuna.create_study(study_name=name, storage=storage, direction="maximize" if settings.record.mode == "max" else "minimize")


def open_study(settings: StudySettings, client, experiment_id: str, parent_id: str | None) -> tuple[optuna.Study, str]:
    """The Optuna study and the MLflow parent run, created together (with --resume: found); returns the parent's run id."""
    r = settings.record
    checks.check_cluster_resources(r.cpus_per_trial, r.gpus_per_trial)  # else trials would wait forever
    if settings.address is not None and r.gpus_per_trial and r.rehearse is None:  # a local Ray's GPUs: checked at launch
        check_gpu_packing(settings.space, r.gpus_per_trial, checks.cluster_gpus(r.gpus_per_trial))
    journal = journal_file(settings.record.optuna_storage)
    if journal is not None:  # its folder, checked at launch, may have been removed since (a long-queued --resume)
        Path(journal).parent.mkdir(parents=True, exist_ok=True)
    storage = open_storage(settings.record.optuna_storage)
    study = open_optuna(settings, storage)
    if parent_id is not None:
        parent.reopen(client, experiment_id, parent_id)
        return study, parent_id
    try:
        return study, parent.create_parent_run(client, experiment_id, settings.name, settings.space.path, settings.record.to_params())
    except BaseException:
        optuna.delete_study(study_name=settings.name, storage=storage)  # no half-created study
        raise


def trainable(settings: StudySettings):
    """The trainable with its runtime settings and resources: the scheduler's ladder of budgets (one schedule for a re-run)."""
    from ray import tune

    from study.search.trial import train_trial

    return tune.with_resources(
        tune.with_parameters(
            train_trial,
            data_root=settings.record.data_root,
            budgets=list(settings.early_stopping.budgets),
            rehearse_epoch_s=settings.record.rehearse,
            checkpoint_every_s=settings.checkpoint_every_s,
        ),
        {"cpu": settings.record.cpus_per_trial, "gpu": settings.record.gpus_per_trial},
    )


def new_tuner(settings: StudySettings, recorder: TrialRecorder):
    """A Tuner of the study: the Optuna searcher and then the race's re-runs (at most --max-concurrent trials at
    once), the scheduler, MLflow and progress callbacks."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.search import ConcurrencyLimiter

    from study.launch.callbacks import KeepState, MlflowTrials, Progress, ReleaseMemory
    from study.search.searcher import RacingSearcher

    s = settings
    searcher = RacingSearcher(
        s.space, s.record.optuna_storage, s.name, trials=s.record.num_samples, top=s.record.confirm_top, budget=s.confirm_budget,
        folds=s.record.val_folds, split=race_split(s.record.race_folds),
        metric=s.record.metric, mode=s.record.mode, max_epochs=s.max_epochs, seed=s.record.seed, sampler=s.record.sampler,
    )  # fmt: skip
    scheduler = s.early_stopping.scheduler
    return tune.Tuner(
        trainable(s),
        tune_config=tune.TuneConfig(
            metric=s.record.metric,
            mode=s.record.mode,
            num_samples=s.record.num_samples + s.reruns,
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=s.slots),
            scheduler=scheduler,
            reuse_actors=s.record.reuse_actors,
        ),
        run_config=tune.RunConfig(
            name=s.name,
            storage_path=s.record.storage_path,
            verbose=0,
            callbacks=[
                MlflowTrials(recorder, s.record.metric, s.max_epochs),
                Progress(
                    s.record.metric, s.record.mode, s.max_epochs, s.record.num_samples, s.race_plan, s.early_stopping.rungs, strata=s.strata
                ),
                *([KeepState(s.experiment_dir)] if "://" not in s.experiment_dir else []),
                ReleaseMemory(),
                CSVLoggerCallback(),
                JsonLoggerCallback(),
            ],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            failure_config=tune.FailureConfig(max_failures=s.max_failures),
        ),
    )


def restored_tuner(settings: StudySettings, study: optuna.Study, recorder: TrialRecorder):
    """The interrupted study's Tuner, after the records it kept are written (its restored searcher tells the Optuna
    trials that no restored Tune trial continues FAIL: ``OptunaSearcher.restore_state``)."""
    recorder.flush(force=True)  # records an interrupted study kept while MLflow was away
    local = "://" not in settings.experiment_dir
    if local and (torn := tunestate.recover(settings.experiment_dir)):
        what = f"{', '.join(torn)}: torn by a full disk, or not Tune's"
        print(f"Tune's state of study {settings.name} did not read back ({what}): resuming from its last good copy")
    if local and (back := tunestate.put_back_checkpoints(settings.experiment_dir)):
        print(f"{len(back)} checkpoint(s) of study {settings.name} Tune deleted after its last snapshot: put back from its links")
    if local and not tunestate.whole(settings.experiment_dir):
        return fresh_tuner(settings, study, recorder)
    return restore_tuner(settings)


def restore_tuner(settings: StudySettings):
    """Tune's restore of the study's experiment; a state that pickled what this version lacks is a one-line UsageError."""
    from ray import tune

    try:
        return tune.Tuner.restore(settings.experiment_dir, trainable(settings), resume_unfinished=True, resume_errored=False)
    except (AttributeError, ImportError, pickle.UnpicklingError) as error:
        if isinstance(error, AttributeError) and "Can't get attribute" not in str(error):
            raise
        raise UsageError(saved_by_another_version(settings, error)) from error


def saved_by_another_version(settings: StudySettings, error: Exception) -> str:
    """The one line for a Tune state that pickled a class this version no longer has (a study started before an
    upgrade that renamed its searcher, say): nothing of it can be continued as it was."""
    why = tracking.first_error_line(str(error)) or type(error).__name__
    return (
        f"--resume: Tune's state of study {settings.name} under {settings.experiment_dir} was saved by another version of "
        f"this project ({why}); expected the version that started it: resume it with that version, or start the study "
        "again under a new --study-name (its records so far stay in MLflow and Optuna)"
    )


def fresh_tuner(settings: StudySettings, study: optuna.Study, recorder: TrialRecorder):
    """--resume of a study whose Tune state holds no whole snapshot: stopped before Tune's first one, or that one torn
    by a full disk with no good copy. Tune saves its first snapshot before any trial reports, so a study none of whose
    trials has reported starts its trials in a new Tuner; one whose trials reported cannot be continued."""
    if any(t.intermediate_values or t.state.is_finished() for t in study.get_trials(deepcopy=False)):
        raise UsageError(
            f"--resume: Tune's state of study {settings.name} under {settings.experiment_dir} is missing or torn, with no "
            "good copy, and its trials have reported; expected a study Tune saved whole: start it again under a new --study-name"
        )
    aside = tunestate.set_aside(settings.experiment_dir)
    kept = f" (its torn files kept as *.torn: {', '.join(aside)})" if aside else ""
    print(f"Tune saved no whole state of study {settings.name} before it stopped{kept}; no trial had reported: they start now")
    return new_tuner(settings, recorder)


def replay_race(settings: StudySettings, study: optuna.Study, results) -> Selection | None:
    """The race of the top complete trials over validation folds (study.search.race), replayed on every score: the
    trials' own and their re-runs'; None when nothing raced (a grid, --confirm-budget 0, fewer than two complete
    trials). ``results``: the Tuner's ResultGrid, re-runs included."""
    s = settings
    trials = study.get_trials(deepcopy=False)
    complete = {t.number: t.value for t in trials if t.state == optuna.trial.TrialState.COMPLETE}
    numbers = rerun_candidates(complete, s.record.confirm_top, s.record.mode)
    if not races(s.confirm_budget, s.record.val_folds) or not numbers:
        return None
    scores = {}  # (Optuna trial, fold) -> score; NaN for a re-run that failed
    for result in results:
        n, value = confirmed_trial(result.config), (result.metrics or {}).get(s.record.metric)
        if n is not None and FOLD_KEY in result.config:
            scores[n, int(result.config[FOLD_KEY])] = float(value) if result.error is None and is_finite_number(value) else math.nan
    rules = race_rules(s.record.mode, s.record.val_folds, s.confirm_budget, trials, s.max_epochs)
    selection = race_selection(race_table(complete, numbers, scores), rules)
    study.set_user_attr("selection", selection_record(selection))  # the Optuna storage keeps it for study.sync
    return selection
