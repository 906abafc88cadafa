"""The ReAct loop in-process: a scripted model, a real tool bag, a list sink and checkpoints."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from registry.budget import CallLimits
from registry.persona import PermissionMode, Persona
from registry.policy import ToolBag, resolve_bag
from registry.tools import ToolCatalog, ToolClass, ToolContext, function_tool
from workers.demo_model import _BANNER, DemoModel
from workers.loop import (
    Approval,
    LoopSetup,
    LoopState,
    Outcome,
    approval_hash,
    over_limits,
    run_loop,
)
from workers.messages import (
    ConfirmationRequired,
    Event,
    Message,
    Requester,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
)
from workers.model import Model, ModelError, ModelReply, ModelRequest, ToolSpec
from workers.testing.scripted_model import (
    ScriptedModel,
    call,
    fail,
    text,
    tool_call,
    tool_calls,
)
from workers.tools import default_catalog

SYSTEM = "You are a test specialist."
QUESTION = "Why is db-1 slow?"
REMINDER = "Answer in en-GB. Tools: read_metric, restart_service."
#: The loop's clock in these tests, and the approval TTL they run with.
CLOCK, TTL = 1_700_000_000.0, 600.0


# --- tools and the harness -------------------------------------------------------------------


@dataclass
class Tools:
    """Four tools of every class; ``calls`` logs each execution as (name, arguments)."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)

    def catalog(self) -> ToolCatalog:
        log = self.calls

        @function_tool(ToolClass.READ)
        def read_metric(metric: str, window_minutes: int = 5) -> str:
            """Read a metric's average over the last minutes."""
            log.append(("read_metric", {"metric": metric, "window_minutes": window_minutes}))
            return f"{metric}={len(log) * 10} over {window_minutes}m"

        @function_tool(ToolClass.WRITE)
        def restart_service(service: str) -> str:
            """Restart a service."""
            log.append(("restart_service", {"service": service}))
            return f"restarted {service}"

        @function_tool(ToolClass.DESTRUCTIVE)
        def wipe_disk(device: str) -> str:
            """Erase a disk."""
            log.append(("wipe_disk", {"device": device}))
            return f"wiped {device}"

        @function_tool(ToolClass.READ)
        def flaky_backend() -> str:
            """Query a backend that is down."""
            log.append(("flaky_backend", {}))
            raise ConnectionError("backend at 10.0.0.9:9000 refused the connection")

        return ToolCatalog([read_metric, restart_service, wipe_disk, flaky_backend])


def make_bag(
    tools: Tools, mode: PermissionMode = PermissionMode.DUAL_SIGN_REQUIRED, *names: str
) -> ToolBag:
    persona = Persona(
        name="tester",
        description="Tests the loop.",
        when_to_use="In tests.",
        tools=list(names),
        permission_mode=mode,
    )
    return resolve_bag(persona, tools.catalog(), ["*"])


def fresh_state() -> LoopState:
    return LoopState(
        messages=[Message(role="system", content=SYSTEM), Message(role="user", content=QUESTION)]
    )


@dataclass
class Run:
    """One spawn's loop with its recorded events and checkpoint snapshots."""

    bag: ToolBag
    max_turns: int = 10
    events: list[tuple[Event, int]] = field(default_factory=list)
    saved: list[LoopState] = field(default_factory=list)
    published: dict[str, tuple[str, bool]] = field(default_factory=dict)
    #: Each confirmation request the loop announced, with its index and the checkpoints
    #: taken before it.
    announced: list[tuple[ConfirmationRequired, int, int]] = field(default_factory=list)

    async def announce(self, event: ConfirmationRequired, index: int) -> None:
        self.announced.append((event, index, len(self.saved)))

    def setup(self) -> LoopSetup:
        return LoopSetup(
            session_id="s1",
            spawn_id="w1",
            model_id="test/scripted",
            max_turns=self.max_turns,
            reminder=REMINDER,
            bag=self.bag,
            tool_context=ToolContext(session_id="s1", spawn_id="w1", user="bob", role="operator"),
            published=self.published,
            persona="tester",
            approval_ttl_seconds=TTL,
            announce=self.announce,
            clock=lambda: CLOCK,
        )

    def __call__(self, model: Model, state: LoopState | None = None) -> tuple[Outcome, LoopState]:
        state = state if state is not None else fresh_state()

        async def save(saved: LoopState) -> None:
            self.saved.append(saved.model_copy(deep=True))

        outcome = asyncio.run(
            run_loop(
                self.setup(),
                state,
                model,
                lambda event, index: self.events.append((event, index)),
                save,
            )
        )
        return outcome, state

    def of(self, kind: type) -> list[Any]:
        return [e for e, _ in self.events if isinstance(e, kind)]

    def results(self) -> list[ToolResultEvent]:
        return self.of(ToolResultEvent)


@pytest.fixture
def tools() -> Tools:
    return Tools()


@pytest.fixture
def run(tools: Tools) -> Run:
    return Run(make_bag(tools))


def tool_messages(state: LoopState) -> list[Message]:
    return [m for m in state.messages if m.role == "tool"]


