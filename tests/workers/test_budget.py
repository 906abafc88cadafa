"""Spawn budgets in-process: their validation and resolution, what counts as spent, and the
guard around a real run loop (a scripted model, real tools) stopping it with a partial answer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pydantic
import pytest

from registry.budget import Budget
from registry.errors import PersonaError, UserError
from registry.parser import dump_persona, parse_persona
from registry.persona import Persona
from registry.policy import ToolBag, resolve_bag
from registry.settings import Settings
from registry.tools import (
    BaseTool,
    ToolCatalog,
    ToolClass,
    ToolContext,
    ToolResult,
    function_tool,
)
from workers.budget import (
    Allowance,
    BudgetGuard,
    BudgetReached,
    Reached,
    SpawnBudget,
    Spent,
    allowance_of,
    effective,
    exceeded,
    partial_answer,
    remaining,
    report_spent,
    reported_spent,
    tightest,
)
from workers.loop import LoopSetup, LoopState, run_in_thread, run_loop
from workers.messages import Event, Message, TextDelta, ToolResultEvent, Usage
from workers.model import ModelError, ModelReply, ModelRequest
from workers.testing.scripted_model import ScriptedModel, call, fail, text, tool_call, tool_calls

SUMMARY = "Found: db-1 answers. Unfinished: db-2, the tool-call budget ran out."
LAST_REMINDER = "Answer in en. Tools available: none."


# -- the shape ----------------------------------------------------------------------------------


def test_every_limit_is_optional_and_positive() -> None:
    assert Budget().unlimited
    full = Budget(max_tokens=10, max_cost_usd=0.5, max_seconds=30, max_tool_calls=3)
    assert not full.unlimited
    for bad in (
        {"max_tokens": 0},
        {"max_cost_usd": -1},
        {"max_seconds": float("inf")},
        {"max_tool_calls": True},
        {"max_tool_call": 3},
    ):
        with pytest.raises(pydantic.ValidationError):
            Budget.model_validate(bad)


def test_the_tightest_of_each_limit_wins() -> None:
    org = Budget(max_tokens=10_000, max_cost_usd=2.0)
    persona = Budget(max_tokens=5_000, max_seconds=600)
    request = Budget(max_tool_calls=8, max_seconds=900)
    parent = Budget(max_tokens=7_000, max_tool_calls=4)

    assert effective(org, persona, request, parent) == Budget(
        max_tokens=5_000, max_cost_usd=2.0, max_seconds=600, max_tool_calls=4
    )
    assert effective(Budget(), None, None, None) == Budget()
    assert tightest(None, Budget(max_seconds=5)) == Budget(max_seconds=5)


def test_exceeded_names_the_first_limit_reached_with_its_figures() -> None:
    budget = Budget(max_tokens=1000, max_cost_usd=0.01, max_seconds=60, max_tool_calls=3)

    assert exceeded(budget, Spent(tokens=999, cost_usd=0.009, seconds=59, tool_calls=2)) is None
    reached = exceeded(budget, Spent(tokens=1200, tool_calls=3))
    assert reached == Reached(limit="tokens", spent=1200, maximum=1000)
    assert str(reached) == "reached its tokens budget (1200 tokens of max_tokens=1000)"
    figures = {
        "cost": (Spent(cost_usd=0.0123), "0.0123 USD of max_cost_usd=0.01"),
        "time": (Spent(seconds=61.26), "61.3 s of max_seconds=60"),
        "tool_calls": (Spent(tool_calls=3), "3 tool calls of max_tool_calls=3"),
    }
    for limit, (spent, expected) in figures.items():
        found = exceeded(budget, spent)
        assert found is not None and found.limit == limit and found.figures() == expected
    assert exceeded(Budget(), Spent(tokens=10**9)) is None


def test_what_is_left_is_shared_between_children_dispatched_together() -> None:
    budget = Budget(max_tokens=1000, max_cost_usd=1.0, max_seconds=60, max_tool_calls=5)
    spent = Spent(tokens=400, cost_usd=0.5, seconds=20, tool_calls=2)

    assert remaining(budget, spent) == Budget(
        max_tokens=600, max_cost_usd=0.5, max_seconds=40, max_tool_calls=3
    )
    # Time is not shared: children dispatched together run at the same time.
    assert remaining(budget, spent, share=2) == Budget(
        max_tokens=300, max_cost_usd=0.25, max_seconds=40, max_tool_calls=1
    )
    with pytest.raises(BudgetReached) as info:
        remaining(budget, spent.model_copy(update={"tool_calls": 5}))
    assert info.value.reached.limit == "tool_calls"


def test_a_spawn_budget_is_resolved_once_and_sums_its_children() -> None:
    record = SpawnBudget(requested=Budget(max_tool_calls=5), inherited=Budget(max_tokens=900))
    org = Budget(max_tokens=2000, max_seconds=60)

    assert record.resolve(org, Budget(max_tool_calls=4)) == Budget(
        max_tokens=900, max_seconds=60, max_tool_calls=4
    )
    # A resumed attempt, after the organisation's defaults changed, keeps the first limits.
    assert record.resolve(Budget(max_tokens=10), None).max_tokens == 900
    record.tool_calls, record.seconds = 2, 12.5
    record.children = Spent(tokens=300, cost_usd=0.25, tool_calls=3)
    usage = Usage(prompt_tokens=80, completion_tokens=20, total_tokens=100, cost=0.5)
    assert record.total(usage) == Spent(tokens=400, cost_usd=0.75, seconds=12.5, tool_calls=5)
    assert SpawnBudget.model_validate_json(record.model_dump_json()) == record


# -- where budgets come from --------------------------------------------------------------------


#: The organisation's budget when the config file says nothing (see ``OrgBudget``).
ORG_DEFAULT = {"max_tokens": 5_000_000, "max_seconds": 14_400.0, "max_tool_calls": 400}


def test_the_organisation_budget_is_finite_by_default() -> None:
    default = Settings.load(environ={}).budget
    assert default.model_dump() == {**ORG_DEFAULT, "max_cost_usd": None}
    assert not default.unlimited
    # Below the hard limit of one attempt: a long spawn stops with its partial answer first.
    assert default.max_seconds is not None
    assert default.max_seconds < Settings().spawn_time_limit_seconds
    # Budget given in code sets only its own limits; the defaults stand for the rest.
    assert Settings(budget=Budget(max_tool_calls=3)).budget.model_dump() == {
        **ORG_DEFAULT,
        "max_tool_calls": 3,
        "max_cost_usd": None,
    }


def test_the_config_file_replaces_the_organisation_defaults_key_by_key(tmp_path: Path) -> None:
    config = tmp_path / "ongrid.yaml"
    config.write_text(
        "budget:\n  max_tokens: 200000\n  max_cost_usd: 2.5\n  max_seconds: 100000\n",
        encoding="utf-8",
    )

    settings = Settings.load(environ={"ONGRID_CONFIG": str(config)})

    # Given keys replace the default (a larger number lifts it); max_tool_calls keeps its own.
    assert settings.budget.model_dump() == {
        "max_tokens": 200_000,
        "max_cost_usd": 2.5,
        "max_seconds": 100_000.0,
        "max_tool_calls": 400,
    }
    for bad, problem in (
        ("max_tool_calls: 0", "budget.max_tool_calls: Input should be greater than 0"),
        ("max_tokens:", "budget.max_tokens: Value error, null is not a limit: leave the key out"),
        ("max_seconds: null", "or give a larger number to lift it"),
        ("max_turns: 3", "budget.max_turns: Extra inputs are not permitted"),
    ):
        config.write_text(f"budget:\n  {bad}\n", encoding="utf-8")
        with pytest.raises(UserError) as info:
            Settings.load(environ={"ONGRID_CONFIG": str(config)})
        assert f"(from {config})" in str(info.value)
        assert problem in str(info.value)


def test_a_resumed_spawn_resolved_without_a_limit_takes_the_organisations() -> None:
    """A record resolved while the organisation had no default (an earlier version) resumes
    within today's: only its unset limits are filled, its own are kept."""
    record = SpawnBudget(limits=Budget(max_tool_calls=7))
    org = Settings().budget

    assert record.resolve(org, None) == Budget(
        max_tokens=5_000_000, max_seconds=14_400, max_tool_calls=7
    )
    assert record.resolve(Budget(), None) == record.limits  # nothing more to fill


