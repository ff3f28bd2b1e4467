"""The report's figures keep their rules, measured with matplotlib's own extents: no text overlaps another, no legend
sits on an axes' data area, every label (tick label, legend entry, annotation) is at most 40 characters a line.

The reports come from one small SQLite MLflow store, logged in nplm-train's schema (test_report.log_run): brown_sampled
(MLP5 and MLP9 each trained exactly and sampled, MLP5 sampled at another rate too: labels of 60 to 80 characters in
optim.* and trainer.* keys), brown_direct (MLP5 with and without direct connections, two seeds each: both kinds of
claims), brown_recipe (four of MLP5's five steps beside brown_table1's fast MLP5). Their runs keep no scores: the
intervals come from scores made up for each row (helpers.evidence_of, seeded), as the claims' tests make them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from helpers import ROOT, evidence_of
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from test_report import T0, log_run, recipe_job

from nplm_repro.paper import COLUMNS
from nplm_repro.reporting import figures as drawn
from nplm_repro.reporting.claims import check_claims
from nplm_repro.reporting.drawing import LEGEND, LIMIT, fit_labels, save
from nplm_repro.reporting.headlines import recipe_figure, sampled_figure, sampled_pairs
from nplm_repro.reporting.render import write
from nplm_repro.reporting.tables import Learned, Report, best_epochs, build, with_intervals
from nplm_repro.studies import declaration

# --- the rules, as a checker -------------------------------------------------------------------------------------


def _ticks_drawn(axis: Axis) -> tuple[list[Text], list[Text]]:
    """The tick labels an axis draws, and those it keeps but does not draw (ticks beyond the view, spare ticks
    matplotlib keeps for later), whose extents are stale."""
    drawn_labels, spare = [], []
    lo, hi = sorted(axis.get_view_interval())
    slack = (hi - lo) * 1e-9
    for ticks, locs in ((axis.majorTicks, axis.get_majorticklocs()), (axis.minorTicks, axis.get_minorticklocs())):
        for i, tick in enumerate(ticks):
            shown = i < len(locs) and lo - slack <= locs[i] <= hi + slack
            (drawn_labels if shown else spare).extend(
                label for label in (tick.label1, tick.label2) if label.get_visible()
            )
    return drawn_labels, spare


def _shown(text: Text) -> bool:
    return text.get_visible() and bool(text.get_text().strip())


def _name(text: Text) -> str:
    words = text.get_text().replace("\n", " ")
    return repr(words if len(words) <= 60 else words[:57] + "...")


def _overlap(a: Bbox, b: Bbox, tolerance: float) -> tuple[float, float] | None:
    """How far two boxes overlap (width, height, in pixels), or None when they only touch (within `tolerance`)."""
    width, height = min(a.x1, b.x1) - max(a.x0, b.x0), min(a.y1, b.y1) - max(a.y0, b.y0)
    return (width, height) if width > tolerance and height > tolerance else None


def broken_rules(figure: Figure, limit: int = LIMIT, tolerance: float = 1.0) -> list[str]:
    """What a figure does against the rules, one line each (none: it keeps them): texts that overlap (touching is
    allowed), a legend over text outside it or over an axes' data area, a label line longer than `limit`."""
    if not isinstance(figure.canvas, FigureCanvasAgg):
        FigureCanvasAgg(figure)
    figure.canvas.draw()  # lays the figure out as it is saved
    renderer = figure.canvas.get_renderer()
    labels, spare = [], set()
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            shown, kept = _ticks_drawn(axis)
            labels += shown
            spare |= {id(t) for t in kept}
        labels += [t for t in ax.texts if _shown(t)]
    legends = figure.findobj(Legend)
    for legend in legends:
        labels += [t for t in (*legend.get_texts(), legend.get_title()) if _shown(t)]
    texts = [t for t in figure.findobj(Text) if _shown(t) and id(t) not in spare]
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    found = []
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1 :]:
            if (by := _overlap(box_a, box_b, tolerance)) is not None:
                found.append(f"text {_name(a)} overlaps text {_name(b)} ({by[0]:.0f} x {by[1]:.0f} px)")
    for legend in legends:
        box, own = legend.get_window_extent(renderer), {id(t) for t in legend.findobj(Text)}
        for number, ax in enumerate(figure.axes, 1):
            if _overlap(box, ax.get_window_extent(renderer), tolerance) is not None:
                found.append(f"legend {_name(legend.get_texts()[0])}... sits on the data area of axes {number}")
        for text, text_box in boxes:
            if id(text) not in own and _overlap(box, text_box, tolerance) is not None:
                found.append(f"legend {_name(legend.get_texts()[0])}... overlaps text {_name(text)}")
    for label in labels:
        for line in label.get_text().splitlines():
            if len(line) > limit:
                found.append(f"label {line!r} is {len(line)} characters, more than {limit}")
    return found