# --- a final answer ----------------------------------------------------------------------------


def test_final_answer_streams_deltas_in_order(run: Run) -> None:
    model = ScriptedModel([text("The ", "disk ", "is ", "full.")])
    outcome, state = run(model)
    model.assert_done()
    assert outcome == Outcome("final", "The disk is full.")
    deltas = run.of(TextDelta)
    assert [d.text for d in deltas] == ["The ", "disk ", "is ", "full."]
    indexes = [i for _, i in run.events]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes)
    assert indexes == list(range(4))
    assert all(e.session_id == "s1" and e.spawn_id == "w1" for e, _ in run.events)
    assert state.messages[-1] == Message(role="assistant", content="The disk is full.")
    assert state.final == "The disk is full." and state.turns == 1 and state.event_index == 4


def test_event_indexes_continue_from_the_saved_index(run: Run) -> None:
    state = fresh_state()
    state.event_index = 7  # the runtime emitted the agent tile (and more) before the loop
    run(ScriptedModel([tool_call("read_metric", metric="cpu"), text("a", "b")]), state)
    assert [i for _, i in run.events] == list(range(7, 7 + len(run.events)))
    assert state.event_index == 7 + len(run.events)


def test_every_request_has_system_first_and_reminder_last(run: Run) -> None:
    model = ScriptedModel(
        [tool_call("read_metric", metric="cpu"), tool_call("read_metric", metric="io"), "done"]
    )
    outcome, state = run(model)
    assert outcome.kind == "final"
    assert len(model.requests) == 3
    reminder = f"<system-reminder>\n{REMINDER}\n</system-reminder>"
    for request in model.requests:
        assert request.model == "test/scripted"
        assert request.messages[0] == Message(role="system", content=SYSTEM)
        assert request.messages[1] == Message(role="user", content=QUESTION)
        assert request.messages[-1] == Message(role="user", content=reminder)
        assert sum(1 for m in request.messages if "<system-reminder>" in m.content) == 1
    # Each request is the state so far plus the reminder: the history grows by reply + result.
    assert [len(r.messages) for r in model.requests] == [3, 5, 7]
    assert not any("<system-reminder>" in m.content for m in state.messages)
    assert state.messages[0].role == "system"


def test_tool_schemas_come_from_the_bag(tools: Tools) -> None:
    bag = make_bag(tools, PermissionMode.MUTATING_WITH_CONFIRM)
    assert bag.names() == ["read_metric", "restart_service", "flaky_backend"]
    model = ScriptedModel(["ok"])
    Run(bag)(model)
    specs = model.requests[0].tools
    assert all(type(s) is ToolSpec for s in specs)  # the project's type, no provider's shape
    assert [s.name for s in specs] == bag.names()
    read = specs[0]
    assert read.description == "Read a metric's average over the last minutes."
    params = read.parameters
    assert params["required"] == ["metric"]
    assert set(params["properties"]) == {"metric", "window_minutes"}
    assert params["additionalProperties"] is False


def test_empty_bag_sends_no_tools(tools: Tools) -> None:
    bag = make_bag(tools, PermissionMode.READ_ONLY, "no_such_tool")
    assert len(bag) == 0
    model = ScriptedModel(["nothing to call"])
    outcome, _ = Run(bag)(model)
    assert outcome.kind == "final" and model.requests[0].tools == []


# --- tool calls ----------------------------------------------------------------------------------


def test_tool_call_then_answer(run: Run, tools: Tools) -> None:
    model = ScriptedModel(
        [
            tool_calls(call("read_metric", metric="cpu", window_minutes=15), text="Checking."),
            text("CPU is fine."),
        ]
    )
    outcome, state = run(model)
    model.assert_done()
    assert outcome == Outcome("final", "CPU is fine.")
    assert tools.calls == [("read_metric", {"metric": "cpu", "window_minutes": 15})]
    kinds = [type(e).__name__ for e, _ in run.events]
    assert kinds == ["TextDelta", "ToolCallEvent", "ToolResultEvent", "TextDelta"]
    (called,) = run.of(ToolCallEvent)
    assert (called.call_id, called.name) == ("call_1_0", "read_metric")
    assert json.loads(called.arguments) == {"metric": "cpu", "window_minutes": 15}
    (result,) = run.results()
    assert (result.call_id, result.name, result.is_error) == ("call_1_0", "read_metric", False)
    assert result.content == "cpu=10 over 15m"
    assistant, tool = state.messages[2], state.messages[3]
    assert assistant.role == "assistant" and assistant.content == "Checking."
    assert [c.id for c in assistant.tool_calls] == ["call_1_0"]
    assert tool == Message(
        role="tool", content="cpu=10 over 15m", tool_call_id="call_1_0", name="read_metric"
    )
    # The model saw the result on its second turn, just before the reminder.
    assert model.requests[1].messages[-2] == tool