PERSONA = """\
---
name: disk_doctor
description: Finds what fills a disk.
when_to_use: When a disk fills up.
metadata:
  ongrid:
    scope: manager
    budget: {{{budget}}}
---
# Disk doctor
"""


def test_a_persona_budget_is_read_from_its_metadata_and_written_back() -> None:
    text_ = PERSONA.format(budget="max_tool_calls: 6, max_seconds: 120")

    persona = parse_persona(text_, path="agents/disk_doctor.md").persona

    assert persona.metadata.ongrid.budget == Budget(max_tool_calls=6, max_seconds=120)
    again = parse_persona(dump_persona(persona)).persona
    assert again.metadata.ongrid.budget == persona.metadata.ongrid.budget
    assert Persona(name="p", description="d", when_to_use="w").metadata.ongrid.budget is None


@pytest.mark.parametrize(
    ("budget", "problem"),
    [
        ("max_tool_calls: -2", "metadata.ongrid.budget.max_tool_calls: Input should be greater"),
        ("max_token: 100", "metadata.ongrid.budget.max_token: Extra inputs are not permitted"),
        ("max_seconds: yes", "metadata.ongrid.budget.max_seconds: expected a positive number"),
    ],
)
def test_a_bad_persona_budget_names_the_file_and_the_field(budget: str, problem: str) -> None:
    with pytest.raises(PersonaError) as info:
        parse_persona(PERSONA.format(budget=budget), path="agents/disk_doctor.md")
    assert str(info.value).startswith("agents/disk_doctor.md: ")
    assert problem in str(info.value)