def _text_figure(*texts: tuple[float, float, str], legend_at: str = "") -> Figure:
    figure = Figure(figsize=(4, 3), dpi=100)
    ax = figure.add_subplot()
    ax.plot([0, 1], [0, 1], label="data")
    for x, y, words in texts:
        ax.text(x, y, words)
    if legend_at:
        ax.legend(loc=legend_at)
    return figure


def test_the_checker_catches_what_breaks_the_rules() -> None:
    """It can fail: two texts drawn at one place, a legend on the data, a long label; and passes texts apart."""
    assert broken_rules(_text_figure((0.1, 0.2, "MLP5"), (0.1, 0.8, "MLP9"))) == []
    same = broken_rules(_text_figure((0.1, 0.5, "MLP5"), (0.1, 0.5, "MLP9")))
    assert len(same) == 1 and same[0].startswith("text 'MLP5' overlaps text 'MLP9' (")
    shifted = broken_rules(_text_figure((0.1, 0.5, "MLP5 sampled"), (0.2, 0.51, "MLP9")))  # partly over it
    assert len(shifted) == 1 and "overlaps text 'MLP9'" in shifted[0]
    assert broken_rules(_text_figure(legend_at="upper left")) == ["legend 'data'... sits on the data area of axes 1"]
    beside = _text_figure()
    beside.axes[0].legend(**LEGEND)
    assert broken_rules(beside) == []
    beside.axes[0].text(1.05, 0.98, "note", transform=beside.axes[0].transAxes, va="top")  # where the legend is
    over = broken_rules(beside)
    assert over[-1] == "legend 'data'... overlaps text 'note'" and over[0].startswith(
        "text 'note' overlaps text 'data'"
    )
    long = broken_rules(_text_figure((0.1, 0.5, "x" * 41), (0.1, 0.2, "x" * 40 + "\n" + "y" * 40)))
    assert long == [f"label {'x' * 41!r} is 41 characters, more than 40"]


def test_labels_fit_in_40_characters_and_stay_apart() -> None:
    exact = "MLP7 trainer.limit_val_batches=None trainer.precision=bf16-mixed"
    sampled = (
        "MLP7 optim.estimator=importance optim.output=sampled optim.proposal=bigram optim.samples=500 "
        "trainer.limit_val_batches=0.25 trainer.precision=32-true"
    )
    labels = [exact, sampled, exact.replace("MLP7", "MLP9"), sampled.replace("MLP7", "MLP9")]
    fitted = fit_labels(labels)
    assert fitted == ["MLP7", "MLP7 est=importance out=sampled", "MLP9", "MLP9 est=importance out=sampled"]
    assert fit_labels(labels) == fitted  # the same labels, the same result
    assert fit_labels(["MLP7 h=50", "MLP9 h=100"]) == ["MLP7 h=50", "MLP9 h=100"]  # short labels are left alone
    pairs = ["class-based back-off n=3 c=500 / class-based back-off n=4 c=500", "Kneser-Ney back-off n=3 / MLP5"]
    assert fit_labels(pairs) == ["class-based back-off n=3 c=500 / n=4", "Kneser-Ney back-off n=3 / MLP5"]  # n=3 kept
    pairs.append("Kneser-Ney back-off n=3 / Kneser-Ney back-off n=4 c=1000 m=60 h=100")
    assert fit_labels(pairs) == ["class-based n=3 c=500 / n=4", "KN n=3 / MLP5", "KN n=3 / n=4 c=1000 m=60 h=100"]
    same_start = [f"{'a very long row name that says nothing ' * 2}{i}" for i in range(3)]
    assert fit_labels(same_start) == [f"a very long row name that…ays nothing {i}" for i in range(3)]
    same_end = [f"{i} {'a very long row name that says nothing ' * 2}" for i in range(3)]
    assert fit_labels(same_end) == [f"{i} a very long row name that says nothin…" for i in range(3)]


# --- a fixed store ---------------------------------------------------------------------------------------------

