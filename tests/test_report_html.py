"""Tests of what study.report shows people: report.md and report.html rendered from the same blocks (the page
self-contained, its images embedded), the text read from MLflow shown as text in both and no file but the report's
own PNGs embedded (issue 33), the papers' table (bold where the printed mean is best, n = 1 for one seed), plots
with integer epochs and marks, parallel coordinates without inactive parameters, and the retrieval grid / t-SNE
pictures of final runs.

References: HTML parsed back with the standard library's html.parser; PNG bytes compared with the files;
Markdown escapes, nearest neighbours and marks worked out by hand (CommonMark and GitHub's tables for the escapes).
"""

from __future__ import annotations

import base64
import re
from html import escape as html_escape
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pytest

from study import plots
from study.records.curves import curve_marks
from study.records.study_record import StudyRecord
from study.report import cli as report
from study.report.document import Bullets, Code, Heading, Image, Paragraph, Preformatted, Strong, Table, html_page, markdown, md_text
from study.report.sections import paper_table, pick_section, study_header
from tests.conftest import recorded_params
from tests.test_report import write_study_records

PNG = b"\x89PNG\r\n\x1a\n" + b"not really a picture, but bytes to compare"


class Page(HTMLParser):
    """Tags, image sources, and the text of every table cell and <strong> of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.images: list[str] = []
        self.cells: list[list[str]] = []
        self.strong: list[str] = []
        self.links: list[str] = []
        self._stack: list[str] = []
        self._text: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        for key in ("href", "src"):
            if key in attrs and tag != "img":
                self.links.append(attrs[key])
        if tag == "tr":
            self.cells.append([])
        if tag in ("td", "th", "strong"):
            self._stack.append(tag)
            self._text[tag] = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.cells[-1].append(self._text.pop(tag).strip())
            self._stack.remove(tag)
        if tag == "strong":
            self.strong.append(self._text.pop(tag))
            self._stack.remove(tag)

    def handle_data(self, data):
        for tag in self._stack:
            self._text[tag] += data


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


# -- report.html ---------------------------------------------------------------------------------------------------------


def test_blocks_as_markdown_and_as_a_self_contained_html_page(tmp_path):
    (tmp_path / "curve.png").write_bytes(PNG)
    blocks = [
        Heading(1, "Study x <1>"),
        Bullets((("space: ", Code("default"), ", 4 trials"), "status: FINISHED")),
        Table(("metric (%)", "A", "B"), (("R@1", Strong("72.0 ± 1.0"), "70.0 (n = 1)"),)),
        Paragraph(("A paragraph with ", Strong("bold"), " and ", Code("code <b>"))),
        Image(tmp_path / "curve.png", "the curve", caption="on its line:"),
        Preformatted("loss: softmax  # **not bold** in code", "yaml"),
    ]
    assert markdown(blocks) == "\n".join(
        [
            "# Study x \\<1\\>",
            "",
            "- space: `default`, 4 trials",
            "- status: FINISHED",
            "",
            "| metric (%) | A | B |",
            "|---|---|---|",
            "| R@1 | **72.0 ± 1.0** | 70.0 (n = 1) |",
            "",
            "A paragraph with **bold** and `code <b>`",
            "",
            "on its line: ![the curve](curve.png)",
            "",
            "```yaml",
            "loss: softmax  # **not bold** in code",
            "```",
            "",
        ]
    )
    html = html_page(blocks, tmp_path, title="t")
    page = parse(html)
    assert page.tags.count("h1") == 1 and "Study x &lt;1&gt;" in html
    assert page.tags.count("li") == 2 and page.tags.count("pre") == 1
    assert page.cells == [["metric (%)", "A", "B"], ["R@1", "72.0 ± 1.0", "70.0 (n = 1)"]]
    assert page.strong == ["72.0 ± 1.0", "bold"]  # the code block keeps its asterisks
    assert "**not bold**" in html and "<code>code &lt;b&gt;</code>" in html
    # one image, embedded: its data URI decodes to the file's bytes; nothing else is referenced
    assert len(page.images) == 1 and page.images[0].startswith("data:image/png;base64,")
    assert base64.b64decode(page.images[0].split(",", 1)[1]) == PNG
    assert page.links == [] and "<script" not in html


@pytest.mark.parametrize(
    "text, shown",
    [
        ("![pw](/etc/passwd)", "!\\[pw\\](/etc/passwd)"),  # with [ ] escaped, ! ( ) start nothing
        ("a|b", "a\\|b"),
        ("<script>alert(1)</script>", "\\<script\\>alert(1)\\</script\\>"),
        ("trial_0 lr_max", "trial_0 lr_max"),  # _ between letters or digits neither opens nor closes emphasis
        ("_x_ *y* `z` ~~w~~", "\\_x\\_ \\*y\\* \\`z\\` \\~\\~w\\~\\~"),
        ("two\nlines\r\nthree", "two lines three"),
        ("C:\\runs #1 $x$ &amp;", "C:\\\\runs \\#1 \\$x\\$ \\&amp;"),
    ],
)
def test_md_text_escapes_what_markdown_reads_as_markup(text, shown):
    assert md_text(text) == shown


def test_markdown_keeps_text_from_starting_blocks_and_code_whole():
    blocks = [
        Paragraph("- not a list"),
        Paragraph("1. nor this"),
        Bullets(("+ x", "    no code block")),
        Paragraph(("run ", Code("a `tick` b"))),
        Table(("a|b",), ((Code("x|y"),),)),
        Preformatted("```\nnot the end\n```", "yaml"),
    ]
    assert markdown(blocks).split("\n\n") == [
        "\\- not a list",
        "1\\. nor this",
        "- \\+ x\n- no code block",
        "run ``a `tick` b``",  # a fence longer than the backticks inside
        "| a\\|b |\n|---|\n| `x\\|y` |",  # GitHub's tables read \| as the cell's pipe, in code too
        "````yaml\n```\nnot the end\n```\n````\n",
    ]
    with pytest.raises(ValueError, match="rows of \\[2\\] cells under a header of 1"):
        Table(("a",), (("1", "2"),))


def test_html_page_embeds_only_pngs_in_the_reports_folder(tmp_path):
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "own.png").write_bytes(PNG)
    (tmp_path / "elsewhere.png").write_bytes(PNG + b" elsewhere")
    (folder / "link.png").symlink_to(tmp_path / "elsewhere.png")
    (folder / "text.png").write_text("root:x:0:0")
    names = ("own.png", "gone.png", "link.png", "text.png")
    html = html_page([*(Image(folder / name, name) for name in names), Image(tmp_path / "elsewhere.png", "up")], folder, title="t")
    assert [base64.b64decode(src.split(",", 1)[1]) for src in parse(html).images] == [PNG]
    assert all(f"[missing image {name}]" in html for name in ("gone.png", "link.png", "text.png", "elsewhere.png"))
    with pytest.raises(ValueError, match="expected a PNG the report named"):
        Image(Path("/etc/passwd"), "pw")


# -- the papers' table ------------------------------------------------------------------------------------------------------


def test_paper_table_bold_is_the_best_printed_mean_and_one_seed_reads_n_1(tmp_path):
    columns = {
        "A": [{"test_recall_at_1": 0.7201, "test_nmi": 0.50}, {"test_recall_at_1": 0.7205, "test_nmi": 0.52}],  # R@1 72.03
        "B": [{"test_recall_at_1": 0.7204, "test_nmi": 0.60}],  # one seed, R@1 72.04
        "C": [{"test_recall_at_1": 0.6000, "test_nmi": 0.40}, {"test_recall_at_1": 0.6200, "test_nmi": 0.40}],
    }
    blocks = paper_table(columns)
    text = markdown(blocks)
    page = parse(html_page(blocks, tmp_path, title="t"))
    rows = {row[0]: row[1:] for row in page.cells[1:]}
    # by hand: R@1 means 72.03 (A), 72.04 (B), 61.0 (C); printed with one decimal A and B both read 72.0, so both are
    # bold: the bold marks every cell whose printed mean is the best printed mean
    assert rows["R@1"] == ["72.0 ± 0.0", "72.0 (n = 1)", "61.0 ± 1.4"]
    assert set(page.strong) == {"72.0 ± 0.0", "72.0 (n = 1)", "60.0 (n = 1)"}
    assert rows["NMI"] == ["51.0 ± 1.4", "60.0 (n = 1)", "40.0 ± 0.0"]
    assert rows["MAP@R"] == ["-", "-", "-"]
    assert "± 0.0" not in rows["NMI"][1] and "the best mean of each row in bold" in text
    assert "1/2 seed(s); n = 1 marks a single seed" in text
    # every row with a value has its best in bold: the caption's claim holds
    for label, cells in rows.items():
        if label in ("NMI", "R@1"):
            best = max(float(c.split()[0]) for c in cells)
            assert [float(c.split()[0]) == best for c in cells] == [c in page.strong for c in cells], label


def test_paper_table_with_one_column_claims_no_bold():
    text = markdown(paper_table({"only": [{"test_recall_at_1": 0.5}]}))
    assert "| R@1 | 50.0 (n = 1) |" in text and "**" not in text and "bold" not in text


# -- plots --------------------------------------------------------------------------------------------------------------


def test_curves_have_integer_epoch_ticks_and_the_marks():
    series = {"a": {1: 0.1, 2: 0.4, 3: 0.5}, "b": {1: 0.2, 2: 0.3}}
    fig = plots.curves_figure(series, ylabel="m", title="t", marks={"ASHA rung at epoch 1": 1.0, "heating starts": (2.25, 2.5)})
    ax = fig.axes[0]
    fig.canvas.draw() if hasattr(fig.canvas, "draw") else None
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks)
    vertical = [line for line in ax.lines if len(set(line.get_xdata())) == 1 and line.get_label() == "ASHA rung at epoch 1"]
    assert len(vertical) == 1 and vertical[0].get_xdata()[0] == 1.0
    spans = [p for p in ax.patches if p.get_label() == "heating starts"]
    assert len(spans) == 1
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= {"ASHA rung at epoch 1", "heating starts"}


def test_parallel_coordinates_draw_each_trial_on_its_own_parameters():
    rows = [
        {"loss": "softmax", "alpha": 4.0, "lr": 1e-3},
        {"loss": "ice", "ice_scale": 32.0, "lr": 1e-2},
        {"loss": "softmax", "alpha": 16.0, "lr": 1e-4},
    ]
    fig = plots.parallel_coordinates_figure(
        rows, [0.9, 0.8, 0.7], metric="val_recall_at_1", log_params={"lr"}, choices={"loss": ["softmax", "ice"]}
    )
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_xticklabels()]
    assert sorted(names) == ["alpha", "ice_scale", "loss", "lr"]
    trial_lines = [line for line in ax.lines if line.get_marker() == "o"]
    assert sorted(len(line.get_xdata()) for line in trial_lines) == [3, 3, 3]  # each trial on the 3 axes it had
    texts = [t.get_text() for t in ax.texts]
    assert "None" not in texts and "nan" not in texts
    assert {"softmax", "ice", "0.0001", "0.01"} <= set(texts)  # category names; a log axis labelled at its ends
    ice = next(line for line in trial_lines if names.index("ice_scale") in line.get_xdata())
    assert names.index("alpha") not in ice.get_xdata()


def test_axis_scale_by_hand():
    place, ticks = plots.axis_scale([1e-4, 1e-3, 1e-2], log=True)
    assert [round(place(v), 9) for v in (1e-4, 1e-3, 1e-2)] == [0.0, 0.5, 1.0]  # log10: -4, -3, -2 over a span of 2
    assert ticks == [(0.0, "0.0001"), (0.5, "0.001"), (1.0, "0.01")]
    place, ticks = plots.axis_scale([2, 6, 4])
    assert place(5) == 0.75 and [label for _, label in ticks] == ["2", "4", "6"]
    place, ticks = plots.axis_scale(["ice"], choices=["softmax", "ice", "arcface"])
    assert place("ice") == 0.5 and ticks == [(0.5, "ice")]  # only the choices seen; one sits in the middle
    place, ticks = plots.axis_scale(["l2", "bn", "l2"])
    assert (place("l2"), place("bn")) == (0.0, 1.0) and [label for _, label in ticks] == ["l2", "bn"]


def test_retrieval_examples_by_hand():
    # 2-D embeddings; cosine similarity orders neighbours by angle
    x = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [1.0, 0.5], [-1.0, 0.0]])
    labels = np.array([0, 0, 1, 1, 2])
    queries, neighbours = plots.retrieval_examples(x, labels, queries=3, k=2, seed=0)
    assert sorted(labels[queries].tolist()) == [0, 1, 2]  # one query per class
    by_hand = {0: [1, 3], 1: [0, 3], 2: [3, 1], 3: [1, 2], 4: [2, 3]}  # the query itself never returned
    for q, row in zip(queries, neighbours):
        assert row.tolist() == by_hand[int(q)], q
    gallery = np.array([[0.0, -1.0], [1.0, 0.0]])
    _, in_gallery = plots.retrieval_examples(x, labels, queries=3, k=1, seed=0, gallery_embeddings=gallery)
    assert set(in_gallery.ravel().tolist()) <= {0, 1}


def test_retrieval_grid_and_tsne_map_write_pngs(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (12, 12), dtype=np.uint8) for _ in range(3)]
    correct = np.array([[True, False], [False, False], [True, True]])
    grid = plots.retrieval_grid(images, [images[:2]] * 3, correct, tmp_path / "grid.png")
    labels = np.repeat(np.arange(6), 5)
    embeddings = rng.normal(size=(30, 8)) + 4 * np.eye(8)[labels]
    tsne = plots.tsne_map(embeddings, labels, tmp_path / "tsne.png", classes=4)
    for path in (grid, tsne):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_grid_mosaic_places_each_image_in_its_slot_inside_a_frame_of_its_kind():
    # worked out by hand for cells of 10 px: slots of 10 + 2 * 4 px, 6 px apart (a step of 24 px)
    rng = np.random.default_rng(1)
    queries = [rng.integers(0, 256, (10, 10), dtype=np.uint8) for _ in range(2)]
    neighbours = [[queries[1], queries[0]], [queries[0]]]  # the second row has one neighbour: its last slot is empty
    correct = np.array([[True, False], [False, False]])
    mosaic = plots.grid_mosaic(queries, neighbours, correct, cell=10)
    assert mosaic.shape == (2 * 24 - 6, 3 * 24 - 6, 3) and mosaic.dtype == np.uint8
    black, green, red, white = (0, 0, 0), (44, 160, 44), (255, 0, 0), (255, 255, 255)
    # the query: 1 px of black above its image, white beyond
    assert tuple(mosaic[3, 9]) == black and tuple(mosaic[2, 9]) == white
    # a right match (row 0, slot 1 at x 28): 2 px of green; a wrong one (slot 2 at x 52): 4 px of red, from the slot's edge
    assert [tuple(mosaic[y, 33]) for y in (1, 2, 3)] == [white, green, green]
    assert [tuple(mosaic[y, 57]) for y in (0, 1, 2, 3)] == [red] * 4
    assert tuple(mosaic[24 + 4 + 5, 24 + 1]) == red  # row 1's wrong match: its frame's left side
    # each image where it belongs, its grey level in all three channels
    assert np.array_equal(mosaic[4:14, 4:14], np.repeat(queries[0][..., None], 3, axis=2))
    assert np.array_equal(mosaic[4:14, 28:38, 1], queries[1]) and np.array_equal(mosaic[28:38, 28:38, 0], queries[0])
    assert (mosaic[24:42, 48:66] == 255).all()


def test_fitted_scales_an_image_to_its_cell_keeping_its_aspect_centred_on_white():
    wide = np.full((5, 10), 7, dtype=np.uint8)  # fits as it is: 2 white rows above, 3 below
    out = plots.fitted(wide, 10)
    assert out.shape == (10, 10, 3) and (out[2:7] == 7).all() and (out[:2] == 255).all() and (out[7:] == 255).all()
    tall = np.zeros((20, 10, 3), dtype=np.uint8)  # halved to 10 x 5: columns 2 to 6
    out = plots.fitted(tall, 10)
    assert (out[:, 2:7] == 0).all() and (out[:, :2] == 255).all() and (out[:, 7:] == 255).all()


# -- marks of the learning curves --------------------------------------------------------------------------------------------


def _trial(run_id: str, **params):
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, run_name=run_id), data=SimpleNamespace(params=params, tags={}))


def test_curve_marks_of_stock_asha_and_of_budget_rungs():
    asha = StudyRecord.from_params(recorded_params(epochs=9, grace_period=1, reduction_factor=3, scheduler=None, budgets=None))
    heated = _trial("a", loss="softmax", heating="two_stage", heating_start="0.75")
    plain = _trial("b", loss="ice", heating="two_stage", heating_start="0.5")  # ICE does not heat
    assert curve_marks(None, asha, [heated, plain]) == {"ASHA rung at epoch 1": 1.0, "ASHA rung at epoch 3": 3.0, "heating starts": 6.75}

    # budgets 2, 4: trial a promoted (budget 4 resumed after its epoch 1: its epoch 2 retrained, steps 3-4 budget 4's),
    # trial b stopped at budget 2
    logged = {("a", "budget"): [2, 2, 4, 4], ("b", "budget"): [2, 2]}

    class Client:
        def get_metric_history(self, run_id, key):
            return [SimpleNamespace(step=i + 1, value=v, timestamp=i) for i, v in enumerate(logged.get((run_id, key), []))]

    ladder = StudyRecord.from_params(recorded_params(epochs=4, grace_period=2, reduction_factor=2, scheduler="budget"))
    b = _trial("b", loss="softmax", heating="none", heating_start="0.75")
    # budget 2 ends at step 2 in both; a's budget 4 heats from its epoch 3.0 (0.75 x 4), the step (was 4.0: epochs trained)
    assert curve_marks(Client(), ladder, [heated, b]) == {"budget 2 ends": 2, "heating starts": 3.0}


# -- a grid report from hand-written records -----------------------------------------------------------------------------------


def write_grid(tmp_path: Path, seeds: dict[str, list[int]]) -> tuple[str, dict[tuple[str, int, str], bytes]]:
    """A grid of final runs "g" as study.final --space leaves it in MLflow, each seed run with a retrieval grid and a t-SNE map.

    The first configuration leads R@1 by 5 points; returns the tracking URI and {(configuration, seed, picture): bytes}.
    """
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("final", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(experiment, run_name="g", tags={"study_name": "g", "kind": "final_grid", "space": "g.yaml"}).info.run_id
    client.set_terminated(parent, "FINISHED")
    pictures = {}
    for number, (conf, seed_list) in enumerate(seeds.items()):
        for seed in seed_list:
            tags = {"mlflow.parentRunId": parent, "kind": "final_seed", "configuration": conf, "seed": str(seed)}
            run = client.create_run(experiment, run_name=f"run-{number}-{seed}", tags=tags).info.run_id
            client.log_param(run, "epochs", "2")
            client.log_metric(run, "time/total_s" if number == 0 else "time_total_s", 100.0 + 2 * seed)  # the old name too
            client.log_metric(run, "test_recall_at_1", 0.7 + 0.01 * seed + (0.05 if number == 0 else 0))
            for step in (1, 2):
                client.log_metric(run, "train_loss", 1.0 / step, step=step)
            for name in (f"retrieval_grid_seed{seed}.png", f"tsne_seed{seed}.png"):
                file = tmp_path / "logged" / run / name
                file.parent.mkdir(parents=True, exist_ok=True)
                data = PNG + f"{conf} {name}".encode()
                file.write_bytes(data)
                client.log_artifact(run, str(file))
                pictures[(conf, seed, name.split("_seed")[0])] = data
            client.set_terminated(run, "FINISHED")
    return uri, pictures


def test_grid_report_html_embeds_the_final_runs_pictures(tmp_path, runs):
    uri, pictures = write_grid(tmp_path, {"PCA": [0], "FCR1": [0, 1]})
    out = tmp_path / "report"
    assert report.main(["--study", "g", "--tracking-uri", uri, "--out", str(out), "--no-log"]) == 0
    html = (out / "report.html").read_text()
    page = parse(html)
    embedded = [base64.b64decode(src.split(",", 1)[1]) for src in page.images if src.startswith("data:image/png;base64,")]
    assert len(embedded) == len(page.images)  # every image embedded
    # each configuration's first seed: its retrieval grid and t-SNE map, the very bytes study.final logged
    for conf in ("PCA", "FCR1"):
        for kind in ("retrieval_grid", "tsne"):
            assert pictures[(conf, 0, kind)] in embedded, (conf, kind)
    assert pictures[("FCR1", 1, "tsne")] not in embedded
    header = next(row for row in page.cells if row[0] == "metric (%)")
    r1 = next(row for row in page.cells if row[0] == "R@1")
    assert dict(zip(header[1:], r1[1:])) == {"PCA": "75.0 (n = 1)", "FCR1": "70.5 ± 0.7"}
    assert page.strong == ["75.0 (n = 1)"]
    times = {row[0]: row[-1] for row in page.cells if len(row) == 6 and row[0] in ("PCA", "FCR1")}
    assert times == {"PCA": "100 s", "FCR1": "101 s"}  # per seed: 100; (100 + 102) / 2
    md = (out / "report.md").read_text()
    assert re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md) and all(Path(out / n).is_file() for n in re.findall(r"\]\(([^)]+\.png)\)", md))


# -- what MLflow holds is text: never markup, never a picture ---------------------------------------------------------------


def hostile(tmp_path: Path) -> tuple[Path, list[str]]:
    """A file outside the report, and names a user may give a variant or a param: an image of that file, a pipe, a script.

    The file is a PNG: where it lies, not what it holds, must keep it out of the report.
    """
    secret = tmp_path / "secret.png"
    secret.write_bytes(PNG + b" the secret")
    return secret, [f"![pw]({secret})", "a|b", "<script>alert(1)</script>"]


def md_tables(text: str) -> list[list[list[str]]]:
    """report.md's tables as rows of cells, split at the pipes that are not escaped, escapes undone; |---| rows left out."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|"):
            assert re.search(r"(?<!\\)\|$", line), line  # a row ends with a pipe of its own
            cells = [re.sub(r"\\(.)", r"\1", c.strip()) for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not previous.startswith("|"):
                tables.append([])
            if not all(re.fullmatch(r"-+", c) for c in cells):
                tables[-1].append(cells)
        previous = line
    return tables


def assert_text_not_markup(out: Path, secret: Path) -> tuple[Page, list[list[list[str]]]]:
    """report.html embeds PNGs the report wrote into ``out`` and no other file; report.md's tables keep their shape."""
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    page = parse(html)
    written = {p.read_bytes() for p in out.glob("*.png")}
    embedded = [base64.b64decode(src.split(",", 1)[1]) for src in page.images]
    assert embedded and [data in written for data in embedded] == [True] * len(embedded)
    assert base64.b64encode(secret.read_bytes()).decode() not in html
    assert "<script" not in html and html_escape("<script>alert(1)</script>") in html
    assert all((out / name).is_file() for name in re.findall(r"!\[[^\]]*\]\(([^)]*)\)", md))  # its only images: its own
    assert "<script>" not in md
    tables = md_tables(md)
    for table in tables:
        assert [len(row) for row in table] == [len(table[0])] * len(table), table
    return page, tables


def test_grid_names_are_text_and_only_the_reports_pictures_are_embedded(tmp_path, runs):
    """Issue 33: a variant named ![pw](/etc/passwd) put that file, base64-encoded, into report.html (and MLflow)."""
    secret, names = hostile(tmp_path)
    names.append("a_b")  # "a|b" and "a_b": two configurations, two sets of pictures
    uri, pictures = write_grid(tmp_path, {name: [0] for name in names})
    out = tmp_path / "report"
    assert report.main(["--study", "g", "--tracking-uri", uri, "--out", str(out), "--no-log"]) == 0
    page, tables = assert_text_not_markup(out, secret)
    embedded = [base64.b64decode(src.split(",", 1)[1]) for src in page.images]
    assert len(embedded) == 1 + len(pictures) and set(pictures.values()) <= set(embedded)  # the training loss, and each picture
    for rows in ([row for table in tables for row in table], page.cells):  # report.md, then report.html: the names as given
        assert next(row for row in rows if row and row[0] == "metric (%)")[1:] == names
        assert [row[0] for row in rows if len(row) == 6 and row[0] != "configuration"] == names  # pair similarities


def test_study_params_are_text_and_only_the_reports_pictures_are_embedded(tmp_path, runs):
    """The same for a study: trials' param values in the top-trials table, the parent run's params in the header."""
    secret, names = hostile(tmp_path)
    notes = dict(zip(("trial_0", "trial_1", "trial_2", "trial_3"), [*names, "two\nlines"]))
    storage = f"journal:{tmp_path / 'optuna.log'}"
    uri = write_study_records(tmp_path, storage, parent_params={"space": names[0], "sampler": names[2]}, notes=notes)
    out = tmp_path / "report"
    assert report.main(["--study", "hand", "--tracking-uri", uri, "--out", str(out), "--no-log"]) == 0
    page, tables = assert_text_not_markup(out, secret)
    shown = {key: " ".join(value.split()) for key, value in notes.items()}  # a newline would end the table's row
    for rows in (next(t for t in tables if "note" in t[0]), page.cells):  # report.md, then report.html
        header = next(row for row in rows if "note" in row)
        at = header.index("note")
        assert {row[0]: " ".join(row[at].split()) for row in rows if row[0] in notes} == shown
    html = (out / "report.html").read_text()
    assert f"<code>{html_escape(names[0])}</code>" in html  # the space, in the header


@pytest.mark.parametrize("with_storage", [True, False])
def test_study_report_parallel_coordinates_only_where_active(tmp_path, runs, with_storage):
    """A conditional parameter (ice_scale only with loss=ice): in Optuna only where sampled; from MLflow, "None" is absent."""
    import optuna

    from study.search.journal import open_storage

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("dml-studies", artifact_location=(tmp_path / "artifacts").as_uri())
    storage = f"journal:{tmp_path / 'optuna.log'}"
    parent = client.create_run(experiment, run_name="c", tags={"study_name": "c", "kind": "study"}).info.run_id
    params = recorded_params(epochs=2, grace_period=1, reduction_factor=2, optuna_storage=storage, scheduler=None, budgets=None)
    client.log_batch(parent, params=[mlflow.entities.Param(k, v) for k, v in params.items()])
    client.set_terminated(parent, "FINISHED")
    study = optuna.create_study(study_name="c", direction="maximize", storage=open_storage(storage))
    seen_rows = []
    for i, (loss, scale, value) in enumerate([("ice", 16.0, 0.9), ("softmax", None, 0.8), ("ice", 64.0, 0.85)]):
        dists = {"loss": optuna.distributions.CategoricalDistribution(["softmax", "ice"])}
        values = {"loss": loss}
        if scale is not None:
            dists["ice_scale"] = optuna.distributions.FloatDistribution(8, 128, log=True)
            values["ice_scale"] = scale
        study.add_trial(optuna.trial.create_trial(params=values, distributions=dists, value=value))
        tags = {"mlflow.parentRunId": parent, "kind": "trial", "trial_id": f"t{i}", "optuna_state": "COMPLETE"}
        run = client.create_run(experiment, run_name=f"t{i}", tags=tags).info.run_id
        client.log_param(run, "loss", loss)
        client.log_param(run, "ice_scale", "None" if scale is None else scale)
        for step in (1, 2):
            client.log_metric(run, "val_recall_at_1", value - 0.1 * (2 - step), step=step)  # ends at value
        client.set_terminated(run, "FINISHED")
        seen_rows.append(values)
    if not with_storage:
        (tmp_path / "optuna.log").unlink()
    captured = {}
    real = plots.family_parallel_coordinates

    def spy(groups, path, **kwargs):
        captured.update(groups)
        return real(groups, path, **kwargs)

    plots.family_parallel_coordinates = spy  # the module study.report and study.records.artifacts draw with
    try:
        assert report.main(["--study", "c", "--tracking-uri", uri, "--out", str(tmp_path / "out"), "--no-log"]) == 0
    finally:
        plots.family_parallel_coordinates = real
    # a panel per loss family on the parameters that vary within it: ICE's two trials on ice_scale; the one softmax
    # trial has nothing to compare, and no axis is the loss (one value per panel)
    assert list(captured) == ["loss ice"]
    rows, values = captured["loss ice"]
    assert all(set(row) == {"ice_scale"} for row in rows)
    assert sorted(zip((row["ice_scale"] for row in rows), values)) == [(16.0, pytest.approx(0.9)), (64.0, pytest.approx(0.85))]
    assert seen_rows[1] == {"loss": "softmax"}
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Parallel coordinates" in html and (tmp_path / "out" / "parallel_coordinate.png").is_file()


@pytest.mark.parametrize(
    "params, phrase",
    [
        (
            {"scheduler": "budget", "budgets": "4 16", "stratify_by": "loss", "grace_period": "4", "reduction_factor": "4"},
            "budget-aware successive halving at budgets 4 (each a finished schedule, within each loss)",
        ),
        ({"scheduler": "asha", "grace_period": "1", "reduction_factor": "3"}, "stock ASHA at epochs 1, 3 of the full schedule"),
        ({"grace_period": "1", "reduction_factor": "3"}, "stock ASHA at epochs 1, 3 of the full schedule"),  # recorded before --scheduler
        ({"scheduler": "fifo", "budgets": "9", "stratify_by": "none"}, "no early stopping"),
    ],
)
def test_study_header_names_the_scheduler_the_study_ran(params, phrase):
    recorded = {
        "scheduler": None,
        "budgets": None,
        "epochs": "9" if "budgets" not in params or params["budgets"] == "9" else "16",
        **params,
    }
    parent = SimpleNamespace(
        data=SimpleNamespace(params=recorded_params(**recorded), tags={"study_name": "s"}, metrics={}),
        info=SimpleNamespace(status="FINISHED"),
    )
    header = markdown(study_header(parent, StudyRecord.from_params(parent.data.params)))
    assert phrase in header and ("ASHA" in phrase) == ("ASHA" in header)


def test_the_pick_section_names_the_confirmation_means_and_the_verdict():
    record = {
        "ranking": [
            {"trial": 5, "scores": [0.9759, 0.9741], "mean": 0.975, "sem": 0.0009},
            {"trial": 6, "scores": [0.9796, 0.9592], "mean": 0.9694, "sem": 0.0102},  # sem of 2 = |a - b| / 2
        ],
        "lead": 0.0056,
        "lead_in_se": 0.5,
        "verdict": "within noise: the lead is 0.5 standard errors; the top candidates are equally good",
    }
    text = markdown(pick_section(record, {5: "trial-5-aa", 6: "trial-6-bb"}))
    lines = text.splitlines()
    assert "| trial-5-aa | 0.9750 ± 0.0009 | 0.9759, 0.9741 |" in lines
    assert "| trial-6-bb | 0.9694 ± 0.0102 | 0.9796, 0.9592 |" in lines
    assert "picked: trial-5-aa" in text and "within noise: the lead is 0.5 standard errors" in text
    # trial-6 had the best single score (0.9796) but not the best mean: the section says why it is not the pick
    assert "best mean" in text
    assert pick_section(None, {}) == []  # a grid, or --confirm-budget 0: nothing raced


def test_the_report_links_the_studys_runs_in_mlflow_without_the_servers_password(tmp_path):
    """report.md and report.html link the page the study's closing lines print (its runs, the pick first); a server's
    login stays out of the link, and a local store's link says what serves it."""
    from study.report.finals import mlflow_link

    url = "http://mlflow.example:5000/#/experiments/7/runs?viewStateShareKey=s1&workflowType=machine_learning"
    served = mlflow_link("http://alice:s3cret@mlflow.example:5000", "7", "s1")
    text, page = markdown([served]), html_page([served], tmp_path, "t")
    assert f"(<{url}>)" in text and f'<a href="{html_escape(url, quote=True)}">' in page
    assert "s3cret" not in text + page and "alice" not in text + page
    local = markdown([mlflow_link(f"sqlite:///{tmp_path}/mlflow.db", "7", "s1")])
    assert "(<http://127.0.0.1:5000/#/experiments/7/runs?viewStateShareKey=s1&workflowType=machine_learning>)" in local
    assert f"ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db" in local  # served by mlflow ui on the store