# -- the guard around a real loop ---------------------------------------------------------------


@dataclass
class Harness:
    """A loop over ``probe`` tools, guarded by a budget; ``ran`` logs each tool execution."""

    limits: Budget
    extra_tools: list[BaseTool] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    clock: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        log = self.ran

        @function_tool(ToolClass.READ)
        def probe(host: str) -> str:
            """Probe a host."""
            log.append(host)
            return f"{host} answers"

        catalog = ToolCatalog([probe, *self.extra_tools])
        persona = Persona(name="tester", description="d", when_to_use="w")
        self.bag: ToolBag = resolve_bag(persona, catalog, ["*"])
        self.budget = SpawnBudget(limits=self.limits)
        self.state = LoopState(
            messages=[Message(role="system", content="S"), Message(role="user", content="Q")]
        )
        kwargs = {"clock": self.clock} if self.clock is not None else {}
        self.guard = BudgetGuard(self.budget, self.state, **kwargs)
        self.saved: list[float] = []

    def setup(self) -> LoopSetup:
        return LoopSetup(
            session_id="s1",
            spawn_id="w1",
            model_id="test/scripted",
            max_turns=10,
            reminder="Tools available: probe.",
            bag=self.bag,
            tool_context=ToolContext(session_id="s1", spawn_id="w1"),
            run_tool=self.guard.run_tool(run_in_thread),
        )

    def run(
        self, model: Any, last: Any | None = None, then: Callable[[], object] = lambda: None
    ) -> tuple[Reached | None, str]:
        """Run the loop; once a limit is reached, the partial answer from ``last`` (or
        ``model``); ``then`` before the event loop closes (it waits for tool threads).
        Returns (the limit reached, the final text)."""

        async def save(state: LoopState) -> None:
            self.guard.tick()
            self.saved.append(self.budget.seconds)

        async def go() -> tuple[Reached | None, str]:
            setup = self.setup()
            sink = lambda event, _index: self.events.append(event)  # noqa: E731
            try:
                outcome = await run_loop(setup, self.state, self.guard.model(model), sink, save)
            except BudgetReached as exc:
                final = replace(setup, reminder=LAST_REMINDER)
                answer = await partial_answer(
                    last or model, final, self.state, exc.reached, sink, self.guard.completed
                )
                return exc.reached, answer
            finally:
                then()
            return None, outcome.text

        return asyncio.run(go())


def tool_messages(state: LoopState) -> list[Message]:
    return [m for m in state.messages if m.role == "tool"]


def test_a_spawn_stops_at_its_tool_call_limit_with_a_partial_answer() -> None:
    run = Harness(Budget(max_tool_calls=2))
    model = ScriptedModel(
        [tool_call("probe", host="db-1"), tool_call("probe", host="db-2"), SUMMARY]
    )

    reached, answer = run.run(model)

    model.assert_done()
    assert reached == Reached(limit="tool_calls", spent=2, maximum=2)
    assert answer == SUMMARY and run.state.final == SUMMARY
    assert run.ran == ["db-1", "db-2"] and run.budget.tool_calls == 2
    last = model.requests[-1]
    assert last.tools == []  # the last call is offered no tools
    assert last.messages[-2].content == f"<system-reminder>\n{LAST_REMINDER}\n</system-reminder>"
    ask = last.messages[-1]
    assert ask.role == "user" and "reached its tool_calls budget" in ask.content
    assert "2 tool calls of max_tool_calls=2" in ask.content
    assert "what is still unfinished" in ask.content
    assert run.state.messages[-2:] == [ask, Message(role="assistant", content=SUMMARY)]
    assert run.state.turns == 3 and run.state.usage.model_calls == 3
    assert "".join(e.text for e in run.events if isinstance(e, TextDelta)) == SUMMARY