EXACT, SAMPLED = ("optim=fast", "trainer.precision=bf16-mixed"), ("optim=sampled", "trainer.precision=32-true")
PAIRS = {"mlp5": (245.5, 247.8, 40.0), "mlp9": (239.7, 240.3, 27.0)}  # test exact, test sampled, exact minutes
DIRECT = {  # brown_direct's first pair: (overrides, test perplexity, each seed's validation curve)
    "MLP5": (("experiment=mlp5",), 265.0, ((300, 280, 270, 272), (301, 279, 271, 273))),
    "direct=no": (("experiment=mlp5", "model.direct=false"), 262.0, ((310, 290, 281, 276, 277), (309, 288, 279, 275))),
}
RECIPE = {  # job: (train, valid, test), validation per epoch; mlp5_drop not run: rate x5 is then fast's step before
    "mlp5_paper": ((200, 300, 285), (340, 320, 305, 300, 301)),
    "mlp5_batch256": ((210, 310, 295), (350, 310, 311)),
    "mlp5_rate5x": ((180, 270, 250), (300, 270, 272)),
    "mlp5_fast": ((183, 266, 245), (291, 266, 267)),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    return make_store(tmp_path_factory.mktemp("figures"))


def make_store(workdir: Path) -> tuple[str, dict[str, str]]:
    """The store's URI and the seed of each run (for the claims' epochs). brown_sampled: MLP5 and MLP9 each trained
    exactly in bf16 and sampled in float32, and MLP5 sampled at another rate (its labels: 60 to 90 characters);
    brown_direct: MLP5 and MLP5 without direct connections, two seeds each; brown_recipe: four of MLP5's five steps
    beside brown_table1's fast MLP5."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    client = MlflowClient(uri)
    brown = client.create_experiment("brown", artifact_location=str(workdir / "mlruns"))
    seeds, start = {}, iter(range(100))

    def log(overrides: tuple[str, ...], ppl: tuple, epochs: tuple = (), **tags: str) -> str:
        run_id = log_run(client, brown, overrides, next(start), ppl=ppl, epochs=epochs, **tags)
        seeds[run_id] = client.get_run(run_id).data.params["seed"]
        return run_id

    sampled = [(row, SAMPLED, test, minutes / 6) for row, (_, test, minutes) in PAIRS.items()]
    exact = [(row, EXACT, test, minutes) for row, (test, _, minutes) in PAIRS.items()]
    for row, how, test, minutes in [*exact, *sampled, ("mlp5", (*SAMPLED, "optim.lr=0.002"), 251.0, 7.0)]:
        curve = (test + 80, test + 45, test + 25, test + 24)
        run_id = log((f"experiment={row}", *how), (200, test + 20, test), curve, study="brown_sampled")
        client.log_metric(run_id, "fit_seconds", minutes * 60)
    for overrides, test, curves in DIRECT.values():
        for seed, curve in enumerate(curves, 1):
            log((*overrides, f"seed={seed}"), (200, min(curve), test + seed / 2), curve, study="brown_direct")
    log(("experiment=mlp5",), (180, 266, 246))  # brown_table1's fast MLP5
    for name, (ppl, epochs) in RECIPE.items():
        log(recipe_job(name), ppl, epochs, study="brown_recipe")
    return uri, seeds


def with_scores(report: Report, seeds: dict[str, str]) -> Report:
    """The report as it is when every run kept its scores: intervals from scores made up to match each row."""
    evidence = evidence_of(report.table, noise=0.002, seed=1)
    table = with_intervals(report.table, evidence)
    claims = check_claims(report.spec.get("claims") or [], table, evidence, best_epochs(report.history, seeds))
    return dataclasses.replace(report, table=table, evidence=evidence, claims=claims)


@pytest.fixture(scope="module")
def reports(store: tuple[str, dict[str, str]]) -> dict[str, Report]:
    return make_reports(*store)


def make_reports(uri: str, seeds: dict[str, str]) -> dict[str, Report]:
    sampled = build(uri, "brown", "brown_sampled")
    return {
        "brown_sampled": with_scores(sampled, seeds),
        "brown_sampled, no scores": sampled,
        "brown_direct": with_scores(build(uri, "brown", "brown_direct"), seeds),
        "brown_recipe": build(uri, "brown", "brown_recipe"),
    }


DRAWN = {  # the figures each report has (file stems less the study); brown_sampled and brown_recipe declare no knobs
    "brown_sampled": {"sampled_pairs", "test", "valid_by_epoch"},
    "brown_sampled, no scores": {"sampled_pairs", "test", "valid_by_epoch"},
    "brown_direct": {"test", "valid_by_epoch", "claims", "claims_epochs", "direct"},
    "brown_recipe": {"recipe_steps", "test", "valid_by_epoch"},
}
KNOBS = {  # the knob figures the same rows give a study that declares no knobs (a free sweep's)
    "brown_sampled": {"optim.lr"},
    "brown_sampled, no scores": {"optim.lr"},
    "brown_direct": {"direct"},
    "brown_recipe": {"optim.batch_size", "optim.lr", "optim.recipe"},
}


@pytest.mark.parametrize("name", list(DRAWN))
def test_every_figure_of_a_report_keeps_the_rules(name: str, reports: dict[str, Report]) -> None:
    """The figures the study draws, and the knob figures its rows would give a free sweep (labels of 60 to 90
    characters in brown_sampled's optim.lr), each keeps every rule."""
    report = reports[name]
    found = drawn.figures(report)
    assert {stem.removeprefix(f"{report.study}_") for stem, _ in found} == DRAWN[name]
    every = [(knob, drawn.against_knob(report, knob)) for knob in (*COLUMNS, *report.extra)]
    knobs = [(knob, figure) for knob, figure in every if figure is not None]
    assert {knob for knob, _ in knobs} == KNOBS[name]
    for stem, figure in [*found, *knobs]:
        assert isinstance(figure, Figure)
        broken = broken_rules(figure)
        assert not broken, f"{stem}:\n" + "\n".join(broken)


def test_long_configurations_are_told_apart_in_40_characters(reports: dict[str, Report]) -> None:
    """brown_sampled's rows are 60 to 90 characters long (optim.lr, optim.output, trainer.limit_val_batches,
    trainer.precision; MLP9's without optim.lr, which only MLP5's configurations differ in): each figure still tells
    them apart, by the values that differ, shortened to 40 characters."""
    report = reports["brown_sampled"]
    assert max(len(label) for label in report.table["label"]) > 70
    (ax,) = drawn.rows_figure(report).axes
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks == [
        "MLP5 lr=0.002 out=sampled val=0.25", "MLP5 lr=0.005 out=exact val=None", "MLP5 lr=0.005 out=sampled val=0.25",
        "MLP9 out=exact val=None", "MLP9 out=sampled val=0.25",
    ]  # fmt: skip
    (ax,) = drawn.valid_by_epoch(report).axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"{t} (1)" for t in ticks]


def test_brown_sampled_draws_each_pairs_cost_and_speed_up(reports: dict[str, Report]) -> None:
    pairs = sampled_pairs(reports["brown_sampled"])
    assert [p.label.split()[0] for p in pairs] == ["MLP5", "MLP9"]  # MLP5 at another rate has no exact twin
    for pair, (exact, sampled, _) in zip(pairs, PAIRS.values()):
        assert pair.estimate == pytest.approx(sampled / exact - 1, abs=1e-9)
        assert pair.low < pair.estimate < pair.high and pair.verdict == "holds"
        assert pair.speedup == pytest.approx(6.0) and pair.in_fit
    cost, speed = sampled_figure(reports["brown_sampled"]).axes
    assert [t.get_text() for t in cost.get_yticklabels()] == [
        "MLP5 optim.lr=0.005",
        "MLP9",
    ]  # MLP5 is also run at another rate
    assert [t.get_text() for t in speed.texts] == ["6.0x", "6.0x"]
    assert [t.get_text() for t in speed.get_legend().get_texts()] == ["within ±2%: holds"]
    unscored = sampled_pairs(reports["brown_sampled, no scores"])
    assert [(p.low, p.verdict) for p in unscored] == [(None, None)] * 2  # a hollow point, said in the legend
    _, speed = sampled_figure(reports["brown_sampled, no scores"]).axes
    assert [t.get_text() for t in speed.get_legend().get_texts()] == ["no interval (no kept scores)"]


def test_brown_recipe_draws_its_steps_as_a_waterfall(reports: dict[str, Report]) -> None:
    (ax,) = recipe_figure(reports["brown_recipe"]).axes
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["0. paper", "1. batch 256", "2. rate x5", "3. drop on plateau\n(not run)", "4. no decay = fast"]
    bars = [(round(p.get_y(), 1), round(p.get_y() + p.get_height(), 1)) for p in ax.patches]
    floor = bars[0][0]
    assert bars == [(floor, 285.0), (285.0, 295.0), (295.0, 250.0), (250.0, 245.0)]  # fast against rate x5
    assert [t.get_text() for t in ax.texts] == ["285.0", "295.0\n+3.5%", "250.0\n-15.3%", "245.0\n-2.0%"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "the paper's MLP5: 279",
        "MLP5, optim=fast (brown_table1): 246",
    ]


def test_a_report_writes_each_figure_as_png_and_svg_and_its_html_holds_them(
    reports: dict[str, Report], tmp_path: Path
) -> None:
    """The features map (drawn when its run ended) is copied as PNG alone; the HTML page carries every figure."""
    png = next(Path(__file__).parent.glob("data/*.png"), None)
    map_png = png.read_bytes() if png else b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    learned = Learned("MLP5", "0" * 32, (), (), map_png)
    report = dataclasses.replace(reports["brown_direct"], learned=learned)
    files = {p.name for p in write(report, tmp_path)}
    pngs = {f for f in files if f.endswith(".png")}
    assert (
        "brown_direct_features_map.png" in pngs and (tmp_path / "brown_direct_features_map.png").read_bytes() == map_png
    )
    assert {f for f in files if f.endswith(".svg")} == {
        f.removesuffix(".png") + ".svg" for f in pngs - {"brown_direct_features_map.png"}
    }
    assert all((tmp_path / f).read_bytes().startswith(b"\x89PNG") for f in pngs)
    page = (tmp_path / "brown_direct.html").read_text()
    assert page.count("src='data:image/svg+xml;base64,") == len(pngs) - 1
    assert page.count("src='data:image/png;base64,") == 1
    assert not re.search(r"src='[^d]", page)  # no link to a file beside it
    save(drawn.rows_figure(report), tmp_path / "once.png")  # the same figure, the same bytes
    save(drawn.rows_figure(report), tmp_path / "twice.png")
    assert (tmp_path / "once.svg").read_bytes() == (tmp_path / "twice.svg").read_bytes()


def test_the_rows_figure_shows_each_seed_beside_the_mean_and_the_paper(reports: dict[str, Report]) -> None:
    """brown_direct's rows have two seeds each: a dot per seed at its own test perplexity, the mean filled."""
    report = reports["brown_direct"]
    (ax,) = drawn.rows_figure(report).axes
    seeds = sorted(tuple(sorted(line.get_xdata())) for line in ax.lines if line.get_marker() == "|")
    assert seeds == sorted(
        (test + 0.5, test + 1.0) for _, test, _ in DIRECT.values()
    )  # the seeds' test perplexities as logged
    dots = [line for line in ax.lines if line.get_marker() == "o"]
    means = sorted(line.get_xdata()[0] for line in dots if line.get_markerfacecolor() != "none")
    assert means == pytest.approx(sorted(test + 0.75 for _, test, _ in DIRECT.values()))
    assert [line.get_xdata()[0] for line in dots if line.get_markerfacecolor() == "none"] == [279]  # MLP5's
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "ours, MLP (mean over seeds)", "95% interval over texts", "one seed", "the paper's",
    ]  # fmt: skip


