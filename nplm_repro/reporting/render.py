"""The Report in files: markdown and HTML rendered from one outline (`outline`), the table alone in LaTeX, every
number in CSV, and the figures; nothing lands in the output directory unless every file was built."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nplm_repro.data.splits import SPLITS
from nplm_repro.paper import COLUMNS, PAPER_CORPORA, PAPER_DATA, PAPER_TABLES, PAPER_TITLES
from nplm_repro.reporting.figures import draw
from nplm_repro.reporting.runs import run_text, short_commit
from nplm_repro.reporting.tables import DIRTY_MARK, Report, attempts_table, display
from nplm_repro.scores import KEPT_SPLITS
from nplm_repro.storage.archive import SUFFIX, path_of
from nplm_repro.tracking.runs import present

DIRTY_NOTE = (
    f"Rows marked{DIRTY_MARK} average runs made from code with uncommitted changes (the package, conf/, sweeps/ or "
    "pyproject.toml; git commit +dirty): "
    "the commit alone does not give their code; runs that recorded the changes keep them as the artifact "
    "git_diff.patch. nplm-report --require-clean leaves such runs out."
)


# the CSV columns of the extra columns a study declares (its `reporting.columns`)
COLUMN_FIELDS = {
    "best_epoch": ("best_epoch", "best_epoch_std"),
    "improving": ("improving",),
    "seed_epochs": ("seed_epochs",),
    "stopped": ("stopped",),
    "test_range": ("test_ppl_min", "test_ppl_max"),
    "train_speed": ("train_speed", "train_speed_std"),
}


@dataclass(frozen=True)
class Item:
    """A point of a list: its text after an optional lead in bold, and the points under it."""

    text: str
    lead: str = ""
    under: tuple[str, ...] = ()


@dataclass(frozen=True)
class Section:
    """A part of the report in no format yet: its heading, then paragraphs, a list, a table, figures, a command."""

    title: str
    paragraphs: tuple[str, ...] = ()
    items: tuple[Item, ...] = ()
    table: pd.DataFrame | None = None
    figures: tuple[str, ...] = ()
    command: str = ""


def _title(report: Report) -> str:
    what = PAPER_TITLES.get(report.spec.get("paper", ""), f"study {report.study}")
    source = f", read from {report.source}" if report.source else ""
    return f"{report.study}: Bengio et al. (2003), {what}, our runs on corpus {report.corpus}{source}"


def _data_line(report: Report) -> str:
    count = {k: f"{int(v):,}" if v else "?" for k, v in report.data.items()}
    tokens = " / ".join(count[f"{s}_tokens"] for s in SPLITS)
    source = f" read from `{report.source}`" if report.source else ""
    line = (
        f"Data: corpus `{report.corpus}`{source} (MLflow experiment `{report.experiment}`), "
        f"fingerprint `{report.fingerprint}`, |V| = {count['vocab_size']}, train / valid / test tokens {tokens}"
    )
    paper_corpus = PAPER_TABLES.get(report.spec.get("paper", ""), report.corpus)
    if paper_corpus in PAPER_DATA:
        p = PAPER_DATA[paper_corpus]
        line += (
            f" (the paper's numbers are on {PAPER_CORPORA[paper_corpus]}: |V| = {p['vocab_size']:,}, "
            f"{' / '.join(f'{p[s]:,}' for s in SPLITS)})"
        )
    return line + "."


def _intro(report: Report) -> tuple[str, ...]:
    commits = [f"`{short_commit(c)}`" for c in report.commits]
    explain = (
        "Perplexities of every token of each split: ours (mean ± std over seeds when there are several; `seeds` "
        "counts them), the paper's, and the relative difference (ours - paper) / paper."
    )
    code = f"Code (git commits of the runs shown): {', '.join(commits) or '?'}."
    if report.require_clean:
        code += f" --require-clean left out {report.left_out} runs of this study made from dirty work trees."
    return (_data_line(report), code, *_recipe_line(report), *([DIRTY_NOTE] if report.marked.any() else []), explain)


def _recipe_line(report: Report) -> tuple[str, ...]:
    """How the trained rows (and the mixed rows that trained their own MLP) were trained: the optim.* and
    trainer.precision values they all share (what differs between rows is in the table's columns); evaluation is
    always the exact softmax."""
    shown = report.table[(report.table["kind"] != "counted") & (report.table["status"] == "finished")]
    rows = [(label, json.loads(c)) for label, c in zip(shown.get("label", []), shown.get("config", []))]
    rows = [(label, c) for label, c in rows if any(k.startswith("optim.") for k in c)]
    configs = [c for _, c in rows]
    if not configs:
        return ()
    how = (
        "optim.",
        "trainer.precision",
        "trainer.max_epochs",
        "trainer.limit_val_batches",
        "callbacks.early_stopping.",
    )
    # a class path (callbacks.early_stopping._target_) says what the key's name already says
    keys = sorted({k for c in configs for k in c if k.startswith(how) and not k.endswith("._target_")})
    # a family's own knobs (an LSTM's width, say), beside the columns of the paper's table, say what a row is
    knobs = sorted({k for c in configs for k in c if k.startswith("model.") and k[6:] not in (*COLUMNS, "_target_")})
    shared = [k for k in keys if all(c.get(k) == configs[0].get(k) for c in configs)]
    exact = "Every perplexity is the exact softmax over every token of its split, whatever the training used."
    recipe = ", ".join(f"{k}={configs[0][k]}" for k in shared)
    line = f"Training recipe of the trained rows (what they share): {recipe}. {exact}" if shared else exact
    differing = [k for k in knobs if not all(c.get(k) == configs[0].get(k) for c in configs)]
    if len(shared) == len(keys) and not differing:
        return (line,)
    own = []  # rows of several families train each with its own recipe: say it per row
    for label, config in rows:  # what its label does not already say
        mine = [
            f"{k}={config[k]}" for k in [*differing, *keys] if k not in shared and k in config and k not in report.extra
        ]
        own += [f"{label}: {', '.join(mine)}"] if mine else []
    return (line, "Each row's own: " + "; ".join(own) + ".") if own else (line,)


def _runs_list(runs: pd.DataFrame) -> list[str]:
    return [
        f"{run_text(run)}: {run['status']}" + (f"; note: {run['note']}" if run["note"] else "")
        for _, run in runs.iterrows()
    ]


def outline(report: Report, figures: list[str]) -> list[Section]:
    """What the report says, in order: the table first (the page's title), then only the sections with content."""
    others = [
        f"`{r.fingerprint}`: {r.runs} runs, |V| = {r.vocab_size}, newest {r.newest:%Y-%m-%d %H:%M} UTC"
        for r in report.other_data.itertuples()
    ]
    lists = [
        ("Not converged (a seed stopped at its ceiling still improving)", report.unconverged),
        *report.notes,
        ("Missing (no run)", report.missing),
        ("Running (shown as running, never as a number)", _runs_list(report.running)),
        ("Failed or killed", _runs_list(report.failed)),
        ("Other data fingerprints (not mixed in; pass --fingerprint to report one)", others),
        ("Reproducibility (the ML Reproducibility Checklist)", report.reproducibility),
    ]
    claims = tuple(Item(f": {c.verdict}.", lead=c.text, under=c.evidence) for c in report.claims)
    spec = report.spec
    claims_heading = spec.get("claims_heading", "The paper's claims, on our numbers")
    elsewhere = tuple(
        Item(f": not measured: needs {c['needs']}.", lead=c["claim"], under=(f"On your copy: `{c['command']}`",))
        for c in spec.get("elsewhere", [])
    )
    attempts = attempts_table(report)
    chosen = "Rows run in several configurations; the table shows the one with the lowest mean validation perplexity."
    sections = [
        Section(_title(report), paragraphs=_intro(report), table=display(report)),
        *_recipe_sections(report),
        Section(claims_heading, paragraphs=(report.recipe.claims_note,) if report.recipe else (), items=claims),
        Section("The paper's claims this corpus cannot test", items=elsewhere),
        *_learned_sections(report),
        *(Section(heading, items=tuple(Item(line) for line in lines)) for heading, lines in lists),
        Section("Attempts", paragraphs=(chosen,), table=None if attempts.empty else attempts),
        Section("Figures", figures=tuple(figures)),
    ]
    sections = [s for s in sections if s.items or s.table is not None or s.figures]
    regenerate = (
        f"From the runs it was built from, shipped beside it (`{report.study}{SUFFIX}`), with no store: "
        f"`nplm-report --study {report.study} --out <this folder>`. From a store that holds them (with `--tracking-uri`):"
    )
    return [*sections, Section("Regenerate", paragraphs=(regenerate,), command=report.command)]


def _learned_sections(report: Report) -> list[Section]:
    """What the best trained row's word features learned (eq. (1)'s C, an LSTM's or a Transformer's embedding):
    nearest words of probe words, the paper's example sentences."""
    learned = report.learned
    if learned is None:
        return []
    where = f"{learned.label}, run {learned.run_id[:8]} (the best trained row on validation); its map is a figure."
    return [
        Section(
            "What the best trained row's word features learned: nearest words (centred cosine similarity)",
            paragraphs=(where,),
            items=tuple(Item(line) for line in learned.neighbours),
        ),
        Section(
            "The paper's example sentences (p. 1139): P(word | the words before it), the model / Del. Int.",
            items=tuple(Item(line) for line in learned.sentences),
        ),
    ]


def _recipe_sections(report: Report) -> list[Section]:
    """A recipe study's (sweeps/brown_recipe.yaml's): the paper's recipe to convergence, and the steps from
    optim=paper to optim=fast."""
    found = report.recipe
    if found is None:
        return []
    why = "The validation curves (figure below) show how each run ended."
    steps = (
        f"{found.plan.ablate}, one knob changed per step, each step against the previous one that ran (relative change); "
        "minutes are the run's time in fit."
    )
    return [
        Section(
            "The paper's recipe to convergence, beside the paper and optim=fast",
            paragraphs=(found.fast_from, why),
            items=tuple(Item(line) for line in found.targets),
            table=found.beside,
        ),
        Section(
            "From optim=paper to optim=fast, one knob at a time",
            paragraphs=(steps,),
            items=tuple(Item(line) for line in found.moved),
            table=found.ablation,
        ),
    ]


NUMBER = re.compile(r"[-+]?[\d,]*\.?\d+(%|x)?")  # 1,105.0, -79.8%, 6.0x


def _numbers(column: pd.Series) -> bool:
    """Whether a column holds numbers (as text or not), blanks aside: it is aligned to the right."""
    cells = [str(v) for v in column if present(v) and str(v) != ""]
    return bool(cells) and all(NUMBER.fullmatch(cell) for cell in cells)


def _markdown_table(frame: pd.DataFrame) -> str:
    """A plain table as pandas writes it; the main table's two header levels as one (the split over `ours`)."""
    if not isinstance(frame.columns, pd.MultiIndex):  # a number as written (257.0 stays 257.0), to the right
        align = ["right" if _numbers(frame[column]) else "left" for column in frame.columns]
        return frame.to_markdown(index=False, colalign=align, disable_numparse=True)
    headers = [top if sub == "ours" else sub for top, sub in frame.columns]
    align = ["left" if sub in ("row", "seeds") else "right" for _, sub in frame.columns]
    return frame.to_markdown(index=False, headers=headers, colalign=align, disable_numparse=True)


def _markdown_blocks(section: Section, level: int) -> list[str]:
    blocks = [f"{'#' * level} {section.title}", *section.paragraphs]
    if section.items:
        lines = []
        for item in section.items:
            lines.append(f"- {f'**{item.lead}**' if item.lead else ''}{item.text}")
            lines += [f"  - {line}" for line in item.under]
        blocks.append("\n".join(lines))
    if section.table is not None:
        blocks.append(_markdown_table(section.table))
    if section.figures:
        blocks.append("\n".join(f"![{f}]({f})" for f in section.figures))
    if section.command:
        blocks.append(f"```bash\n{section.command}\n```")
    return blocks


def markdown(report: Report, figures: list[str]) -> str:
    """The report as markdown: the outline's first section is the page's title, the others its sections."""
    sections = outline(report, figures)
    blocks = [block for i, section in enumerate(sections) for block in _markdown_blocks(section, 1 if i == 0 else 2)]
    return "\n\n".join(blocks) + "\n"


def _html_item(item: Item) -> str:
    e = html.escape
    lead = f"<b>{e(item.lead)}</b>" if item.lead else ""
    under = f"<ul>{''.join(f'<li>{e(line)}</li>' for line in item.under)}</ul>" if item.under else ""
    return f"<li>{lead}{e(item.text)}{under}</li>"


def _html_figure(name: str, directory: Path | None) -> str:
    """A figure in the page: from `directory`, the SVG beside its PNG where there is one (the features map has
    none), else the PNG, inline as a data URI so that the page stands alone; without a directory, a link."""
    source = name
    if directory is not None:
        svg = (directory / name).with_suffix(".svg")
        path, kind = (svg, "svg+xml") if svg.is_file() else (directory / name, "png")
        source = f"data:image/{kind};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"
    return f"<img src='{html.escape(source)}' alt='{html.escape(name)}'>"


def _html_parts(section: Section, level: int, directory: Path | None = None) -> list[str]:
    e = html.escape
    parts = [f"<h{level}>{e(section.title)}</h{level}>", *(f"<p>{e(p)}</p>" for p in section.paragraphs)]
    if section.items:
        parts += ["<ul>", *(_html_item(item) for item in section.items), "</ul>"]
    if section.table is not None:
        parts.append(section.table.to_html(index=False, border=0))
    parts += [_html_figure(f, directory) for f in section.figures]
    if section.command:
        parts.append(f"<pre>{e(section.command)}</pre>")
    return parts


def html_page(report: Report, figures: list[str], directory: Path | None = None) -> str:
    """The same outline as `markdown`, as one HTML page; with the `directory` the figures were drawn in, the page
    holds them (SVG, else PNG, inline) and stands alone."""
    head = f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(report.study)}</title></head><body>"
    sections = outline(report, figures)
    parts = [part for i, s in enumerate(sections) for part in _html_parts(s, 1 if i == 0 else 2, directory)]
    return "\n".join([head, *parts, "</body></html>"]) + "\n"


def _latex_escape(text: str) -> str:
    r"""LaTeX's special characters escaped: a backslash before most; \, ~ and ^ have no such form (\\ breaks the
    line, \~ and \^ are accents), so they become the characters' own commands."""
    commands = {"\\": r"\textbackslash{}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
    return "".join(commands.get(ch, rf"\{ch}" if ch in "&%$#_{}" else ch) for ch in text)


def latex(report: Report) -> str:
    """The table alone, booktabs rules, for a paper."""
    frame = display(report)
    dirty = f" {DIRTY_NOTE}" if report.marked.any() else ""
    caption = _latex_escape(f"{_title(report)}. Data fingerprint {report.fingerprint}.{dirty}")
    styled = frame.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    column_format = "".join("l" if sub == "row" else "r" for _, sub in frame.columns)
    text = styled.to_latex(hrules=True, multicol_align="c", caption=caption, column_format=column_format)
    return text.replace("±", r"$\pm$")


def csv_table(report: Report) -> pd.DataFrame:
    """Every number of the table, unrounded (running, failed and missing rows have no perplexity)."""
    columns = [
        "row",
        *COLUMNS,
        *report.extra,
        *(f"{s}_ppl" for s in SPLITS),
        *(f"paper_{s}_ppl" for s in SPLITS),
        "seeds",
        *(f"{s}_ppl_std" for s in SPLITS),
        *(f"{s}_rel_diff" for s in SPLITS),
        *(f"{s}_{end}" for s in KEPT_SPLITS for end in ("low", "high")),  # the 95% interval over texts
        "status",
        "running",
        "failed",
        "family",
        "config_id",
        "run_ids",
        *(["dirty_runs"] if report.marked.any() else []),  # how many of run_ids came from a dirty work tree
        *(c for column in report.spec.get("columns", []) for c in COLUMN_FIELDS[column]),
    ]
    return report.table.reindex(columns=columns)


def write(report: Report, out: Path) -> list[Path]:
    """Every file of the report and its archive, built in a temporary directory and moved into `out` only once all are
    built."""
    with tempfile.TemporaryDirectory(prefix="nplm-report-") as tmp:
        staging = Path(tmp)
        figures = draw(report, staging)
        (staging / f"{report.study}.md").write_text(markdown(report, figures))
        (staging / f"{report.study}.tex").write_text(latex(report))
        (staging / f"{report.study}.html").write_text(html_page(report, figures, staging))
        csv_table(report).to_csv(staging / f"{report.study}.csv", index=False)
        if report.archive is not None:  # the runs it was built from, shipped beside it
            report.archive.write(path_of(staging, report.study))
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for path in sorted(staging.iterdir()):
            written.append(out / path.name)
            shutil.move(path, written[-1])
    return written