def test_calls_run_together_past_the_limit_are_reported_run_or_not_run() -> None:
    run = Harness(Budget(max_tool_calls=2))
    batch = tool_calls(*(call("probe", host=h) for h in ("db-1", "db-2", "db-3")))
    model = ScriptedModel([batch, SUMMARY])

    reached, answer = run.run(model)

    model.assert_done()
    assert reached is not None and reached.limit == "tool_calls" and answer == SUMMARY
    assert sorted(run.ran) == ["db-1", "db-2"]  # the third was refused before it ran
    results = [m.content for m in tool_messages(run.state)]
    assert results[:2] == ["db-1 answers", "db-2 answers"]
    assert results[2].startswith("not run: the task reached its tool_calls budget")
    assert [e.content for e in run.events if isinstance(e, ToolResultEvent)] == results
    assert run.state.pending == []


def test_tokens_are_checked_before_the_next_tool_call() -> None:
    run = Harness(Budget(max_tokens=1000))
    used = Usage(prompt_tokens=500, completion_tokens=100, total_tokens=600, model_calls=1)
    model = ScriptedModel(
        [
            tool_calls(call("probe", host="db-1"), usage=used),
            tool_calls(call("probe", host="db-2"), usage=used),
            SUMMARY,
        ]
    )

    reached, answer = run.run(model)

    model.assert_done()
    assert reached == Reached(limit="tokens", spent=1200, maximum=1000)
    assert run.ran == ["db-1"] and answer == SUMMARY
    assert tool_messages(run.state)[-1].content.startswith("not run: ")


def test_cost_stops_the_spawn_before_its_first_tool_call() -> None:
    run = Harness(Budget(max_cost_usd=0.01))
    model = ScriptedModel(
        [tool_calls(call("probe", host="db-1"), usage=Usage(cost=0.02, model_calls=1)), SUMMARY]
    )

    reached, _ = run.run(model)

    assert reached is not None and reached.limit == "cost" and run.ran == []


def test_seconds_are_counted_from_the_saved_ones_and_checked_before_each_call() -> None:
    now = [100.0]
    run = Harness(Budget(max_seconds=30), clock=lambda: now[0])
    run.budget.seconds = 25.0  # an earlier attempt ran 25 s
    run.guard = BudgetGuard(run.budget, run.state, clock=lambda: now[0])

    class Ticking:
        """Each call takes 3 s of the clock."""

        def __init__(self) -> None:
            self.inner = ScriptedModel(
                [tool_call("probe", host="db-1"), tool_call("probe", host="db-2")]
            )

        async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
            now[0] += 3
            async for item in self.inner.stream(request):
                yield item

    reached, answer = run.run(Ticking(), last=ScriptedModel([SUMMARY]))

    assert reached == Reached(limit="time", spent=31.0, maximum=30)
    assert run.ran == ["db-1"] and answer == SUMMARY
    assert run.saved[0] == 28.0  # a checkpoint saves the seconds run so far


def test_a_model_call_still_running_when_the_seconds_run_out_is_cut_off() -> None:
    run = Harness(Budget(max_seconds=0.2))

    class Stalled:
        async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
            yield "Looking"
            await asyncio.Event().wait()  # never answers

    reached, answer = run.run(Stalled(), last=ScriptedModel([SUMMARY]))

    assert reached is not None and reached.limit == "time" and answer == SUMMARY


def test_a_tool_call_still_running_when_the_seconds_run_out_is_cut_off() -> None:
    gate = threading.Event()

    @function_tool(ToolClass.READ)
    def hang() -> str:
        """Wait for a gate."""
        gate.wait(60)
        return "gate opened"

    run = Harness(Budget(max_seconds=0.2), extra_tools=[hang])
    model = ScriptedModel([tool_call("hang"), SUMMARY])
    try:
        reached, answer = run.run(model, then=gate.set)
    finally:
        gate.set()

    assert reached is not None and reached.limit == "time" and answer == SUMMARY
    (result,) = tool_messages(run.state)
    assert result.content.startswith("stopped: the task reached its time budget (")
    assert "while this call ran; its outcome is unknown" in result.content