def test_several_calls_in_one_reply_run_in_order(run: Run, tools: Tools) -> None:
    model = ScriptedModel(
        [
            tool_calls(call("read_metric", metric="a"), call("read_metric", metric="b")),
            "done",
        ]
    )
    _, state = run(model)
    assert [a["metric"] for _, a in tools.calls] == ["a", "b"]
    assert [m.tool_call_id for m in tool_messages(state)] == ["call_1_0", "call_1_1"]
    kinds = [type(e).__name__ for e, _ in run.events]
    assert kinds == ["ToolCallEvent"] * 2 + ["ToolResultEvent"] * 2 + ["TextDelta"]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"metric": "cpu",', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"metric": "cpu", "window_minutes": "a while"}', "window_minutes"),
        ('{"metric": "cpu", "host": "db-1"}', "host"),
        ('{"window_minutes": 5}', "metric"),
    ],
    ids=["invalid-json", "not-an-object", "wrong-type", "unknown-key", "missing-required"],
)
def test_bad_arguments_come_back_as_an_error_result(
    run: Run, tools: Tools, arguments: str, expected: str
) -> None:
    model = ScriptedModel(
        [tool_calls(call("read_metric", raw_arguments=arguments)), "I will try again later."]
    )
    outcome, state = run(model)
    model.assert_done()
    assert outcome == Outcome("final", "I will try again later.")
    assert tools.calls == []  # the tool never ran
    (result,) = run.results()
    assert result.is_error and expected in result.content
    assert "read_metric" in result.content
    (message,) = tool_messages(state)
    assert message.tool_call_id == "call_1_0" and message.content == result.content


def test_invalid_arguments_name_the_problem(run: Run) -> None:
    model = ScriptedModel([tool_calls(call("read_metric", raw_arguments="{}")), "ok"])
    run(model)
    (result,) = run.results()
    assert result.content.startswith("invalid arguments for read_metric: metric:")


def test_empty_arguments_mean_no_arguments(run: Run, tools: Tools) -> None:
    model = ScriptedModel([tool_calls(call("flaky_backend", raw_arguments="")), "ok"])
    run(model)
    assert tools.calls == [("flaky_backend", {})]


def test_a_raising_tool_is_an_observation(run: Run, tools: Tools) -> None:
    model = ScriptedModel(
        [tool_call("flaky_backend"), tool_call("read_metric", metric="cpu"), "Backend is down."]
    )
    outcome, _ = run(model)
    model.assert_done()
    assert outcome == Outcome("final", "Backend is down.")
    first, second = run.results()
    assert first.is_error
    assert first.content == (
        "flaky_backend failed: ConnectionError: backend at 10.0.0.9:9000 refused the connection"
    )
    assert not second.is_error  # the loop carried on and the next call worked
    assert [n for n, _ in tools.calls] == ["flaky_backend", "read_metric"]


def test_a_tool_outside_the_bag_is_refused(tools: Tools) -> None:
    bag = make_bag(tools, PermissionMode.READ_ONLY)  # restart_service and wipe_disk are dropped
    run = Run(bag)
    model = ScriptedModel(
        [tool_call("restart_service", service="db"), tool_call("rm_rf"), "I may not do that."]
    )
    outcome, _ = run(model)
    assert outcome.kind == "final"
    assert tools.calls == []
    refused, unknown = run.results()
    assert refused.is_error and unknown.is_error
    assert refused.content == (
        "tool 'restart_service' is not in your tool bag; available: read_metric, flaky_backend"
    )
    assert "'rm_rf'" in unknown.content and "read_metric, flaky_backend" in unknown.content
    assert run.of(ConfirmationRequired) == []


# --- turns and usage -----------------------------------------------------------------------------


def test_running_out_of_turns_fails_after_exactly_max_turns_calls(tools: Tools) -> None:
    run = Run(make_bag(tools), max_turns=3)
    model = ScriptedModel([tool_call("read_metric", metric=f"m{i}") for i in range(3)])
    outcome, state = run(model)
    model.assert_done()  # exactly three calls: a fourth would have failed loudly
    assert len(model.requests) == 3 and state.turns == 3
    assert outcome.kind == "failed"
    assert "max_turns=3" in outcome.text
    assert tools.count("read_metric") == 3  # the last turn's calls still ran
    assert state.final is None


def test_final_answer_on_the_last_turn_is_final(tools: Tools) -> None:
    run = Run(make_bag(tools), max_turns=2)
    model = ScriptedModel([tool_call("read_metric", metric="cpu"), "just in time"])
    outcome, _ = run(model)
    assert outcome == Outcome("final", "just in time")


def test_usage_is_summed_and_kept_per_turn(run: Run) -> None:
    first = Usage(
        prompt_tokens=100, completion_tokens=10, total_tokens=110, cost=0.5, model_calls=1
    )
    second = Usage(
        prompt_tokens=150, completion_tokens=5, total_tokens=155, cost=0.25, model_calls=1
    )
    model = ScriptedModel(
        [tool_calls(call("read_metric", metric="cpu"), usage=first), text("ok", usage=second)]
    )
    _, state = run(model)
    assert state.turn_usage == [first, second]
    assert state.usage == Usage(
        prompt_tokens=250, completion_tokens=15, total_tokens=265, cost=0.75, model_calls=2
    )


