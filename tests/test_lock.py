"""requirements.lock, the pins CI installs and a report's readers install again (docs/install.md): every
requirement of pyproject.toml, its dependencies and the test extra CI installs, is pinned there, once, to a version
its range allows, torch at the CPU build's 2.13.0."""

from __future__ import annotations

from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def pins(text: str) -> dict[str, Version]:
    """`name==version` lines, by canonical name; a name pinned twice, or a line that pins nothing, fails."""
    found: dict[str, Version] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, _, version = line.partition("==")
        assert version and canonicalize_name(name) not in found, line
        found[canonicalize_name(name)] = Version(version)
    return found


def test_every_requirement_of_the_project_and_its_test_extra_is_pinned_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = pins((ROOT / "requirements.lock").read_text())
    wanted = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]]
    for requirement in wanted:
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{requirement} is not in requirements.lock: run .ci/lock"
        assert requirement.specifier.contains(locked[name], prereleases=True), (requirement, locked[name])
    assert locked["torch"] == Version("2.13.0")


def test_a_pin_list_that_names_a_package_twice_or_pins_nothing_is_refused() -> None:
    assert pins("# a comment\nfoo==1.0\nBar_baz==2.0\n") == {"foo": Version("1.0"), "bar-baz": Version("2.0")}
    for bad in ("foo==1.0\nFoo==1.1\n", "foo>=1.0\n"):
        try:
            pins(bad)
        except AssertionError:
            continue
        raise AssertionError(f"{bad!r} was taken")
