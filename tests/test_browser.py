"""What the project serves to a browser, checked in a real one (issue 32): headless Chromium (tests/browser.py) opens a
study's report.html and the MLflow UI at the address a study prints, and reads the rendered pages.

Chromium is Debian's ``chromium`` (``.ci/run`` installs it, as README's development set-up does). Without it the tests
are skipped on a developer's machine and fail in CI (``$CI`` set), where it must be there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import mlflow
import pytest

from study import console
from study.launch import cli as launch
from study.report import cli as report
from tests.conftest import wait_for
from tests.test_launch import use_runs
from tests.test_serving import free_port

pytestmark = pytest.mark.slow

if shutil.which("chromium") is None and not os.environ.get("CI"):
    pytest.skip("no chromium on PATH (apt-get install chromium); CI installs it", allow_module_level=True)

from tests.browser import Browser  # noqa: E402  (after the skip: it needs chromium)

STUDY = "seen"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished rehearsal study (3 trials) and its report, in a runs folder of this module."""
    runs = tmp_path_factory.mktemp("browser") / "runs"
    undo = use_runs(runs)
    try:
        argv = ["--rehearse", "0", "--ray-cpus", "2", "--space", "smoke", "--num-samples", "3", "--confirm-budget", "0"]
        assert launch.main([*argv, "--study-name", STUDY]) == 0
        assert report.main(["--study", STUDY]) == 0
        yield runs
    finally:
        undo()


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b


def test_the_report_page_shows_every_image_and_no_broken_link(finished, browser):
    page = finished / "reports" / STUDY / "report.html"
    browser.navigate(page.as_uri())
    wait_for(lambda: browser.evaluate("document.readyState") == "complete", 60, "report.html to load")
    images = browser.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
    assert len(images) >= 3, images  # importances, parallel coordinates, learning curves
    assert all(complete and width > 100 and height > 100 for _, complete, width, height in images), images
    links = browser.evaluate("Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'))")
    local = [h for h in links if not re.match(r"^(https?:|mailto:|#)", h)]
    missing = [h for h in local if not (page.parent / h.split("#")[0]).exists()]
    assert not missing, missing
    assert any(f"viewStateShareKey={STUDY}&" in h for h in links), links  # the study's runs in MLflow, the pick first
    assert STUDY in browser.evaluate("document.body.innerText")
    # a table wider than the window (the top trials' many columns, or MLflow's narrow artifact pane) scrolls within
    # itself: the page never runs off its right edge (before, the top table was cut off at a 1,400 px window)
    narrow = {"width": 480, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    browser.command("Emulation.setDeviceMetricsOverride", narrow, browser.session)
    try:
        browser.navigate(page.as_uri())
        wait_for(lambda: browser.evaluate("document.readyState") == "complete", 60, "report.html to load at 480 px")
        widths = browser.evaluate("[document.documentElement.scrollWidth, window.innerWidth, document.querySelectorAll('table').length]")
        assert widths[2] >= 1 and widths[0] <= widths[1], widths
    finally:
        browser.command("Emulation.clearDeviceMetricsOverride", {}, browser.session)


@contextlib.contextmanager
def mlflow_ui(store: str):
    """An MLflow server of ``store`` on a free loopback port, as ``mlflow ui`` serves it; yields its address."""
    port = free_port()
    command = [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port)]
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")  # no job runner: CPU the tests need
    server = subprocess.Popen(
        [*command, "--backend-store-uri", store, "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/health"), 300, "the MLflow server", process=server)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def test_the_printed_mlflow_address_opens_the_runs_table_of_the_study(finished, browser):
    store = f"sqlite:///{finished / 'mlflow.db'}"
    client = mlflow.MlflowClient(store)
    parent = client.search_runs([e.experiment_id for e in client.search_experiments()], f"tags.study_name = '{STUDY}'")
    parent = [r for r in parent if r.data.tags.get("kind") == "study"][0]
    printed = console.ui_command(store, parent.info.experiment_id, STUDY)  # what the study's last lines say
    page = re.search(r"http://127\.0\.0\.1:5000/(\S+)$", printed).group(1)
    with mlflow_ui(store) as address:
        browser.navigate(f"{address}/{page}")
        row = f"document.querySelector('a[href*=\"/runs/{parent.info.run_id}\"]')"  # the study's parent run, a row
        wait_for(lambda: browser.evaluate(f"{row} !== null && /matching runs/.test(document.body.innerText)"), 180, "the runs table")
        text = browser.evaluate("document.body.innerText")
        assert "Run Name" in text and STUDY in text  # the runs table, with the study's parent
        assert "Judges" not in text  # the model-training views (GenAI's side bar lists Judges, Sessions, Prompts)
        assert re.search(r"\b4 matching runs", text), text[:2000]  # the parent and its 3 trials
        # the pick is the first row, unfolded: its run's link comes before every other run's in the table
        links = browser.evaluate(
            "Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href')).filter(h => /runs\\/[0-9a-f]{32}$/.test(h))"
        )
        assert links and links[0].endswith(parent.data.tags["picked_run"]), (links, parent.data.tags["picked_run"])
        assert "picked" in text and "val_recall_at_1" in text  # the columns that tell the runs apart
        # one click further: the pick's run page. MLflow 3.17's link to a run drops the address's workflowType, and the
        # page takes the browser's stored choice, GenAI in a fresh browser; one click on Model training there (README)
        # stores it, and every run page after opens in the model-training views
        pick_id = parent.data.tags["picked_run"]
        pick = client.get_run(pick_id).info.run_name
        on_run_page = f"document.body.innerText.includes({pick!r}) && /Overview/.test(document.body.innerText)"
        browser.evaluate(f"document.querySelector('a[href$=\"{links[0]}\"]').click()")
        wait_for(lambda: browser.evaluate(on_run_page), 180, "the pick's run page")
        switch = "Array.from(document.querySelectorAll('*')).find(e => !e.children.length && e.innerText?.trim() === 'Model training')"
        if "Judges" in browser.evaluate("document.body.innerText"):
            browser.evaluate(f"{switch}.click()")
            stored = "localStorage.getItem('mlflow.workflowType_v1') === '\"machine_learning\"'"
            wait_for(lambda: browser.evaluate(stored), 60, "the choice stored")
        browser.navigate(f"{address}/#/experiments/{parent.info.experiment_id}/runs/{pick_id}")  # no workflowType: the stored choice
        wait_for(lambda: browser.evaluate(f"{on_run_page} && /Model metrics/.test(document.body.innerText)"), 180, "the run page again")
        text = browser.evaluate("document.body.innerText")
        assert "Judges" not in text, text[:2000]


