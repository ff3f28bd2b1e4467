"""The docs cannot rot: every command of README.md, docs/*.md and reports/README.md is checked against the code.

- Every line of a ```bash block that runs a project command (`[project.scripts]`, plain or as .venv/bin/<it>, with
  `\\` continuations) is read. Lines that are output or comments (starting with `#`), or that run anything else
  (pip, mlflow, curl, ...), are skipped.
- `nplm-train`: its overrides are composed in process with Hydra's compose API on the installed configs, as the
  command composes them, and each composed job passes the checks a job runs on its values before any work
  (checks.check_resolves: every value resolves; config_checks.check_config: every value makes sense). A sweep is
  composed with the first value of every swept key, then once more per other value of each key the command line
  sweeps; a study's (or a search's) own swept values are taken at their first value (nplm-train itself composes
  every job of a sweep before it runs one: sweeping/sweep.py, compose_jobs). Files the user brings (`data.path=...`)
  are never read.
- `nplm-bench`: conf/bench.yaml composed the same way.
- The other commands (argparse's): their arguments parse, in process, and `<command> --help` exits 0.
- A line that ends with the comment `# fails: <why>` documents a mistake: it must be refused.
- The README's quickstart runs once for real as `nplm-train ... --cfg job` (Hydra's own path, no job run).
- Every relative link (and image) of those pages points to a file that exists.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import io
import logging
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT, console_script, run_command
from hydra import compose, initialize_config_module
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from nplm_repro.checks import check_resolves
from nplm_repro.tracking.config_checks import check_config

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "reports" / "README.md"]
PYPROJECT = (ROOT / "pyproject.toml").read_text()
# [project.scripts]: name = "module:function" (read as text: tomllib is Python 3.11's, the project supports 3.10)
SCRIPTS = dict(
    re.findall(r'^([\w-]+) = "([\w.]+:\w+)"$', PYPROJECT.split("[project.scripts]")[1].split("\n[")[0], re.MULTILINE)
)
HYDRA_APPS = {"nplm-train": "config", "nplm-bench": "bench"}  # the commands that are Hydra apps, and their config
SEPARATORS = {"&&", "||", "|", ";", "&"}
FAILS = re.compile(r"\s#\s*fails:\s*(?P<why>.*)$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    """A project command written in a doc: where, the program (nplm-train, ...), its arguments, and why it fails
    when the doc says it does (`# fails: <why>`)."""

    where: str
    program: str
    args: tuple[str, ...]
    fails: str | None = None
    pythonpath: str | None = None  # PYTHONPATH=... before it: where a family of one's own is imported from

    def __str__(self) -> str:
        return f"{self.where}: {self.program} {shlex.join(self.args)}"


def bash_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, logical line) of every ```bash block, `\\` continuations joined."""
    fence, pending, start = None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        marker = re.match(r"^\s*```(\S*)\s*$", line)
        if marker:
            fence = marker.group(1) if fence is None else None
            continue
        if fence != "bash":
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\") and not line.lstrip().startswith("#"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: a comment starts at a `#` that begins a word, outside quotes."""
    quote, escaped = None, False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i:]
    return line, ""