def test_a_model_error_propagates_after_the_last_checkpoint(run: Run) -> None:
    from workers.model import ModelError

    error = ModelError("test/scripted", "overloaded", status=529, retryable=True)
    model = ScriptedModel([tool_call("read_metric", metric="cpu"), fail(error)])
    with pytest.raises(ModelError, match="overloaded"):
        run(model)
    # The tool result was saved: a retry resumes at the second model call.
    assert run.saved[-1].messages[-1].role == "tool" and run.saved[-1].turns == 1


# --- checkpoints and resume ----------------------------------------------------------------------


def describe(state: LoopState) -> tuple[int, int, list[str], list[str]]:
    """(turns, messages, pending ids, started ids) of a snapshot."""
    return (
        state.turns,
        len(state.messages),
        [c.id for c in state.pending],
        list(state.started),
    )


def test_checkpoint_sequence(run: Run) -> None:
    model = ScriptedModel(
        [
            tool_calls(call("read_metric", metric="a"), call("read_metric", metric="b")),
            text("done"),
        ]
    )
    run(model)
    a, b = "call_1_0", "call_1_1"
    assert [describe(s) for s in run.saved] == [
        (1, 3, [a, b], []),  # the model reply, both calls pending
        (1, 3, [a, b], [a, b]),  # write-ahead: both reads are about to run, together
        (1, 5, [], [a, b]),  # both results, in the model's order
        (2, 6, [], [a, b]),  # the final reply
    ]
    assert run.saved[-1].final == "done"
    # Snapshots are independent copies: the live state moved on after each.
    assert run.saved[0].messages[-1].tool_calls[1].id == b


def test_reads_of_one_turn_run_at_the_same_time(tools: Tools) -> None:
    """Each of the two calls waits for the other to have started: run one after the other,
    the first would wait in vain and fail."""
    both_running = threading.Barrier(2, timeout=30)

    @function_tool(ToolClass.READ)
    def rendezvous(name: str) -> str:
        """Meet the other call."""
        both_running.wait()
        return f"{name} met"

    persona = Persona(name="tester", description="d", when_to_use="w", tools=[])
    bag = resolve_bag(persona, ToolCatalog([rendezvous]), ["*"])
    model = ScriptedModel(
        [tool_calls(call("rendezvous", name="a"), call("rendezvous", name="b")), "ok"]
    )
    run = Run(bag)
    outcome, state = run(model)
    assert outcome.kind == "final"
    assert [m.content for m in tool_messages(state)] == ["a met", "b met"]  # the model's order


def test_a_read_after_a_call_that_needs_a_person_waits_its_turn(run: Run, tools: Tools) -> None:
    model = ScriptedModel(
        [tool_calls(call("restart_service", service="db"), call("read_metric", metric="a"))]
    )
    outcome, state = run(model)
    assert outcome.kind == "interrupted" and tools.calls == []
    assert [c.name for c in state.pending] == ["restart_service", "read_metric"]


def test_resume_after_the_first_of_two_tools(tools: Tools) -> None:
    first_run = Run(make_bag(tools))
    script = [
        tool_calls(call("read_metric", metric="a"), call("read_metric", metric="b")),
        text("a and b are fine"),
    ]
    first_run(ScriptedModel(script))
    assert tools.count("read_metric") == 2
    # A state with the first call's result saved and the second not started (an earlier
    # attempt that ran them in order died there).
    saved = first_run.saved[0].model_copy(deep=True)
    first, _ = saved.pending
    saved.messages.append(
        Message(role="tool", content="a=10", tool_call_id=first.id, name=first.name)
    )
    saved.pending.pop(0)
    saved.started.append(first.id)
    assert describe(saved) == (1, 4, ["call_1_1"], ["call_1_0"])

    tools.calls.clear()
    resumed = Run(make_bag(tools))
    model = ScriptedModel(script[1:])  # only the steps not consumed before the crash
    outcome, state = resumed(model, saved.model_copy(deep=True))
    model.assert_done()
    assert outcome == Outcome("final", "a and b are fine")
    assert tools.calls == [("read_metric", {"metric": "b", "window_minutes": 5})]
    assert [m.tool_call_id for m in tool_messages(state)] == ["call_1_0", "call_1_1"]
    assert len(model.requests) == 1 and state.turns == 2
    # The resumed model call saw both results, in call order, each once.
    seen = [m.tool_call_id for m in model.requests[0].messages if m.role == "tool"]
    assert seen == ["call_1_0", "call_1_1"]
    # Events keep counting from the saved index, so the sink can drop replays.
    assert [i for _, i in resumed.events][0] == saved.event_index


def test_resume_from_the_reply_checkpoint_runs_both_tools_once(tools: Tools) -> None:
    first_run = Run(make_bag(tools))
    script = [
        tool_calls(call("read_metric", metric="a"), call("read_metric", metric="b")),
        text("fine"),
    ]
    first_run(ScriptedModel(script))
    tools.calls.clear()
    model = ScriptedModel(script[1:])
    outcome, _ = Run(make_bag(tools))(model, first_run.saved[0].model_copy(deep=True))
    model.assert_done()
    assert outcome.kind == "final"
    assert [a["metric"] for _, a in tools.calls] == ["a", "b"]


