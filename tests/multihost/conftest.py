"""Fixtures of the multi-host tests: three hosts in Linux network namespaces, one per module.

- ``hosts`` (module scope): the network of :mod:`netns` (``ctl``, ``w1``, ``w2``, and this
  process as ``lab``) with ctl's Redis, PostgreSQL, fake LLM and API, and a general worker on
  each of w1 and w2, all started fresh for the module and removed after it. A module changes
  what starts with ``pytestmark = pytest.mark.multihost(workers=False, coordinator=True)``:
  ``workers=False`` starts none (the tests start their own with ``hosts.start_worker``),
  ``coordinator=True`` adds a worker of ``ongrid.coordinator`` on w2.

Needs root (network namespaces): elsewhere the tests are skipped with ``ip``'s own words. The
helpers live in ``netns.py`` and ``services.py``, next to this file.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # netns.py, services.py

from netns import IpMissing, NetnsUnavailable, Network  # noqa: E402
from services import Hosts, ServiceMissing  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "multihost(workers=True, coordinator=False): what the module's `hosts` fixture starts",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed test's report carries the tail of every host process's log."""
    report = yield
    started = getattr(item, "funcargs", {}).get("hosts")
    if report.failed and isinstance(started, Hosts):
        report.sections.append(("multihost logs", started.report()))
    return report


@pytest.fixture(scope="module")
def hosts(request: pytest.FixtureRequest) -> Iterator[Hosts]:
    """The module's hosts, their services up; removed however the module ends."""
    marker = request.node.get_closest_marker("multihost")
    options = marker.kwargs if marker is not None else {}
    try:
        network = Network.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"cannot create network namespaces: {exc}")
    except IpMissing as exc:
        pytest.fail(str(exc))
    started = Hosts(network, **options)
    try:
        try:
            started.start()
        except ServiceMissing as exc:
            # Only a kernel that refuses namespaces skips: a missing program is a broken set-up.
            pytest.fail(f"{exc}: install it (./dev test installs what the suite needs)")
        except BaseException:
            print(f"\n{started.report()}")
            raise
        yield started
    finally:
        try:
            started.close()
        finally:
            network.close()