def test_a_failed_partial_answer_raises_its_model_error() -> None:
    run = Harness(Budget(max_tool_calls=1))
    broken = ModelError("test/scripted", "boom", status=500, retryable=False)
    model = ScriptedModel([tool_call("probe", host="db-1"), fail(broken)])

    with pytest.raises(ModelError):
        run.run(model)
    empty = Harness(Budget(max_tool_calls=1))
    with pytest.raises(ModelError, match="came back empty"):
        empty.run(ScriptedModel([tool_call("probe", host="db-1"), text("  ")]))


# -- children -----------------------------------------------------------------------------------


class Dispatch(BaseTool):
    """A stand-in for ``spawn_agent``: takes the allowance, reports what its child spent."""

    name = "dispatch"
    description = "Dispatch a child."
    tool_class = ToolClass.READ

    class Args(pydantic.BaseModel):
        task: str

    args_model = Args

    def __init__(self, child_spent: Spent, hold: float = 0.0) -> None:
        self.child_spent, self.hold = child_spent, hold
        self.caps: list[Budget] = []

    def run(self, arguments: pydantic.BaseModel, context: ToolContext) -> ToolResult:
        allowance = allowance_of(context)
        assert allowance is not None
        self.caps.append(allowance.for_child())
        threading.Event().wait(self.hold)  # the child runs
        return ToolResult("child done", data=report_spent({"spawn_id": "c"}, self.child_spent))


def test_children_share_what_is_left_and_their_spend_counts() -> None:
    dispatch = Dispatch(Spent(tokens=300, cost_usd=0.1, seconds=50, tool_calls=2))
    run = Harness(Budget(max_tokens=2000, max_tool_calls=9), extra_tools=[dispatch])
    used = Usage(total_tokens=200, model_calls=1)
    batch = tool_calls(call("dispatch", task="a"), call("dispatch", task="b"), usage=used)
    model = ScriptedModel([batch, "All done."])

    reached, answer = run.run(model)

    assert reached is None and answer == "All done."
    # Each of the two got half of what was left at its dispatch: of 1800 tokens, and of 8 then 7
    # tool calls (each dispatch is a call): together they cannot pass the coordinator's 9.
    assert dispatch.caps == [
        Budget(max_tokens=900, max_tool_calls=4),
        Budget(max_tokens=900, max_tool_calls=3),
    ]
    assert run.budget.tool_calls == 2
    assert run.budget.children == Spent(tokens=600, cost_usd=0.2, seconds=0, tool_calls=4)


def test_a_dispatch_with_nothing_left_for_the_child_stops_the_spawn() -> None:
    dispatch = Dispatch(Spent())
    run = Harness(Budget(max_tool_calls=2), extra_tools=[dispatch])
    model = ScriptedModel(
        [tool_call("probe", host="db-1"), tool_call("dispatch", task="a"), SUMMARY]
    )

    reached, answer = run.run(model)

    assert reached == Reached(limit="tool_calls", spent=2, maximum=2) and answer == SUMMARY
    assert dispatch.caps == []


def test_a_child_within_the_allowance_is_waited_for_past_the_deadline() -> None:
    dispatch = Dispatch(Spent(tokens=5), hold=0.6)
    run = Harness(Budget(max_seconds=0.2), extra_tools=[dispatch])
    model = ScriptedModel([tool_call("dispatch", task="a"), SUMMARY])

    reached, answer = run.run(model)

    # The child stops at the same deadline on its own: its result is the coordinator's to use.
    assert reached is not None and reached.limit == "time" and answer == SUMMARY
    assert tool_messages(run.state)[0].content == "child done"
    assert run.budget.children.tokens == 5


def test_reported_spend_travels_in_the_result_data_only_as_spent() -> None:
    assert reported_spent(ToolResult("x", data=report_spent({}, Spent(tokens=1)))) == Spent(
        tokens=1
    )
    assert reported_spent(ToolResult("x", data={"budget_spent": {"tokens": 1}})) is None
    assert reported_spent(ToolResult("x")) is None
    allowance = Allowance(Budget(max_tokens=10), Spent(tokens=4))
    assert not allowance.granted
    assert allowance.for_child() == Budget(max_tokens=6) and allowance.granted