def test_resume_of_a_finished_state_calls_nothing(tools: Tools) -> None:
    first_run = Run(make_bag(tools))
    first_run(ScriptedModel(["all done"]))
    model = ScriptedModel()
    outcome, _ = Run(make_bag(tools))(model, first_run.saved[-1])
    assert outcome == Outcome("final", "all done") and model.requests == []


def test_a_call_that_was_running_when_the_worker_died_is_not_rerun(run: Run, tools: Tools) -> None:
    state = fresh_state()
    pending = call("restart_service", service="db", call_id="c9")
    state.messages.append(Message(role="assistant", tool_calls=[pending]))
    state.turns = 1
    state.pending = [pending]
    state.started = ["c9"]
    state.approvals["c9"] = Approval(approved_by=["alice"])
    model = ScriptedModel(["I will check whether db restarted."])
    outcome, state = run(model, state)
    model.assert_done()
    assert outcome.kind == "final"
    assert tools.calls == []
    (result,) = run.results()
    assert result.is_error and result.call_id == "c9"
    assert result.content.startswith("interrupted:") and "outcome is unknown" in result.content
    assert model.requests[0].messages[-2] == Message(
        role="tool", content=result.content, tool_call_id="c9", name="restart_service"
    )


def test_a_result_the_lost_attempt_published_is_reported_not_interrupted(tools: Tools) -> None:
    """The lost attempt ran the call and published its result, then died before the checkpoint
    that records it: the resumed attempt reports that result (it is the one on the event
    stream), neither running the call again nor calling its outcome unknown."""
    state = fresh_state()
    pending = call("restart_service", service="db", call_id="c9")
    state.messages.append(Message(role="assistant", tool_calls=[pending]))
    state.turns, state.pending, state.started = 1, [pending], ["c9"]
    state.approvals["c9"] = Approval(approved_by=["alice"])
    run = Run(make_bag(tools))
    run.published = {"c9": ("restarted db", False)}
    model = ScriptedModel(["db restarted."])

    outcome, state = run(model, state)

    assert outcome.kind == "final" and tools.calls == []
    (result,) = run.results()
    assert (result.call_id, result.content, result.is_error) == ("c9", "restarted db", False)
    assert model.requests[0].messages[-2].content == "restarted db"


def test_an_idempotent_tool_interrupted_by_a_crash_runs_again_with_its_call_id() -> None:
    seen: list[str] = []

    @function_tool(ToolClass.READ)
    def attach(job: str, context: ToolContext) -> str:
        """Attach to a job (repeats are harmless)."""
        seen.append(context.call_id)
        return f"attached to {job}"

    attach.idempotent = True
    persona = Persona(name="t", description="d", when_to_use="w")
    run = Run(resolve_bag(persona, ToolCatalog([attach]), ["*"]))
    state = fresh_state()
    pending = call("attach", job="j1", call_id="c7")
    state.messages.append(Message(role="assistant", tool_calls=[pending]))
    state.turns, state.pending, state.started = 1, [pending], ["c7"]
    model = ScriptedModel(["Attached."])
    outcome, _ = run(model, state)
    model.assert_done()
    assert outcome.kind == "final" and seen == ["c7"]
    (result,) = run.results()
    assert not result.is_error and result.content == "attached to j1"


def test_a_reused_call_id_does_not_inherit_the_earlier_call(tools: Tools) -> None:
    # Some providers number calls per reply ("call_0" on every turn), or send no id at all.
    run = confirm_run(tools, PermissionMode.MUTATING_WITH_CONFIRM)
    first = tool_calls(call("restart_service", service="db", call_id="call_0"))
    _, state = run(ScriptedModel([first]))
    state.approvals["call_0"].approved_by.append("alice")
    again = tool_calls(call("restart_service", service="web", call_id="call_0"))
    outcome, state = run(ScriptedModel([again]), state)
    # The second restart is a new call: it must wait for its own approval, not reuse alice's.
    assert outcome.kind == "interrupted"
    assert tools.calls == [("restart_service", {"service": "db"})]
    second = run.of(ConfirmationRequired)[-1]
    assert second.call_id != "call_0" and json.loads(second.arguments) == {"service": "web"}
    assert state.messages[-1].tool_calls[0].id == second.call_id


def test_calls_without_ids_each_run(run: Run, tools: Tools) -> None:
    class NoIds:
        def __init__(self) -> None:
            self.inner = ScriptedModel(
                [tool_calls(call("read_metric", metric="a"), call("read_metric", metric="b")), "ok"]
            )

        async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
            async for item in self.inner.stream(request):
                if isinstance(item, ModelReply):
                    calls = [c.model_copy(update={"id": ""}) for c in item.message.tool_calls]
                    message = item.message.model_copy(update={"tool_calls": calls})
                    item = ModelReply(message=message, usage=item.usage)
                yield item

    outcome, state = run(NoIds())
    assert outcome.kind == "final"
    assert [a["metric"] for _, a in tools.calls] == ["a", "b"]
    ids = [m.tool_call_id for m in tool_messages(state)]
    assert all(ids) and len(set(ids)) == 2
    assert [c.id for c in state.messages[2].tool_calls] == ids
    assert [e.call_id for e in run.of(ToolCallEvent)] == ids