def test_every_committed_report_shows_only_figures_todays_code_draws() -> None:
    """What `figures.draw` writes, and only that, is in reports/: each figure a PNG with its SVG beside it (the features
    map, drawn when its run ended, a PNG alone), every image a page shows is there, no PNG is there that no page shows.
    A figure drawn by older code (a PNG alone) fails here: its report is rebuilt from its store, or loses it."""
    pages = [ROOT / "README.md", *sorted((ROOT / "reports").rglob("*.md"))]
    shown = set()
    for page in pages:
        for image in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            path = (page.parent / image).resolve()
            assert path.is_file(), f"{page.relative_to(ROOT)} shows {image}, which is not there"
            shown.add(path)
    pngs = {path.resolve() for path in (ROOT / "reports").rglob("*.png")}
    assert pngs - shown == set(), "figures no page shows: " + ", ".join(sorted(p.name for p in pngs - shown))
    alone = {p.name for p in pngs if not p.with_suffix(".svg").is_file() and not p.stem.endswith("_features_map")}
    assert alone == set(), f"PNGs without their SVG (drawn by older code): {', '.join(sorted(alone))}"


def test_the_compute_figure_puts_every_trained_row_on_one_cpu_time_axis(
    store: tuple[str, dict[str, str]],
) -> None:
    """brown_direct declaring the figure `compute`: every trained row's validation history against CPU minutes, a
    run's minutes its `fit_seconds_epoch` times its torch threads at each validation, in order."""
    uri, _ = store
    client = MlflowClient(uri)
    spec = {**declaration("brown_direct"), "figures": ["compute"]}
    report = build(uri, "brown", "brown_direct", spec=spec)
    run_id, minutes, valid = next(iter(report.timeline.values()))[0]
    assert len(minutes) == len(valid) > 1
    for step in range(len(valid)):
        client.log_metric(run_id, "fit_seconds_epoch", 60.0 + 90.0 * step, step=step)
    client.set_tag(run_id, "torch_threads", "2")
    report = build(uri, "brown", "brown_direct", spec=spec)
    timed = {r: (m, v) for seeds in report.timeline.values() for r, m, v in seeds}
    assert timed[run_id][0] == pytest.approx([2.0 + 3.0 * step for step in range(len(valid))])  # x 2 threads / 60
    assert set(report.timeline) == set(report.history)  # every trained row, no other
    (stem, figure), *_ = drawn.figures(report)
    assert stem == "brown_direct_compute" and not broken_rules(figure)
    # a row whose epochs validated on a part of the split (optim=sampled's first quarter) says so in the legend
    label = next(iter(report.timeline))
    row = report.table["label"] == label
    configs = report.table.loc[row, "config"].map(
        lambda c: json.dumps({**json.loads(c), "trainer.limit_val_batches": "0.25"})
    )
    report.table.loc[row, "config"] = configs
    (_, figure), *_ = drawn.figures(report)
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert sum(text.endswith("(valid: first 25%)") for text in legend) == 1


