"""The MLflow dashboard as a user sees it (issue 20): a sweep's runs in `mlflow ui`, rendered by headless Chromium.
MLflow's UI is a React app that fetches everything after loading, so only a browser shows what is on screen: which
view the link a sweep prints opens on (issue 41: MLflow 3's GenAI overview, without `workflowType`), the sweep's
parent run with its jobs nested under it, and each job's valid_ppl.

Chromium is driven over the DevTools protocol on a pipe (no Python dependency, no debugging port); the tests skip
without it (Debian: `apt-get install chromium`). Screenshots of what was checked go to each test's tmp_path."""

import base64
import contextlib
import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import ROOT, SLICE, SWEEPS, console_script, free_port, run_script, slice_texts
from mlflow.tracking import MlflowClient

from nplm_repro.sweeping.sweep import dashboard as link_of

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
BROWSER = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")

# Two n-gram rows of Table 1 (seconds each), one after the other, as a sweep with its MLflow parent run.
SWEEP = ["-cd", str(SWEEPS), "-cn", "brown_table1", "hydra/launcher=basic", "experiment=kn3,del_int", "report=null"]
WAIT = 90  # seconds for a page to show something; it takes a few on an idle machine
RUN_LINKS = """[...document.querySelectorAll('[role=row] a[href*="/runs/"]')].map(a => ({
    id: a.getAttribute('href').split('/runs/')[1], name: a.textContent,
    row: Number(a.closest('[role=row]').getAttribute('aria-rowindex')), left: a.getBoundingClientRect().left}))"""


@dataclass(frozen=True)
class Run:
    run_id: str
    name: str
    valid_ppl: float | None


@dataclass(frozen=True)
class Dashboard:
    url: str  # mlflow ui's, http://127.0.0.1:<port>
    link: str  # what the sweep printed, to see its runs
    experiment_id: str
    parent: Run
    jobs: list[Run]  # nested under parent