# --- confirmations -------------------------------------------------------------------------------


def confirm_run(tools: Tools, mode: PermissionMode) -> Run:
    return Run(make_bag(tools, mode))


def test_a_write_call_waits_for_one_approval(tools: Tools) -> None:
    run = confirm_run(tools, PermissionMode.MUTATING_WITH_CONFIRM)
    model = ScriptedModel([tool_call("restart_service", service="db")])
    outcome, state = run(model)
    model.assert_done()
    assert outcome.kind == "interrupted"
    assert outcome.call is not None and outcome.call.id == "call_1_0"
    assert "restart_service" in outcome.text and "once" in outcome.text
    (asked,) = run.of(ConfirmationRequired)
    assert (asked.call_id, asked.name, asked.confirmation) == (
        "call_1_0",
        "restart_service",
        "once",
    )
    assert json.loads(asked.arguments) == {"service": "db"}
    (pending,) = state.pending
    requested = Approval(
        args_hash=approval_hash("w1", pending),
        requested_by=Requester(user="bob", role="operator", persona="tester"),
        expires_at=CLOCK + TTL,
    )
    assert (asked.args_hash, asked.requested_by, asked.expires_at, asked.needed) == (
        requested.args_hash,
        requested.requested_by,
        CLOCK + TTL,
        1,
    )
    assert tools.calls == [] and state.approvals == {"call_1_0": requested}
    assert run.saved[-1].approvals == {"call_1_0": requested}  # the request was checkpointed

    # Resumed before anyone decided: still waiting, and the request is not emitted again.
    outcome, state = run(ScriptedModel(), state)
    assert outcome.kind == "interrupted"
    assert len(run.of(ConfirmationRequired)) == 1
    assert tools.calls == []

    state.approvals["call_1_0"].approved_by.append("alice")
    model = ScriptedModel(["db restarted"])
    outcome, state = run(model, state)
    model.assert_done()
    assert outcome == Outcome("final", "db restarted")
    assert tools.calls == [("restart_service", {"service": "db"})]
    assert run.results()[-1].content == "restarted db"


def test_a_request_is_announced_before_the_checkpoint_that_records_it(tools: Tools) -> None:
    run = confirm_run(tools, PermissionMode.MUTATING_WITH_CONFIRM)
    _, state = run(ScriptedModel([tool_call("restart_service", service="db")]))
    (asked,) = run.of(ConfirmationRequired)
    ((announced, index, checkpoints),) = run.announced
    assert announced == asked and index == [i for e, i in run.events if e is asked][0]
    assert "call_1_0" not in run.saved[checkpoints - 1].approvals  # announced, then recorded
    assert "call_1_0" in run.saved[checkpoints].approvals
    run(ScriptedModel(), state)  # resumed undecided: nothing announced again
    assert len(run.announced) == 1


def test_an_expired_request_is_reported_to_the_model_and_never_runs(tools: Tools) -> None:
    run = confirm_run(tools, PermissionMode.MUTATING_WITH_CONFIRM)
    _, state = run(ScriptedModel([tool_call("restart_service", service="db")]))
    state.approvals["call_1_0"].expired = True
    model = ScriptedModel(["Nobody answered; db was not restarted."])
    outcome, state = run(model, state)
    model.assert_done()
    assert outcome.kind == "final" and tools.calls == []
    (result,) = run.results()
    assert result.is_error and result.call_id == "call_1_0"
    assert "expired undecided at 2023-11-14T22:23:20+00:00" in result.content
    assert "the call was not run" in result.content
    assert model.requests[0].messages[-2].content == result.content


def test_an_approval_bound_to_other_arguments_does_not_run_the_call(tools: Tools) -> None:
    run = confirm_run(tools, PermissionMode.MUTATING_WITH_CONFIRM)
    _, state = run(ScriptedModel([tool_call("restart_service", service="db")]))
    other = state.pending[0].model_copy(update={"arguments": '{"service": "web"}'})
    state.approvals["call_1_0"].args_hash = approval_hash("w1", other)
    state.approvals["call_1_0"].approved_by.append("alice")
    outcome, _ = run(ScriptedModel(["Not restarted."]), state)
    assert outcome.kind == "final" and tools.calls == []
    (result,) = run.results()
    assert result.is_error and "approval was given for other arguments" in result.content


def test_a_denied_call_is_reported_to_the_model(tools: Tools) -> None:
    run = confirm_run(tools, PermissionMode.MUTATING_WITH_CONFIRM)
    _, state = run(ScriptedModel([tool_call("restart_service", service="db")]))
    state.approvals["call_1_0"].denied_by = "carol"
    model = ScriptedModel(["Understood, not restarting."])
    outcome, state = run(model, state)
    model.assert_done()
    assert outcome.kind == "final"
    assert tools.calls == []
    (result,) = run.results()
    assert result.is_error and "denied" in result.content and "carol" in result.content
    assert model.requests[0].messages[-2].tool_call_id == "call_1_0"


