"""Where the suite's time goes: wall and CPU per test and per module.

Each test process notes, for every test, the CPU time it used itself and the CPU time of the
processes it started and waited for (workers, the API, servers: ``os.times`` counts a child once
it is reaped; a worker forked by :mod:`zygote`, once the zygote reaped it), and hands both to the
process that reports (xdist's controller, or the same one) in the test's last report. At the end
of the run the report shows the modules by wall time and the slowest tests, each with its CPU;
``ONGRID_TEST_TIMING=<file>`` also writes every test's figures there as JSON.

Wall time is what a test waits for, CPU what it costs the machine: on two cores the suite is
bound by the sum of the CPU, whatever the number of test processes.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
import zygote

__all__ = ["Timing"]

#: How many modules and tests the end-of-run report lists.
SHOWN_MODULES = 20
SHOWN_TESTS = 30


def _cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its reaped children, the processes
    its zygote forked for it included."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system + zygote.reaped_cpu()


@dataclass
class _Test:
    wall: float = 0.0
    cpu_self: float = 0.0
    cpu_children: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


class Timing:
    """The plugin: registered once per pytest process by ``tests/conftest.py``."""

    def __init__(self) -> None:
        self._started: dict[str, tuple[float, float]] = {}
        self.tests: dict[str, _Test] = defaultdict(_Test)

    # -- in the process that runs the test ------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self._started[item.nodeid] = _cpu()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        started = self._started.get(item.nodeid)
        if call.when == "teardown" and started is not None:
            now = _cpu()
            report.user_properties = [
                *report.user_properties,
                ("cpu_self_s", round(now[0] - started[0], 3)),
                ("cpu_children_s", round(now[1] - started[1], 3)),
            ]
            del self._started[item.nodeid]
        return report

    # -- in the process that reports --------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = self.tests[report.nodeid]
        test.wall += report.duration
        test.phases[report.when] = report.duration
        for name, value in report.user_properties:
            if name == "cpu_self_s":
                test.cpu_self = float(value)
            elif name == "cpu_children_s":
                test.cpu_children = float(value)

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if not self.tests or hasattr(config, "workerinput"):  # an xdist worker shows nothing
            return
        write = terminalreporter.write_line
        modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for nodeid, test in self.tests.items():
            totals = modules[nodeid.split("::")[0]]
            totals[0] += test.wall
            totals[1] += test.cpu_self + test.cpu_children
            totals[2] += 1
        wall = sum(t.wall for t in self.tests.values())
        cpu = sum(t.cpu_self + t.cpu_children for t in self.tests.values())
        terminalreporter.section("where the time went")
        write(f"{len(self.tests)} tests: {wall:.0f} s of test wall time, {cpu:.0f} s of CPU")
        write(f"modules by wall time (top {SHOWN_MODULES}):   wall s    CPU s  tests")
        ranked = sorted(modules.items(), key=lambda kv: -kv[1][0])[:SHOWN_MODULES]
        for module, (m_wall, m_cpu, count) in ranked:
            write(f"  {module:<60} {m_wall:7.1f}  {m_cpu:7.1f}  {count:5d}")
        write(f"tests by wall time (top {SHOWN_TESTS}):   wall s    CPU s (self + children)")
        slowest = sorted(self.tests.items(), key=lambda kv: -kv[1].wall)[:SHOWN_TESTS]
        for nodeid, test in slowest:
            write(f"  {test.wall:7.1f}  {test.cpu_self:6.1f} + {test.cpu_children:6.1f}  {nodeid}")
        target = os.environ.get("ONGRID_TEST_TIMING")
        if target:
            rows = {
                nodeid: {
                    "wall_s": round(t.wall, 3),
                    "cpu_self_s": t.cpu_self,
                    "cpu_children_s": t.cpu_children,
                    "phases_s": {k: round(v, 3) for k, v in t.phases.items()},
                }
                for nodeid, t in self.tests.items()
            }
            with open(target, "w", encoding="utf-8") as out:
                json.dump(rows, out, indent=1, sort_keys=True)
            write(f"every test's figures: {target}")