class Page:
    """One tab of a Chromium started with --remote-debugging-pipe: DevTools commands go in on its fd 3 and replies
    come out on its fd 4, each a JSON message ended by NUL."""

    def __init__(self, to_chromium: int, from_chromium: int, shots: Path) -> None:
        self._out, self._in, self._shots = to_chromium, from_chromium, shots
        self._buffer, self._last_id = b"", 0
        page = next(t for t in self._call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self._session = self._call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.command("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1, mobile=False)

    def _call(self, method: str, session: str | None = None, **params: Any) -> dict:
        self._last_id += 1
        message = {"id": self._last_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + 60
        while True:
            while b"\0" not in self._buffer:
                assert select.select([self._in], [], [], max(0, deadline - time.monotonic()))[0], f"{method}: no reply"
                chunk = os.read(self._in, 1 << 20)
                assert chunk, f"{method}: Chromium closed its pipe"
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)  # a reply to our command, or an event (ignored)
            if reply.get("id") == self._last_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply["result"]

    def command(self, method: str, **params: Any) -> dict:
        return self._call(method, self._session, **params)

    def evaluate(self, expression: str) -> Any:
        result = self.command("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, f"{expression}: {result['exceptionDetails']}"
        return result["result"].get("value")

    def open(self, url: str) -> None:
        """Load `url` as a new document (about:blank first: a change of hash alone would keep the last page's
        text on screen until the app re-renders)."""
        self.command("Page.navigate", url="about:blank")
        self.command("Page.navigate", url=url)

    def text(self) -> str:
        """What the page shows, its whitespace collapsed to single spaces."""
        return " ".join((self.evaluate("document.body ? document.body.innerText : ''") or "").split())

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.command("Page.captureScreenshot", format="png")["data"]))
        return path

    def wait_for(self, condition: str, what: str) -> None:
        """Poll the JavaScript `condition` until it holds; else fail with what the page shows and a screenshot."""
        deadline = time.monotonic() + WAIT
        while not self.evaluate(f"!!({condition})"):
            if time.monotonic() > deadline:
                shot = self.screenshot(self._shots / "timeout.png")
                pytest.fail(f"{what}: not shown in {WAIT} s ({shot}); the page shows: {self.text()[:2000]}")
            time.sleep(0.25)

    def settle(self, quiet: float = 2.0) -> None:
        """Wait until the page's text has not changed for `quiet` seconds (at most WAIT): its data has come."""
        deadline, last, since = time.monotonic() + WAIT, self.text(), time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - since < quiet:
            time.sleep(0.25)
            if (text := self.text()) != last:
                last, since = text, time.monotonic()

    def wait_for_text(self, pattern: str, what: str) -> re.Match:
        """The first match of `pattern` in the page's text, once it shows."""
        text = "(document.body ? document.body.innerText : '').split(/\\s+/).join(' ')"
        self.wait_for(f"new RegExp({json.dumps(pattern)}).test({text})", what)
        match = re.search(pattern, self.text())
        assert match, pattern
        return match

    def run_links(self) -> list[dict]:
        """The runs table's rows, top to bottom: each run's id, name, row and where its name starts (px)."""
        return sorted(self.evaluate(RUN_LINKS), key=lambda link: link["row"])


def stop(process: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM to the group of `process` (started in a session of its own), then wait until every process of it has
    gone (mlflow ui's job consumer outlives the server by seconds), SIGKILL after `timeout`."""
    deadline = time.monotonic() + timeout
    with contextlib.suppress(ProcessLookupError):  # raised once the group is empty
        os.killpg(process.pid, signal.SIGTERM)
        while time.monotonic() < deadline:
            process.poll()  # reaps the leader: a zombie would still count as the group's
            os.killpg(process.pid, 0)
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextlib.contextmanager
def chromium(shots: Path) -> Iterator[Page]:
    """Headless Chromium in a fresh profile (as a first visit: no view chosen before) in its own process group,
    terminated on exit. --no-sandbox: Chromium refuses to run as root (CI, containers) with its sandbox."""
    commands, to_chromium = os.pipe()
    from_chromium, replies = os.pipe()
    child = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (commands, replies)]  # >= 10: 3 and 4 stay free
    for fd in (commands, replies):
        os.close(fd)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
    flags += ["--hide-scrollbars", f"--user-data-dir={shots / 'profile'}", "--remote-debugging-pipe"]
    plumbed = f'exec "$0" "$@" 3<&{child[0]} 4>&{child[1]}'  # bash: dash cannot redirect fds above 9
    with open(shots / "chromium.log", "w") as log:
        browser = subprocess.Popen(
            ["bash", "-c", plumbed, CHROMIUM, *flags, "about:blank"],
            pass_fds=child,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for fd in child:
            os.close(fd)
        try:
            yield Page(to_chromium, from_chromium, shots)
        finally:
            stop(browser)
            os.close(to_chromium)
            os.close(from_chromium)


@contextlib.contextmanager
def mlflow_ui(store: str, workdir: Path) -> Iterator[str]:
    """`mlflow ui` on the store as README.md's "Open the dashboard" runs it (one worker, a free port on 127.0.0.1);
    yields its URL once /health answers, and stops it with its workers on exit."""
    port = free_port()
    command = [console_script("mlflow"), "ui", "--backend-store-uri", store]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"MLFLOW_DISABLE_TELEMETRY": "true"}
    with open(workdir / "ui.log", "w") as log:
        server = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                assert server.poll() is None, (workdir / "ui.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow ui did not answer /health in 180 s"
                with contextlib.suppress(requests.ConnectionError):
                    if requests.get(f"{url}/health", timeout=5).ok:
                        break
                time.sleep(0.5)
            yield url
        finally:
            stop(server, timeout=10)  # its job consumer takes ~20 s to go on SIGTERM; the store is throwaway


@pytest.fixture(scope="module")
def dashboard(brown_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """`mlflow ui` on a fresh SQLite store, and a sweep of two n-gram rows into it through that server, so that the
    link the sweep prints is the server's page itself, opened as printed. The jobs read the slice's 13 texts, unzipped
    into a folder, not all 500."""
    workdir = tmp_path_factory.mktemp("dashboard")
    texts = slice_texts(brown_path, workdir)
    with mlflow_ui(f"sqlite:///{workdir}/mlflow.db", workdir) as url:
        result = run_script("nplm-train", *SWEEP, f"data.path={texts}", *SLICE, f"tracking.uri={url}", cwd=workdir)
        assert result.returncode == 0, result.stderr[-3000:]
        printed = re.findall(
            r"sweep: its runs in MLflow's dashboard: (\S+)$", result.stdout + result.stderr, re.MULTILINE
        )
        assert len(printed) == 1, (result.stdout + result.stderr)[-3000:]
        client = MlflowClient(url)
        experiment_id = client.get_experiment_by_name("brown").experiment_id
        runs = [
            (
                r.data.tags.get("mlflow.parentRunId"),
                Run(r.info.run_id, r.info.run_name, r.data.metrics.get("valid_ppl")),
            )
            for r in client.search_runs([experiment_id])
        ]
        parents = [run for parent_id, run in runs if parent_id is None]
        assert len(parents) == 1, f"one parent run expected, the store has {[run.name for _, run in runs]}"
        jobs = [run for parent_id, run in runs if parent_id == parents[0].run_id]
        assert len(jobs) == 2 and all(job.valid_ppl for job in jobs)
        yield Dashboard(url, printed[0], experiment_id, parents[0], jobs)


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    with chromium(tmp_path) as page:
        yield page


def test_a_sweep_links_the_runs_view_of_its_experiment() -> None:
    """The page named as docs/tracking.md names it, with the view (`workflowType`), for a local store and a server
    alike (its password redacted); the browser tests open the server's form as a sweep prints it."""
    page = "#/experiments/1?workflowType=machine_learning"
    assert link_of("sqlite:///mlflow.db", "1") == (
        f"mlflow ui --backend-store-uri sqlite:///mlflow.db, then open http://127.0.0.1:5000/{page}"
    )
    assert link_of("http://user:secret@host:5000/", "1") == f"http://***@host:5000/{page}"


@pytest.mark.slow
@BROWSER
def test_the_printed_link_opens_on_the_sweep_with_its_jobs_nested(
    dashboard: Dashboard, page: Page, tmp_path: Path
) -> None:
    """A first visit by the link the sweep printed, exactly as printed, shows the training runs, not MLflow 3's GenAI
    overview of traces (which this project has none of): MLflow 3.17's UI opens any experiment on its GenAI view in a
    fresh browser, whatever the experiment's `mlflow.experimentKind` (mlflow/mlflow#24498), unless the link names
    the view. There the sweep's parent run is one row; expanding it shows its jobs right under it, indented."""
    experiment, parent = f"#/experiments/{dashboard.experiment_id}", dashboard.parent
    assert dashboard.link == f"{dashboard.url}/{experiment}?workflowType=machine_learning"
    page.open(dashboard.link)
    page.wait_for(f"location.hash.startsWith({json.dumps(experiment + '/')})", "a view of the experiment")
    page.wait_for("/ - Experiment \\d+ - MLflow$/.test(document.title)", "the view's title")
    view, title = page.evaluate("location.hash"), page.evaluate("document.title")
    link = f"document.querySelector('[role=row] a[href$=\"/runs/{parent.run_id}\"]')"
    if view.startswith(f"{experiment}/runs"):
        page.wait_for(link, "the sweep's parent run in the runs table")
    page.settle()  # for the screenshot, whichever view it is
    shot = page.screenshot(tmp_path / "dashboard.png")
    assert view.startswith(f"{experiment}/runs"), f"the experiment opens on {view} ({title!r}), not its runs: {shot}"
    assert [row["name"] for row in page.run_links()] == [parent.name]  # its jobs folded under it
    nested_under(page, parent, dashboard.jobs, tmp_path)


def nested_under(page: Page, parent: Run, jobs: list[Run], shots: Path) -> None:
    """Expanding the parent's row (the runs table shown, the parent's row in it) shows exactly `jobs`, right under
    it and indented."""
    link = f"document.querySelector('[role=row] a[href$=\"/runs/{parent.run_id}\"]')"
    expand = f"{link}.closest('[role=gridcell]').querySelector('button')"  # the +/- before the run's name
    assert page.evaluate(f"!!{expand}"), "the parent run has no expand button"
    page.evaluate(f"{expand}.click()")
    page.wait_for(
        f"document.querySelectorAll('[role=row] a[href*=\"/runs/\"]').length > {len(jobs)}", "the sweep's jobs"
    )
    page.screenshot(shots / "runs_expanded.png")
    top, *rest = page.run_links()
    assert (top["id"], top["name"]) == (parent.run_id, parent.name)
    assert sorted((row["id"], row["name"]) for row in rest) == sorted((job.run_id, job.name) for job in jobs)
    assert [row["row"] for row in rest] == [top["row"] + i for i in range(1, len(jobs) + 1)]  # right under it
    assert all(row["left"] > top["left"] for row in rest)  # indented: nested


@pytest.mark.slow
@BROWSER
def test_each_jobs_run_page_shows_its_valid_ppl_and_its_parent(dashboard: Dashboard, page: Page) -> None:
    """The runs table hides metric columns until chosen; a job's own page shows its metrics and parent run."""
    for job in dashboard.jobs:
        page.open(f"{dashboard.url}/#/experiments/{dashboard.experiment_id}/runs/{job.run_id}")
        shown = page.wait_for_text(r"\bvalid_ppl ([0-9.e+-]+) ", f"{job.name}'s valid_ppl")
        assert float(shown[1]) == job.valid_ppl  # the stored value, every digit
        page.wait_for_text(rf"Parent run {re.escape(dashboard.parent.name)}\b", f"{job.name}'s parent run")
        assert job.name in page.text()


@pytest.mark.slow
@BROWSER
def test_an_imported_study_shows_its_parent_with_its_jobs_and_their_numbers(page: Page, tmp_path: Path) -> None:
    """The committed quickstart's runs (reports/quickstart.runs.jsonl), imported into an empty store, are what its
    sweep made: the parent, its four jobs nested under it, each job's valid_ppl as archived."""
    archive = ROOT / "reports" / "quickstart.runs.jsonl"
    store = f"sqlite:///{tmp_path}/mlflow.db"
    result = run_script("nplm-import", str(archive), "--tracking-uri", store, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(store)
    experiment_id = client.get_experiment_by_name("brown").experiment_id
    runs = {r.info.run_id: r for r in client.search_runs([experiment_id])}
    (parent,) = [Run(i, r.info.run_name, None) for i, r in runs.items() if r.data.tags.get("sweep") == "true"]
    jobs = [
        Run(i, r.info.run_name, r.data.metrics.get("valid_ppl"))
        for i, r in runs.items()
        if r.data.tags.get("mlflow.parentRunId") == parent.run_id
    ]
    assert len(jobs) == 4
    with mlflow_ui(store, tmp_path) as url:
        page.open(f"{url}/#/experiments/{experiment_id}?workflowType=machine_learning")
        page.wait_for(f"document.querySelector('[role=row] a[href$=\"/runs/{parent.run_id}\"]')", "the parent run")
        nested_under(page, parent, jobs, tmp_path)
        (mlp9,) = [job for job in jobs if runs[job.run_id].data.tags.get("row") == "MLP9"]
        page.open(f"{url}/#/experiments/{experiment_id}/runs/{mlp9.run_id}")
        shown = page.wait_for_text(r"\bvalid_ppl ([0-9.e+-]+) ", "MLP9's valid_ppl")
        assert float(shown[1]) == mlp9.valid_ppl