def test_reads_do_not_wait_for_confirmation(tools: Tools) -> None:
    run = confirm_run(tools, PermissionMode.MUTATING_WITH_CONFIRM)
    outcome, _ = run(ScriptedModel([tool_call("read_metric", metric="cpu"), "ok"]))
    assert outcome.kind == "final" and run.of(ConfirmationRequired) == []


def test_a_read_before_a_write_runs_and_the_write_waits(tools: Tools) -> None:
    run = confirm_run(tools, PermissionMode.MUTATING_WITH_CONFIRM)
    reply = tool_calls(call("read_metric", metric="cpu"), call("restart_service", service="db"))
    outcome, state = run(ScriptedModel([reply]))
    assert outcome.kind == "interrupted"
    assert [n for n, _ in tools.calls] == ["read_metric"]
    assert [c.id for c in state.pending] == ["call_1_1"]


def test_a_destructive_call_needs_two_different_approvers(tools: Tools) -> None:
    run = confirm_run(tools, PermissionMode.DUAL_SIGN_REQUIRED)
    outcome, state = run(ScriptedModel([tool_call("wipe_disk", device="/dev/sdb")]))
    assert outcome.kind == "interrupted"
    (asked,) = run.of(ConfirmationRequired)
    assert asked.confirmation == "dual"

    state.approvals["call_1_0"].approved_by.append("alice")
    outcome, state = run(ScriptedModel(), state)
    assert outcome.kind == "interrupted" and tools.calls == []

    state.approvals["call_1_0"].approved_by.append("alice")  # the same person again
    outcome, state = run(ScriptedModel(), state)
    assert outcome.kind == "interrupted" and tools.calls == []

    state.approvals["call_1_0"].approved_by.append("bob")
    model = ScriptedModel(["wiped"])
    outcome, state = run(model, state)
    model.assert_done()
    assert outcome.kind == "final"
    assert tools.calls == [("wipe_disk", {"device": "/dev/sdb"})]
    assert len(run.of(ConfirmationRequired)) == 1


def test_a_write_under_dual_sign_needs_one_approval(tools: Tools) -> None:
    run = confirm_run(tools, PermissionMode.DUAL_SIGN_REQUIRED)
    _, state = run(ScriptedModel([tool_call("restart_service", service="db")]))
    assert run.of(ConfirmationRequired)[0].confirmation == "once"
    state.approvals["call_1_0"].approved_by.append("alice")
    outcome, _ = run(ScriptedModel(["ok"]), state)
    assert outcome.kind == "final" and tools.count("restart_service") == 1


# --- the scripted model itself -------------------------------------------------------------------


def test_scripted_model_fails_loudly_when_called_once_too_often(run: Run) -> None:
    model = ScriptedModel([tool_call("read_metric", metric="cpu")])
    with pytest.raises(AssertionError, match=r"unexpected call #2.*test/scripted.*read_metric"):
        run(model)


def test_scripted_model_reports_left_over_steps(run: Run) -> None:
    model = ScriptedModel(["first", text("never", " sent")])
    run(model)
    with pytest.raises(AssertionError, match=r"1 step\(s\) never used.*'never sent'"):
        model.assert_done()


# --- the demo model ------------------------------------------------------------------------------


def demo_bag(*names: str) -> ToolBag:
    persona = Persona(
        name="demo", description="Demo.", when_to_use="Demo.", tools=list(names) or ["none"]
    )
    return resolve_bag(persona, default_catalog(), ["*"])


def run_demo(bag: ToolBag) -> tuple[Outcome, LoopState, Run]:
    run = Run(bag)
    outcome, state = run(DemoModel())
    return outcome, state, run


def test_demo_model_probes_the_host_then_cites_it() -> None:
    bag = demo_bag("host_probe")
    assert bag.names() == ["host_probe"]
    outcome, state, run = run_demo(bag)
    assert outcome.kind == "final"
    (called,) = run.of(ToolCallEvent)
    assert called.name == "host_probe" and json.loads(called.arguments) == {"section": "disk"}
    (result,) = run.results()
    assert not result.is_error and '"hostname"' in result.content
    assert outcome.text.startswith(_BANNER)
    assert f"Question: {QUESTION}" in outcome.text
    assert f"Evidence from host_probe: {result.content.strip()[:100]}" in outcome.text
    assert "".join(d.text for d in run.of(TextDelta)) == outcome.text
    assert state.turns == 2


def test_demo_model_with_an_empty_bag_answers_at_once() -> None:
    outcome, state, run = run_demo(demo_bag())
    assert outcome.kind == "final" and state.turns == 1
    assert outcome.text.startswith(_BANNER)
    assert "no evidence" in outcome.text
    assert run.of(ToolCallEvent) == []


# --- call limits ---------------------------------------------------------------------------------

ADVICE = "Dispatch fewer at once."