def commands_of(text: str, name: str) -> Iterator[Command]:
    """The project commands of a doc's bash blocks; a line that names one but cannot be read is an error."""
    for number, line in bash_lines(text):
        if not line.strip() or line.lstrip().startswith("#"):
            continue  # a blank line, a comment or a command's output
        code, comment = split_comment(line)
        why = FAILS.search(" " + comment)
        lexer = shlex.shlex(code, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, ""
        try:
            tokens = list(lexer)
        except ValueError as error:
            if re.search(r"\bnplm-[a-z]+", line):
                raise AssertionError(f"{name}:{number}: cannot be read as a shell line ({error}): {line}") from None
            continue  # output, not a command
        segment: list[str] = []
        for token in [*tokens, ";"]:
            if token not in SEPARATORS:
                segment.append(token)
                continue
            path = None
            while segment and (ASSIGNMENT.match(segment[0]) or segment[0] in {"do", "then", "else", "time"}):
                word = segment.pop(0)  # VAR=value before a command, a shell keyword
                path = word.removeprefix("PYTHONPATH=") if word.startswith("PYTHONPATH=") else path
            program = Path(segment[0]).name if segment else ""
            if program.startswith("nplm-"):
                fails = why.group("why") if why else None
                yield Command(f"{name}:{number}", program, tuple(segment[1:]), fails, path)
            segment = []


def documented() -> list[Command]:
    return [c for doc in DOCS for c in commands_of(doc.read_text(), str(doc.relative_to(ROOT)))]


# --- nplm-train and nplm-bench: Hydra composition --------------------------------------------------------------


def hydra_arguments(args: tuple[str, ...]) -> tuple[bool, list[str]]:
    """(multirun, overrides) of a Hydra app's command line; an option this check does not know is an error."""
    multirun, overrides, skip = False, [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in {"-m", "--multirun"}:
            multirun = True
        elif arg in {"--cfg", "-c", "--package", "-p"}:
            skip = i + 1 < len(args)  # its value
        elif arg in {"--help", "-h", "--hydra-help", "--info", "-i", "--resolve"}:
            pass
        elif arg.startswith("-"):
            raise ValueError(f"option {arg} is not checked here: write the command with overrides (and -m)")
        else:
            overrides.append(arg)
    return multirun, overrides


def key_of(override: Override) -> str:
    """The override's key as written, prefix included (`+trainer.x`, `hydra/launcher`)."""
    return override.input_line.split("=", 1)[0]


def swept_values(override: Override) -> list[str]:
    """A sweep's values as the job overrides Hydra makes of them; a search's interval is tried at its start, and a
    study's single value (`optim: sampled`, which Hydra's sweeper takes as every job's) is every job's."""
    value = override.value()
    if not override.is_sweep_override():
        return [override.get_value_element_as_str()]
    if isinstance(value, IntervalSweep):
        return [repr(value.start)]
    return list(override.sweep_string_iterator())


class Composer:
    """Composes as Hydra does, in process, on the installed configs (pkg://nplm_repro.conf, as the commands compose
    them). Hydra builds a config in two steps: the defaults list with the overrides of config groups (`experiment=`,
    `study=`, `hydra/launcher=`), composed by its compose API here once per distinct list; then every other override
    applied to that config by Hydra's own function (ConfigLoaderImpl._apply_overrides_to_config), which raises what
    Hydra raises for a key the config lacks."""

    def __init__(self) -> None:
        self.parser = OverridesParser.create()
        self.loader = GlobalHydra.instance().config_loader()
        self.groups: dict[str, bool] = {}
        self.composed: dict[tuple[str, tuple[str, ...]], DictConfig | str] = {}

    def is_group(self, override: Override) -> bool:
        name = override.key_or_group.split("@")[0]
        if name not in self.groups:
            self.groups[name] = bool(self.loader.get_group_options(name))
        return self.groups[name]

    def first(self, override: Override) -> bool:
        """An override of the defaults list: a config group's, or Hydra's search path (where groups are found)."""
        return override.key_or_group == "hydra.searchpath" or self.is_group(override)

    def compose(self, config: str, overrides: list[str]) -> DictConfig | str:
        """The config with Hydra's own (`hydra`), or why it does not compose."""
        try:
            parsed = self.parser.parse_overrides(overrides)
        except Exception as error:  # noqa: BLE001 - an override Hydra cannot read is the finding
            return one_line(error)
        groups = tuple(o.input_line for o in parsed if self.first(o))
        key = (config, groups)
        if key not in self.composed:
            try:
                self.composed[key] = compose(config, overrides=list(groups), return_hydra_config=True)
            except Exception as error:  # noqa: BLE001 - whatever Hydra or OmegaConf raise is the finding
                self.composed[key] = one_line(error)
        cfg = self.composed[key]
        if isinstance(cfg, str):
            return cfg
        cfg = copy.deepcopy(cfg)
        OmegaConf.set_readonly(cfg, False)
        OmegaConf.set_struct(cfg, True)
        try:
            ConfigLoaderImpl._apply_overrides_to_config([o for o in parsed if not self.first(o)], cfg)
        except Exception as error:  # noqa: BLE001 - as above
            return one_line(error)
        return cfg

    def problems(self, program: str, args: tuple[str, ...]) -> list[str]:
        """Why this nplm-train or nplm-bench command line would be refused: none if it composes and checks."""
        config = HYDRA_APPS[program]
        try:
            multirun, overrides = hydra_arguments(args)
            parsed = self.parser.parse_overrides(overrides)
        except Exception as error:  # noqa: BLE001 - an option or override Hydra cannot read is the finding
            return [one_line(error)]
        sweeps = {key_of(o): swept_values(o) for o in parsed if o.is_sweep_override()}
        first = [f"{key_of(o)}={sweeps[key_of(o)][0]}" if key_of(o) in sweeps else o.input_line for o in parsed]
        base = self.compose(config, first)
        if isinstance(base, str):
            return [f"job {' '.join(first)}: {base}" if sweeps else base]
        multirun = multirun or base.hydra.mode == RunMode.MULTIRUN
        if sweeps and not multirun:
            return [f"a sweep ({', '.join(sweeps)}) needs -m: Hydra refuses it in a single run"]
        given = {key_of(o).lstrip("+~") for o in parsed}
        own = []  # the config's own swept values (a study's, a search's) that the command line leaves: the first
        if multirun:
            params = base.hydra.sweeper.get("params")
            params = OmegaConf.to_container(params, resolve=False) if isinstance(params, DictConfig) else {}
            for name, values in params.items():
                if name.lstrip("+~") not in given:
                    own.append(f"{name}={swept_values(self.parser.parse_override(f'{name}={values}'))[0]}")
        jobs = [own + first]
        for name, values in sweeps.items():
            for value in values[1:]:
                jobs.append([*(o for o in jobs[0] if o.split("=", 1)[0] != name), f"{name}={value}"])
        found = []
        for job in jobs:
            why = self.check(config, job)
            if why:
                found.append(why if len(jobs) == 1 else f"job {' '.join(job)}: {why}")
        return found

    def check(self, config: str, job: list[str]) -> str | None:
        """Why this job would be refused before any work: it does not compose, a value does not resolve, or a value
        makes no sense (check_resolves, check_config); None when it would start."""
        cfg = self.compose(config, job)
        if isinstance(cfg, str):
            return cfg
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = "outputs/docs"  # Hydra sets it when a job starts; callbacks/ reads it
        HydraConfig.instance().set_config(cfg)
        values = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        try:
            check_resolves(values)
            check_config(values)
        except Exception as error:  # noqa: BLE001 - the check's one line is the finding
            return one_line(error)
        return None


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


# --- the other commands: argparse --------------------------------------------------------------------------------


class _Parsed(BaseException):
    """Raised once the command's arguments parsed: it stops the command before any work (not an Exception, so the
    commands' own error handling lets it through)."""


def entry_point(program: str) -> Callable[[], None]:
    module, function = SCRIPTS[program].split(":")
    return getattr(importlib.import_module(module), function)


@contextlib.contextmanager
def logging_kept() -> Iterator[None]:
    """Every logger's level and filters put back as they were: a command sets some before it parses its arguments."""
    loggers = [
        logging.getLogger(),
        *(g for g in logging.Logger.manager.loggerDict.values() if isinstance(g, logging.Logger)),
    ]
    kept = [(g, g.level, list(g.filters)) for g in loggers]
    try:
        yield
    finally:
        for logger, level, filters in kept:
            logger.setLevel(level)
            logger.filters[:] = filters


def argument_problems(program: str, args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Why argparse refuses these arguments of this command (its usage error), or nothing: the command's own parser
    reads them, in process, and the command stops right after."""
    parse_args = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, *a: object, **k: object) -> None:
        parse_args(self, *a, **k)
        raise _Parsed

    with monkeypatch.context() as patch, logging_kept():
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
        patch.setattr(sys, "argv", [program, *args])
        # the commands set it for Hydra: setenv first, so that the context puts it back as it was even when it was unset
        patch.setenv("HYDRA_FULL_ERROR", "")
        patch.delenv("HYDRA_FULL_ERROR")
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                entry_point(program)()
        except _Parsed:
            return []
        except SystemExit as error:
            if error.code in (0, None):
                return []  # --help
            said = stderr.getvalue().strip().splitlines() or ["(nothing on stderr)"]
            return [f"exit {error.code}: {said[-1]}"]
    return ["the command ran without parsing its arguments"]


# --- fixtures ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def composer() -> Iterator[Composer]:
    before = HydraConfig.instance().cfg
    with initialize_config_module(config_module="nplm_repro.conf", version_base="1.3"):
        yield Composer()
    HydraConfig.instance().cfg = before


def problems_of(command: Command, composer: Composer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    if command.program not in SCRIPTS:
        return [f"{command.program} is no command of this project (pyproject.toml's [project.scripts])"]
    if command.pythonpath:  # relative to the project's root, where the docs' commands run
        monkeypatch.syspath_prepend(str(ROOT / command.pythonpath))
    if command.program in HYDRA_APPS:
        return composer.problems(command.program, command.args)
    return argument_problems(command.program, command.args, monkeypatch)


COMMANDS = documented()
HELP = sorted({c.program for c in COMMANDS if c.program in SCRIPTS and c.program not in HYDRA_APPS})


@pytest.fixture(scope="module")
def said(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    """What the commands said, each run once for the module's tests, in a process of its own forked from the warm
    interpreter that imported them (helpers.run_command): each argparse command's --help, and the README's
    quickstart through Hydra's own path (`--cfg job`: composed and printed, no job run)."""
    cwd = tmp_path_factory.mktemp("docs")
    done = {program: run_command([console_script(program), "--help"], cwd=cwd, timeout=120) for program in HELP}
    overrides = [a for a in quickstart().args if a not in {"-m", "--multirun"}]  # --cfg prints, it runs nothing
    done["quickstart"] = run_command([console_script("nplm-train"), *overrides, "--cfg", "job"], cwd=cwd, timeout=120)
    return done


def quickstart() -> Command:
    (command,) = [c for c in COMMANDS if c.where.startswith("README.md") and "study=quickstart" in c.args]
    return command


# --- the tests ---------------------------------------------------------------------------------------------------


def test_the_docs_hold_commands_of_every_kind() -> None:
    """The reading of the docs finds what is there (a reading that finds nothing checks nothing)."""
    programs = {c.program for c in COMMANDS}
    assert {"nplm-train", "nplm-bench", "nplm-report", "nplm-score", "nplm-ask"} <= programs
    assert sum(c.fails is not None for c in COMMANDS) >= 5
    assert any(c.where.startswith("README.md") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.where} {c.program}")
def test_every_documented_command_is_accepted_or_refused_as_the_doc_says(
    command: Command, composer: Composer, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = problems_of(command, composer, monkeypatch)
    if command.fails is None:
        assert not found, f"{command}\n" + "\n".join(found)
    else:
        assert found, f"{command}\nis marked `# fails: {command.fails}`, but it is accepted"


@pytest.mark.parametrize("program", HELP)
def test_help_of_every_documented_command(program: str, said: dict[str, subprocess.CompletedProcess]) -> None:
    assert said[program].returncode == 0, said[program].stderr[-2000:]
    assert f"usage: {program}" in said[program].stdout


def test_the_quickstart_composes_through_hydras_own_path(said: dict[str, subprocess.CompletedProcess]) -> None:
    done = said["quickstart"]
    assert done.returncode == 0, f"{quickstart()} --cfg job\n{done.stderr[-3000:]}"
    printed = OmegaConf.create(done.stdout)
    assert printed.study == "quickstart" and printed.report == "reports"
    assert printed.data.path == "../shared/data/brown.zip"


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links_of(text: str) -> list[str]:
    """The targets of the Markdown links and images of a page, outside code."""
    text = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in links_of(doc.read_text()):
        if re.match(r"^(https?:|mailto:|#)", target):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file(doc: Path) -> None:
    assert doc.is_file()
    assert not broken_links(doc)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target).resolve() for target in links_of((ROOT / "README.md").read_text())}
    assert not [d.name for d in sorted((ROOT / "docs").glob("*.md")) if d.resolve() not in linked]


def test_the_readme_installs_and_tests_as_ci_does() -> None:
    """.ci/run's install and test steps, each a line there, are the README's commands joined by &&: the quickstart's
    install line, and the test command."""
    steps = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith(("python3", ".venv/"))]
    install, test = [s for s in steps if "pytest" not in s], [s for s in steps if "pytest" in s]
    assert install and len(test) == 1
    readme = [line for _, line in bash_lines((ROOT / "README.md").read_text())]
    assert " && ".join(install) in readme
    assert " && ".join([*install, *test]) in readme


def test_the_version_is_the_newest_in_the_changelog() -> None:
    (version,) = re.findall(r'^version = "(.+)"$', PYPROJECT, re.MULTILINE)
    released = re.findall(
        r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE
    )
    assert released and released[0] == version
    as_numbers = [tuple(map(int, v.split("."))) for v in released]
    assert as_numbers == sorted(as_numbers, reverse=True)  # newest first


# --- the checker itself finds what rots ---------------------------------------------------------------------------

BROKEN = """
Some prose with `nplm-train model.hh=5` in it (not a bash block: not read).

```bash
.venv/bin/nplm-train experiment=mlp5 model.hh=5 data.path=PATH/TO/brown.zip
.venv/bin/nplm-train -m experiment=kn3,mlp9 model.h=16 \\
    data.path=PATH/TO/brown.zip
# nplm-train: error: an output line, not a command
.venv/bin/nplm-train experiment=mlp5 model.h=5   # fails: said to fail, but it composes
.venv/bin/nplm-score --row MLP9 --sed 1
.venv/bin/nplm-bench experiment=mlp9 bench.whatt=[train]
```
"""


def test_a_renamed_key_in_a_doc_is_reported(composer: Composer, monkeypatch: pytest.MonkeyPatch) -> None:
    commands = list(commands_of(BROKEN, "BROKEN.md"))
    assert [c.where for c in commands] == [f"BROKEN.md:{n}" for n in (5, 6, 9, 10, 11)]
    found = {str(c): problems_of(c, composer, monkeypatch) for c in commands}
    report = "\n".join(f"{c}\n    {p}" for c, ps in found.items() for p in ps)
    print(report)  # what a doc that rotted reads like (pytest -s shows it)
    renamed, sweep, marked, score, bench = found.values()
    assert len(renamed) == 1 and "Could not override 'model.hh'" in renamed[0]
    assert len(sweep) == 1 and sweep[0].startswith("job experiment=kn3 ") and "Could not override 'model.h'" in sweep[0]
    assert marked == [] and commands[2].fails == "said to fail, but it composes"
    assert len(score) == 1 and "unrecognized arguments: --sed" in score[0]
    assert len(bench) == 1 and "bench.whatt" in bench[0]


@pytest.mark.parametrize(
    "overrides",
    [
        ["study=brown_table1", "experiment=mlp9", "model.h=7", "+trainer.gradient_clip_val=1", "data.path=x"],
        [
            "experiment=kn3",
            "data=text",
            "data.path=x",
            "data.members=y",
            "hydra/launcher=slurm",
            "hydra.launcher.mem_gb=8",
        ],
    ],
)
def test_composing_in_two_steps_is_hydras_composition(overrides: list[str], composer: Composer) -> None:
    """The composer's config (groups composed, then the other overrides applied) is the one Hydra composes whole."""
    two_steps, whole = composer.compose("config", overrides), compose("config", overrides, return_hydra_config=True)
    assert isinstance(two_steps, DictConfig)
    for cfg in (two_steps, whole):
        OmegaConf.set_readonly(cfg, False)
        with open_dict(cfg):
            del cfg.hydra.overrides, cfg.hydra.runtime, cfg.hydra.job  # where Hydra writes the command line down
    assert OmegaConf.to_container(two_steps) == OmegaConf.to_container(whole)


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("")
    doc = tmp_path / "page.md"
    doc.write_text("[here](there.md#a) [gone](gone.md) ![figure](figures/gone.png) [web](https://example.org) `[x](y)`")
    assert broken_links(doc) == ["gone.md", "figures/gone.png"]