def test_an_adopted_runs_epochs_are_timed_from_the_start_of_the_run_that_trained_it(tmp_path: Path) -> None:
    """A run from before `fit_seconds_epoch` is timed by the wall clock from its start. Adopted by another study, its
    copy starts when it is adopted, after the epochs it copies: its points stay the trained run's, not negative."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    brown = client.create_experiment("brown", artifact_location=str(tmp_path / "mlruns"))
    trained = log_run(client, brown, ("experiment=mlp5",), 0, ppl=(180, 266, 246), study="brown_table1")
    start = client.get_run(trained).info.start_time
    curve = [Metric("valid_ppl_epoch", v, start + 60_000 * (step + 1), step) for step, v in enumerate((300, 280, 270))]
    client.log_batch(trained, metrics=curve)
    later = 3600 * 24  # a day later, in seconds
    adopted = log_run(
        client, brown, ("experiment=mlp5",), later, ppl=(180, 266, 246), study="brown_direct", adopted_from=trained
    )
    client.log_batch(adopted, metrics=curve)  # adopt() copies the history as it was logged
    report = build(uri, "brown", "brown_direct", spec={**declaration("brown_direct"), "figures": ["compute"]})
    ((run_id, minutes, valid),) = [seed for seeds in report.timeline.values() for seed in seeds]
    assert run_id == adopted and valid == [300, 280, 270]
    assert minutes == pytest.approx([1.0, 2.0, 3.0])  # from the trained run's start, one torch thread


def test_a_run_of_earlier_code_is_timed_by_the_seconds_it_logged_one_step_after_each_validation(
    tmp_path: Path,
) -> None:
    """Earlier code logged `fit_seconds_epoch` at `global_step`, one step after Lightning's step for the validation
    it goes with: such a run (resumed, so its wall clock would count the time it was down) is read there."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    brown = client.create_experiment("brown", artifact_location=str(tmp_path / "mlruns"))
    run_id = log_run(client, brown, ("experiment=mlp5",), 0, ppl=(180, 266, 246), study="brown_direct")
    down = 3600 * 1000  # an hour between its second and third validation
    valid = [
        Metric("valid_ppl_epoch", v, T0 + 60_000 * (i + 1) + down * (i == 2), 10 * i + 9)
        for i, v in enumerate((300, 280, 270))
    ]
    seconds = [Metric("fit_seconds_epoch", 60.0 * (i + 1), m.timestamp, m.step + 1) for i, m in enumerate(valid)]
    client.log_batch(run_id, metrics=valid + seconds)
    report = build(uri, "brown", "brown_direct", spec={**declaration("brown_direct"), "figures": ["compute"]})
    ((_, minutes, ppl),) = [seed for seeds in report.timeline.values() for seed in seeds]
    assert ppl == [300, 280, 270] and minutes == pytest.approx([1.0, 2.0, 3.0])