def bounded_run(per_reply: int, per_spawn: int) -> tuple[Run, list[str]]:
    """A run over one read tool, ``dispatch``, bounded per reply and per spawn; the list logs
    the targets it ran for."""
    ran: list[str] = []

    @function_tool(ToolClass.READ)
    def dispatch(target: str) -> str:
        """Send someone to look at a target."""
        ran.append(target)
        return f"{target} checked"

    dispatch.call_limits = CallLimits(per_reply=per_reply, per_spawn=per_spawn, advice=ADVICE)
    persona = Persona(name="t", description="d", when_to_use="w")
    return Run(resolve_bag(persona, ToolCatalog([dispatch]), ["*"])), ran


def dispatches(*targets: str) -> Any:
    return tool_calls(*(call("dispatch", target=t) for t in targets))


def test_calls_beyond_the_per_reply_bound_are_answered_with_errors_and_never_run() -> None:
    run, ran = bounded_run(per_reply=2, per_spawn=3)
    model = ScriptedModel([dispatches("a", "b", "c", "d", "e"), dispatches("f", "g", "h"), "ok"])

    outcome, state = run(model)

    model.assert_done()
    assert outcome.kind == "final"
    # Reply 1: the first two run; reply 2: one more reaches the spawn's three.
    assert sorted(ran) == ["a", "b", "f"]
    results = [(r.call_id, r.is_error, r.content) for r in run.results()]
    per_reply = (
        "not run: only the first 2 dispatch calls of one reply run, and this reply made {}. "
        + ADVICE
    )
    per_spawn = (
        "not run: dispatch runs at most 3 times in one task, and all 3 have run. Go on with "
        f"what they returned. {ADVICE}"
    )
    assert results == [
        ("call_1_0", False, "a checked"),
        ("call_1_1", False, "b checked"),
        ("call_1_2", True, per_reply.format(5)),
        ("call_1_3", True, per_reply.format(5)),
        ("call_1_4", True, per_reply.format(5)),
        ("call_2_0", False, "f checked"),
        ("call_2_1", True, per_spawn),
        ("call_2_2", True, per_reply.format(3)),
    ]
    # The model got every result, in its order; refused calls were never marked started.
    assert [m.tool_call_id for m in tool_messages(state)] == [c for c, _, _ in results]
    assert state.started == ["call_1_0", "call_1_1", "call_2_0"]
    assert state.failed_calls == [c for c, error, _ in results if error]
    # The three refusals of reply 1 are answered together, in one checkpoint, after the two
    # admitted calls ran together (one write-ahead mark, one result checkpoint).
    assert [describe(s)[2] for s in run.saved[:4]] == [
        [f"call_1_{i}" for i in range(5)],
        [f"call_1_{i}" for i in range(5)],
        ["call_1_2", "call_1_3", "call_1_4"],
        [],
    ]


def test_a_resumed_attempt_keeps_the_per_spawn_count_and_reruns_nothing() -> None:
    first, ran = bounded_run(per_reply=2, per_spawn=3)
    error = ModelError("test/scripted", "overloaded", status=529, retryable=True)
    with pytest.raises(ModelError):
        first(ScriptedModel([dispatches("a", "b", "c"), fail(error)]))
    assert sorted(ran) == ["a", "b"]
    saved = first.saved[-1]  # the results of reply 1, then the worker was lost

    # A new attempt (a new process: nothing but the checkpoint) with the same bounds.
    again, ran_again = bounded_run(per_reply=2, per_spawn=3)
    model = ScriptedModel([dispatches("d", "e"), "ok"])
    outcome, state = again(model, saved.model_copy(deep=True))

    assert outcome.kind == "final" and ran_again == ["d"]  # a and b counted, c refused: 1 left
    assert [r.is_error for r in again.results()] == [False, True]
    assert "at most 3 times in one task" in state.messages[-2].content

    # Resumed from the reply's own checkpoint, with the write-ahead mark of its first call:
    # that call is counted (it may have run) and reported interrupted, the second runs, the
    # third is still refused, and nothing runs twice.
    mid = first.saved[0].model_copy(deep=True)
    mid.started = ["call_1_0"]
    resumed, ran_resumed = bounded_run(per_reply=2, per_spawn=3)
    outcome, state = resumed(ScriptedModel(["ok"]), mid)
    assert outcome.kind == "final" and ran_resumed == ["b"]
    results = {r.call_id: r for r in resumed.results()}
    assert results["call_1_0"].content.startswith("interrupted:")
    assert results["call_1_1"].content == "b checked"
    assert results["call_1_2"].content.startswith("not run: only the first 2 dispatch calls")


def test_over_limits_is_worked_out_from_the_messages_alone() -> None:
    run, _ = bounded_run(per_reply=1, per_spawn=2)
    reply = Message(
        role="assistant",
        tool_calls=[
            call("dispatch", target="a", call_id="x1"),
            call("unbounded_or_unknown", call_id="x2"),
            call("dispatch", target="b", call_id="x3"),
        ],
    )
    assert set(over_limits([reply], run.bag)) == {"x3"}
    # A call already started is never refused afterwards, whatever the bound says now.
    assert over_limits([reply], run.bag, started={"x3"}) == {}
    assert over_limits([reply, reply], run.bag) == {"x3": over_limits([reply], run.bag)["x3"]}
