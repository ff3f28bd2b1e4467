"""How a command ends: a bad key or value is one line and exit 2, any other error one line and exit 1, an interrupt
exit 130 (`cli.py` wraps each command's main in this rule). A leaf below every layer, so that a Hydra callback (a
sweep's in sweeping/sweep.py, the output directories' in checks.py) ends the command by the same rule
(`errors_exit`): Hydra would only warn of a callback's error and go on."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from importlib import resources
from typing import NoReturn

import yaml
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from nplm_repro.errors import NplmError, one_line
from nplm_repro.progress import close_displays

EXIT_FAILED = 1  # anything else that went wrong: the run is FAILED, its traceback in the run's error.txt
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports a job stopped by Ctrl-C


# Hydra's words that need our fix beside them: `+experiment=mlp5` since conf/config.yaml lists the group
# (`experiment: null`), and an editable install made
# before conf/ was installed as the package nplm_repro.conf (pyproject.toml's package-dir)
HINTS = {
    "Primary config module 'nplm_repro.conf' not found": " (an install from before conf/ was packaged: pip install -e .)",
    "Multiple values for experiment.": " (the group is in the defaults now: write experiment=<row>, without the +)",
}


# Hydra's lexer refuses an unquoted value holding a character outside its grammar (ü, a dash —, #, an apostrophe),
# naming the override: its key (with any +, ++ or ~ before it) is the one the hint quotes
UNQUOTED = re.compile(r"LexerNoViableAltException: ([+~]*[^=\s]+)=")


# Hydra's words for a key the model's config has not: on a mixed row (`experiment=mlp2 model.h=16`), a key of the
# model of one of the rows it mixes
NO_STUDY = re.compile(r"Could not find 'study/([^']+)'")
NOT_IN_MODEL = re.compile(r"Could not override 'model\.([\w.]+)'.*Key '[\w.]+' is not in struct")


def _config(group: str, name: str) -> dict:
    """conf/<group>/<name>.yaml as YAML (the installed package's configs), or {} where there is none."""
    found = resources.files("nplm_repro.conf").joinpath(group, f"{name}.yaml")
    return (yaml.safe_load(found.read_text()) or {}) if found.is_file() else {}


def _has(experiment: dict, key: str) -> bool:
    """Whether the model of `experiment` (its own keys, then its model's file: `override /model`, else mlp) has
    `key` at its top."""
    defaults = [d for d in experiment.get("defaults") or [] if isinstance(d, dict)]
    chosen = [d["override /model"] for d in defaults if "override /model" in d]
    own = experiment.get("model") or {}
    return key.split(".")[0] in own or key.split(".")[0] in _config("model", (chosen or ["mlp"])[0])


def mixture_hint(message: str, argv: list[str]) -> str:
    """Where a model key refused on a mixed row (`NOT_IN_MODEL`) belongs: the rows the mixture mixes whose model has
    it, each run by its own command; '' for any other message, or a command line with no mixed row."""
    if not (refused := NOT_IN_MODEL.search(message)):
        return ""
    key = refused[1]
    for name in [v for a in argv if a.startswith("experiment=") for v in a.split("=", 1)[1].split(",")]:
        mixture = _config("experiment", name)
        rows = list((mixture.get("model") or {}).get("components") or [])
        if not rows:
            continue
        folder = resources.files("nplm_repro.conf").joinpath("experiment")
        files = [f.name.removesuffix(".yaml") for f in folder.iterdir()]
        having = [
            f"{row} (experiment={other})"
            for other in sorted(files)
            if (config := _config("experiment", other)).get("row") in rows and _has(config, key)
            for row in [config["row"]]
        ]
        where = (
            f"belongs to the run of {' and '.join(having)}, run by its own command" if having else "is a key of none"
        )
        return (
            f" ({mixture.get('row', name)} is a mixture of the rows {' and '.join(rows)}, which mixes their finished "
            f"runs: model.{key} {where}{'' if having else ' of their models either'})"
        )
    return ""


def study_hint(message: str) -> str:
    """The studies there are, and where one's own goes, for a `study=<name>` Hydra found no file of (`NO_STUDY`)."""
    if not NO_STUDY.search(message):
        return ""
    folder = resources.files("nplm_repro.conf").joinpath("study")
    studies = sorted(f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml"))
    return (
        f" (the studies: {', '.join(studies)}; a study of your own is one file, <dir>/study/<name>.yaml, run with "
        "-m 'hydra.searchpath=[file://<dir>]' study=<name>: docs/studies.md)"
    )


def hints(message: str) -> str:
    """What to add to Hydra's one-line `message`: the fixes of HINTS whose words it holds, where a model key refused on
    a mixed row belongs (`mixture_hint`), the studies there are (`study_hint`), and how to quote a value that Hydra's
    lexer refused (`UNQUOTED`)."""
    found = "".join(hint for words, hint in HINTS.items() if words in message) + mixture_hint(message, sys.argv[1:])
    found += study_hint(message)
    if refused := UNQUOTED.search(message):
        found += (
            " (a value with characters other than ASCII letters, digits, spaces and _-./ needs quotes: "
            f"'{refused[1]}=\"...\"')"
        )
    return found


def end_lines() -> None:
    """Before a command's last line: the sweep's display stopped (`close_displays`) and every progress bar still
    open (Lightning's, on stdout) closed, each ending its line. An open bar would otherwise be drawn again at exit,
    after the error, and the error would start on the bar's line wherever the two streams go to one file."""
    close_displays()
    bars = sys.modules.get("tqdm.std")  # loaded with the first bar: a command without one has none to close
    for bar in list(bars.tqdm._instances) if bars else []:
        bar.leave = True  # drawn once more, then a newline
        bar.close()
    sys.stdout.flush()


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    end_lines()
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(code)


HYDRA_TRACEBACK = "HYDRA_FULL_ERROR"  # Hydra's switch for its own commands
TRACEBACK = "NPLM_FULL_ERROR"  # the same switch for a command that is not Hydra's (nplm-report)
_traceback_env = HYDRA_TRACEBACK  # the switch of the running command, named in the line of an unexpected error
_user_wants_traceback = False  # that switch as the user set it, before `cli` sets HYDRA_FULL_ERROR for its own use
# Set on a sweep job's error before Hydra raises it again at the sweep's end (a plain attribute, kept when a
# launcher pickles the error back from its worker): `cli` then gives it the exit code it gets in a single run
RAISED_BY_JOB = "nplm_raised_by_job"


def traceback_switch(env: str) -> bool:
    """Make `env` the running command's switch for a full traceback (named in the line of an unexpected error), as the
    user set it, before `cli` sets HYDRA_FULL_ERROR for its own use; whether it is set."""
    global _traceback_env, _user_wants_traceback
    _traceback_env = env
    _user_wants_traceback = bool(os.environ.get(env))
    return _user_wants_traceback


def _unexpected(error: Exception) -> str:
    return f"{type(error).__name__}: {one_line(error)} ({_traceback_env}=1 shows the traceback)"


def exit_code(error: Exception, in_job: bool) -> int:
    """One rule for a single run and a sweep's jobs: NplmError is bad input (2); so is an error of Hydra, OmegaConf
    or YAML raised outside any job, i.e. the command line or a config file refused (an unknown key, a missing
    option, a study file that is not YAML); any other error, Hydra's InstantiationException from a job included, is
    unexpected (1)."""
    refused = (HydraException, OmegaConfBaseException, yaml.YAMLError)
    if isinstance(error, NplmError) or (not in_job and isinstance(error, refused)):
        return EXIT_BAD_INPUT
    return EXIT_FAILED


def fail_with(error: Exception, in_job: bool) -> NoReturn:
    """End the command on `error` in one line, with its exit code (`exit_code`): an unexpected error named by its
    type, with the switch that shows its traceback; bad input as its message, with Hydra's hints (`hints`)."""
    if exit_code(error, in_job) == EXIT_FAILED:
        _fail(_unexpected(error), EXIT_FAILED)
    message = one_line(error)
    _fail(message + hints(message))


@contextlib.contextmanager
def errors_exit(sweep: bool = False) -> Iterator[None]:
    """Inside a Hydra job: NplmError becomes one line and exit 2, any other exception one line and exit 1 (`exit_code`).
    SystemExit bypasses Hydra's own report ("Error executing job with overrides: ..."), which would come first.

    In a sweep (`sweep`) a job's error is its failure: it goes on to Hydra, marked RAISED_BY_JOB, and `cli` prints
    it once the sweep ends, with the exit code it has here.
    """
    try:
        yield
    except Exception as error:
        if sweep:
            setattr(error, RAISED_BY_JOB, True)
            raise
        if _user_wants_traceback and not isinstance(error, NplmError):
            raise
        fail_with(error, in_job=True)