def test_the_registered_model_and_the_report_describe_a_tie_as_one_model_of_its_members(tmp_path, browser):
    """A study whose race could not tell #4 from #7, retrained by study.final --study: the registered version's page
    names each member (the pick marked), their own test scores and their mean beside the model's; the report's test
    table is the tie as one model, then each member alone."""
    from study.final import cli as final
    from tests.test_final import tied_study

    undo = use_runs(tmp_path / "runs")
    try:
        tied_study(tmp_path)
        assert final.main(["--study", "s1"]) == 0
        assert report.main(["--study", "s1"]) == 0
        html = tmp_path / "runs" / "reports" / "s1" / "report.html"
        store = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    finally:
        undo()
    with mlflow_ui(store) as address:
        browser.navigate(f"{address}/#/models/s1-embedding/versions/1")
        wait_for(lambda: browser.evaluate("/members' mean/.test(document.body.innerText)"), 180, "the registered version's description")
        text = browser.evaluate("document.body.innerText")
        assert "Optuna #4 (the pick, seed 0), Optuna #7 (seed 1), Optuna #4 (seed 2) as one model" in text, text[:3000]
        assert "#4 alone (the pick)" in text and "#7 alone" in text and "this model" in text
        assert "Config of Optuna #7, seed 1" in text
    browser.navigate(html.as_uri())
    wait_for(lambda: browser.evaluate("document.readyState === 'complete'"), 60, "report.html")
    text = browser.evaluate("document.body.innerText")
    assert "the race's tie #4, #7, #4 as one model" in text, text[:3000]
    assert "#7" in text and "alone" in text, text[:3000]
