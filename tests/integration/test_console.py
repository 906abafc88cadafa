"""The web console end to end: headless Chromium, as the people of the config, against a real
``ongrid api`` and worker (the model faked), every request through a proxy the test can cut.

Each test waits only on what the page shows (Playwright's ``expect``, bounded); the site and its
people are :mod:`console_site`'s. Screenshots land in ``artifacts/console/``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import console_site
from console_site import (
    FIX_TASK,
    FIXED,
    LONG_HOLD,
    LONG_WATCH,
    MARKDOWN,
    NIGHTLY,
    NIGHTLY_DONE,
    OPS_ANSWER,
    OPS_QUESTION,
    PERSONAS,
    ROUTE_REASON,
    ROUTED,
    ROUTED_ANSWER,
    STREAMED,
    STREAMED_ANSWER,
    VIEWER_TASK,
    WAIT_MS,
    WARM_UP,
    WARM_UP_ANSWER,
    WIPE,
    WIPED,
    ConsoleSite,
    approval,
    ask,
    background_runs,
    button,
    conversation,
    heading_above,
    last_prose,
    tile,
    wait_under,
)
from harness import MODEL, wait_for
from playwright.sync_api import Locator, Page, expect

from coordinator.storage.chats import ChatStore
from coordinator.storage.engine import make_engine, upgrade
from workers.loop import LoopState
from workers.messages import EVENT_ADAPTER, Message, ToolCall
from workers.spawns import SpawnRecord

# The fixtures, under the names the tests ask for.
chromium = console_site.chromium
console = console_site.console

#: A session's event stream, the one path the SSE-cut test counts connections to.
SESSION_EVENTS = r"^/api/v1/chat/sessions/[^/?]+/events"
#: Seconds the proxy holds back each event of a streamed model reply in the SSE-cut test.
PACE = 0.15


def _agent_row(page: Page, name: str) -> Locator:
    return page.locator(f'[data-testid="agent-row"][data-name="{name}"]')


def _open_editor(page: Page, action: str, name: str) -> None:
    """Click "Edit <name>" or "View <name>", a link or a button."""
    label = f"{action} {name}"
    page.get_by_role("link", name=label, exact=True).or_(
        page.get_by_role("button", name=label, exact=True)
    ).click()
    expect(page.get_by_role("heading", name=label, exact=True)).to_be_visible()


def _wait_persona(
    site: ConsoleSite, name: str, wanted: Callable[[dict[str, Any] | None], Any], what: str
) -> None:
    """Wait until the API's view of persona ``name`` (None: there is none) is ``wanted``."""

    def current() -> dict[str, Any] | None:
        found = site.api("alice").get(f"/api/v1/agents/{name}")
        return found.json() if found.status_code == 200 else None

    wait_for(lambda: wanted(current()), WAIT_MS / 1000, f"persona {name} {what}", every=0.2)


def test_a_routed_question_shows_its_specialist_and_an_approved_call_completes_it(
    console: ConsoleSite,
):
    page = console.visit("alice")
    ask(page, ROUTED)  # no agent picked: the coordinator routes it

    fixer = tile(page, "fixer")
    expect(fixer, "the tile of the specialist the coordinator chose").to_be_visible()
    expect(fixer).to_contain_text("fixer")
    expect(fixer).to_contain_text(PERSONAS["fixer"]["description"])
    expect(fixer.get_by_test_id("tile-reason")).to_contain_text(ROUTE_REASON)
    expect(fixer.get_by_test_id("tile-model")).to_contain_text("gpt-4o-mini")
    tools = fixer.get_by_test_id("tile-tools").locator("li")
    expect(tools).to_have_count(1)
    expect(tools.first).to_contain_text("restart_thing")
    expect(tools.first).to_contain_text("write")

    button(fixer, "Open transcript of fixer").click()
    transcript = page.get_by_role("dialog", name="Transcript of fixer")
    card = approval(transcript, "restart_thing")
    expect(card, "the call waiting for approval, in the transcript").to_be_visible()
    expect(card).to_contain_text("exporter")  # its arguments
    expect(card.get_by_test_id("approval-meaning")).not_to_be_empty()
    button(card, "Approve").click()

    run = transcript.locator('[data-testid="tool-card"][data-tool="restart_thing"]')
    expect(run.get_by_test_id("tool-result")).to_contain_text("restarted exporter")
    expect(transcript.get_by_test_id("transcript-status")).to_contain_text("ok")
    expect(transcript.get_by_test_id("message").last).to_contain_text(FIXED)
    console.shoot(page, "transcript")
    button(transcript, "Close").click()

    expect(last_prose(page), "the coordinator's answer").to_contain_text(ROUTED_ANSWER)
    expect(fixer.get_by_test_id("tile-status")).to_have_text("ok")
    # The coordinator's reply repeats the fixer's answer whole: said once, in the reply.
    expect(fixer.get_by_test_id("tile-notification")).to_have_text(
        "Its answer is in the reply below."
    )
    console.shoot(page, "chat")
    assert console.cluster.tool_runs() == ["restart_thing"]
    bags = {
        tuple(t["function"]["name"] for t in r["tools"])
        for r in console.cluster.fake.requests_for(FIX_TASK)
    }
    assert bags == {("restart_thing",)}  # the tile showed the bag the model was given


def test_a_dual_signed_call_waits_for_a_second_person_in_another_browser(console: ConsoleSite):
    alice = console.visit("alice")
    ask(alice, WIPE, agent="wiper")
    mine = approval(conversation(alice), "wipe_thing")
    expect(mine, "alice's card of the destructive call").to_be_visible()
    spawn_id = tile(alice, "wiper").get_attribute("data-spawn-id")
    assert spawn_id

    # Carol follows a notification's link to the card: the console asks her to sign in first
    # (nothing of the request shows before), then brings that card into view.
    pending = console.api("carol").get("/api/v1/approvals").json()
    (call_id,) = [p["call"]["id"] for p in pending if p["spawn_id"] == spawn_id]
    link = f"/approvals/{spawn_id}/{call_id}"
    stranger = console.open("carol", link)
    expect(button(stranger, "Sign in")).to_be_visible()
    expect(approval(stranger, "wipe_thing")).to_have_count(0)
    stranger.context.close()
    carol = console.visit("carol", link)
    expect(carol.get_by_role("heading", name="Waiting for your decision")).to_be_visible()
    hers = approval(carol, "wipe_thing")
    expect(hers).to_be_visible()
    expect(carol.locator("li.focused").locator('[data-testid="approval"]')).to_have_count(1)
    listing = carol.get_by_role("main")
    expect(listing).to_contain_text("alice")  # the owner
    expect(listing).to_contain_text("wiper")  # the persona
    expect(listing.locator(f'a[href="/spawns/{spawn_id}"]')).to_have_text("Open transcript")
    button(hers, "Approve").click()

    signers = "Approved by carol; needs one more approval from someone else"
    expect(hers.get_by_test_id("approval-signers")).to_contain_text(signers)
    expect(button(hers, "Approve"), "carol's second signature is not offered").to_have_count(0)
    expect(mine.get_by_test_id("approval-signers")).to_contain_text(signers)
    console.shoot(carol, "approvals")
    assert console.status(spawn_id) == "waiting" and console.cluster.tool_runs() == []

    # A link to a request that is not (or no longer) waiting says so, and the list stays.
    erin = console.visit("erin", f"/approvals/{spawn_id}/no-such-call")
    expect(erin.get_by_test_id("focus-gone")).to_contain_text("not waiting for your decision")
    button(approval(erin, "wipe_thing"), "Approve").click()

    expect(last_prose(alice), "the answer, once erin signed too").to_contain_text(WIPED)
    assert console.cluster.tool_runs() == ["wipe_thing"]


def test_a_background_runs_approval_is_decided_in_its_panel_and_it_moves_to_done(
    console: ConsoleSite,
):
    page = console.visit("alice")
    ask(page, NIGHTLY, agent="nightly")
    spawn_id = tile(page, "nightly").get_attribute("data-spawn-id")
    assert spawn_id
    panel = background_runs(page)
    item = panel.locator(f'[data-testid="bg-item"][data-spawn-id="{spawn_id}"]')
    expect(item).to_contain_text("nightly")

    card = approval(panel, "restart_thing")
    expect(card, "the background run's approval in its panel").to_be_visible()
    wait_under(card, "Needs input", "the background run's approval")
    button(card, "Approve").click()

    wait_under(item, "Done", "the background run")
    expect(item.get_by_test_id("bg-notification")).to_have_text(NIGHTLY_DONE)
    assert heading_above(item).startswith("Done")
    assert console.cluster.tool_runs() == ["restart_thing"]


def test_a_persona_is_made_used_edited_and_deleted_and_a_disk_one_is_read_only(
    console: ConsoleSite,
):
    # The server's 422 for the bad name is logged by Chromium as a failed request.
    console.allow_console_error(r"status of 422")
    page = console.visit("alice", "/settings/agents")
    expect(page.get_by_role("heading", name="Agents", exact=True)).to_be_visible()
    button(page, "New persona").click()
    expect(page.get_by_role("heading", name="New persona", exact=True)).to_be_visible()
    name = page.get_by_label("Name", exact=True)
    name.fill("ops helper")  # a space: not a persona name
    page.get_by_label("Description", exact=True).fill("Finds the runbook for an alert.")
    page.get_by_label("When to use", exact=True).fill("When someone asks for a runbook.")
    page.get_by_label("Model", exact=True).fill(MODEL)
    page.get_by_label("System prompt", exact=True).fill("# Ops helper\n\nYou find runbooks.")
    button(page, "Save").click()

    expect(name, "the name's error at its field").to_have_attribute("aria-invalid", "true")
    error = page.locator("#field-name-error")
    expect(error).not_to_be_empty()
    assert "field-name-error" in (name.get_attribute("aria-describedby") or "").split()
    name.fill("ops-helper")
    button(page, "Save").click()
    _wait_persona(console, "ops-helper", lambda found: found is not None, "to be saved")

    page.goto("/settings/agents")
    row = _agent_row(page, "ops-helper")
    expect(row.get_by_test_id("agent-source")).to_have_text("user")
    expect(row.get_by_test_id("agent-availability")).to_have_text("available")

    page.goto("/chat")
    ask(page, OPS_QUESTION, agent="ops-helper")
    expect(last_prose(page), "the new persona's answer").to_have_text(OPS_ANSWER)

    page.goto("/settings/agents")
    _open_editor(page, "Edit", "ops-helper")
    page.get_by_label("Description", exact=True).fill("Finds and explains the runbook.")
    button(page, "Save").click()
    edited = "Finds and explains the runbook."
    _wait_persona(
        console, "ops-helper", lambda found: found and found["description"] == edited, "edited"
    )
    page.goto("/settings/agents")
    _open_editor(page, "Edit", "ops-helper")
    expect(page.get_by_label("Description", exact=True)).to_have_value(edited)
    button(page, "Delete").click()
    button(page, "Confirm delete").click()
    _wait_persona(console, "ops-helper", lambda found: found is None, "to be deleted")

    page.goto("/settings/agents")
    expect(_agent_row(page, "diskonly").get_by_test_id("agent-source")).to_have_text("disk")
    expect(_agent_row(page, "ops-helper"), "the deleted persona's row").to_have_count(0)
    _open_editor(page, "View", "diskonly")
    expect(page.get_by_test_id("read-only-reason")).to_contain_text("disk")
    expect(page.get_by_label("Description", exact=True)).to_be_disabled()
    expect(button(page, "Save as user persona")).to_be_visible()
    console.shoot(page, "agents")

    page.goto("/settings/skills")
    expect(page.get_by_role("heading", name="Skills", exact=True)).to_be_visible()
    skills = page.get_by_role("table", name="Tools your role can see")
    expect(skills.locator('[data-testid="skill-row"][data-name="restart_thing"]')).to_be_visible()
    console.shoot(page, "skills")

    schedule = {
        "name": "nightly-probe",
        "persona": "probe",
        "prompt": "Hosts?",
        "cron": "0 3 * * *",
    }
    assert console.api("alice").post("/api/v1/schedules", json=schedule).status_code == 201
    page.get_by_role("link", name="Schedules", exact=True).click()
    row = page.locator('[data-testid="schedule-row"][data-name="nightly-probe"]')
    expect(row).to_contain_text("cron 0 3 * * * (UTC)")
    expect(row).to_contain_text("alice · admin")
    button(row, "Disable").click()
    expect(button(row, "Enable")).to_be_visible()
    found = console.api("alice").get("/api/v1/schedules/nightly-probe").json()
    assert found["enabled"] is False and found["next_run_at"] is None
    console.shoot(page, "schedules")


def test_a_cut_stream_reconnects_and_the_answer_shows_exactly_once(console: ConsoleSite):
    # The cut drops every connection the page holds: Chromium logs those failed loads.
    console.allow_console_error(r"net::ERR_")
    page = console.visit("alice")
    ask(page, WARM_UP, agent="probe")
    expect(last_prose(page)).to_have_text(WARM_UP_ANSWER)
    indicator = page.get_by_test_id("connection")
    expect(indicator).to_have_text("Live")
    console.llm.pace = PACE  # the next answer arrives a word at a time
    ask(page, STREAMED, agent="probe")
    expect(conversation(page).get_by_test_id("turn")).to_have_count(2)
    prose = last_prose(page)
    expect(prose, "the first words of the answer").to_contain_text(
        " ".join(STREAMED_ANSWER.split()[:4])
    )
    assert prose.inner_text().strip() != STREAMED_ANSWER, "the answer streamed before the cut"
    assert console.proxy.connections_to(SESSION_EVENTS) >= 1
    page.evaluate(_RECORD_STATES)

    assert console.proxy.cut() >= 1

    expect(prose, "the whole answer after the reconnect").to_have_text(STREAMED_ANSWER)
    expect(indicator).to_have_text("Live")
    assert prose.inner_text().strip() == STREAMED_ANSWER  # exactly once, nothing doubled
    assert console.proxy.connections_to(SESSION_EVENTS) >= 2
    seen = page.evaluate("window.__connectionStates")
    print(f"connection states after the cut: {seen}")
    assert set(seen) <= {"Live", "Reconnecting…"}, seen


#: Records each text the connection indicator shows from now on (the element may be replaced).
_RECORD_STATES = """() => {
    window.__connectionStates = [];
    const note = () => {
        const shown = document.querySelector('[data-testid="connection"]');
        const text = shown ? shown.textContent.trim() : "";
        if (text && window.__connectionStates.at(-1) !== text) {
            window.__connectionStates.push(text);
        }
    };
    new MutationObserver(note).observe(document.body, {
        subtree: true, childList: true, characterData: true,
    });
}"""


def test_a_running_spawn_is_cancelled_from_its_tile(console: ConsoleSite):
    page = console.visit("alice")
    ask(page, LONG_WATCH, agent="probe")
    probe = tile(page, "probe")
    expect(probe.get_by_test_id("tile-status")).to_have_text("running")
    console.cluster.fake.wait_requests(LONG_WATCH, 1)  # the model call is in flight, held
    button(probe, "Cancel probe").click()
    expect(button(probe, "Cancel probe")).to_be_disabled()  # asked once, not twice
    # A model call in flight finishes first: cancellation lands at the next checkpoint.
    root = console.cluster.fake.base_url.removesuffix("/v1")
    release = urllib.request.Request(
        f"{root}/_release", data=json.dumps({"hold": LONG_HOLD}).encode(), method="POST"
    )
    urllib.request.urlopen(release, timeout=10).close()
    expect(probe.get_by_test_id("tile-status")).to_have_text("cancelled")
    expect(page.get_by_test_id("turn-end")).to_contain_text("cancelled")
    expect(button(probe, "Cancel probe")).to_have_count(0)


def test_the_chat_works_from_the_keyboard_at_800_pixels(console: ConsoleSite):
    page = console.visit("alice")
    page.set_viewport_size({"width": 800, "height": 900})
    message = page.get_by_label("Message")
    _tab_to(page, message)
    page.keyboard.type(WARM_UP)
    _tab_to(page, page.get_by_label("Agent"))
    page.keyboard.type("probe")  # a select picks the option its typed letters begin
    expect(page.get_by_label("Agent")).to_have_value("probe")
    _tab_to(page, message, backwards=True)
    page.keyboard.press("Control+Enter")  # sends from the text box
    expect(last_prose(page)).to_have_text(WARM_UP_ANSWER)
    opener = button(tile(page, "probe"), "Open transcript of probe")
    _tab_to(page, opener)
    page.keyboard.press("Enter")
    transcript = page.get_by_role("dialog", name="Transcript of probe")
    expect(transcript.get_by_test_id("transcript-status")).to_have_text("ok")
    page.keyboard.press("Escape")
    expect(transcript).to_have_count(0)
    expect(opener, "focus back on the button that opened it").to_be_focused()
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 800, f"the chat scrolls sideways at 800 px: {width} px wide"
    console.shoot(page, "chat-800")


def _tab_to(page: Page, target: Locator, limit: int = 60, backwards: bool = False) -> None:
    """Press Tab (Shift+Tab) until ``target`` has the focus (at most ``limit`` times)."""
    for _ in range(limit):
        page.keyboard.press("Shift+Tab" if backwards else "Tab")
        if target.evaluate("(el) => el === document.activeElement"):
            return
    raise AssertionError(f"{target} not reached with {limit} presses of Tab")


def test_a_viewer_sees_pending_calls_and_personas_without_the_controls_to_change_them(
    console: ConsoleSite,
):
    spawn_id = console.park("alice", "fixer", VIEWER_TASK)

    bob = console.visit("bob", "/approvals")
    card = approval(bob, "restart_thing")
    expect(card).to_contain_text("cache")
    expect(card.get_by_test_id("approval-meaning")).not_to_be_empty()
    expect(button(bob, "Approve")).to_have_count(0)
    expect(button(bob, "Deny")).to_have_count(0)

    bob.goto(f"/spawns/{spawn_id}")
    card = approval(bob, "restart_thing")
    expect(card.get_by_test_id("approval-meaning")).not_to_be_empty()
    expect(button(card, "Approve")).to_have_count(0)
    expect(button(card, "Deny")).to_have_count(0)

    bob.goto("/settings/agents")
    expect(_agent_row(bob, "fixer")).to_be_visible()
    expect(button(bob, "New persona")).to_have_count(0)

    schedule = {"name": "hourly-probe", "persona": "probe", "prompt": "Hosts?", "cron": "0 * * * *"}
    assert console.api("alice").post("/api/v1/schedules", json=schedule).status_code == 201
    bob.goto("/schedules")
    row = bob.locator('[data-testid="schedule-row"][data-name="hourly-probe"]')
    expect(row).to_contain_text("yes")
    expect(row.get_by_test_id("schedule-toggle")).to_have_count(0)
    assert console.status(spawn_id) == "waiting"


# -- a long session, written straight into the stores, as a real run leaves them ----------

LONG_QUESTION = "Probe every host of the fleet."
LONG_ANSWER = "All hosts of the fleet answered their probe and are healthy."


def _seed_long_session(site: ConsoleSite, probes: int) -> tuple[str, str]:
    """A finished session of alice's whose one ``probe`` spawn made ``probes`` tool calls: the
    question in the API's database, the spawn's record in its store and its tile, calls,
    results, text and notification on the event bus, as a real run leaves them. Returns the
    session's id and the spawn's; ``2 * probes`` + about a dozen events in all."""
    engine = make_engine(site.env["ONGRID_DATABASE_URL"])
    try:
        upgrade(engine)  # the API has migrated it already; this only waits for that
        chats = ChatStore(engine)
        session_id = chats.create_session("alice", "A fleet-wide probe")
        messages = [Message(role="user", content=LONG_QUESTION)]
        calls = [
            ToolCall(id=f"call_{n}", name="count_probe", arguments=json.dumps({"target": f"h{n}"}))
            for n in range(probes)
        ]
        for made in calls:
            messages.append(Message(role="assistant", tool_calls=[made]))
            messages.append(
                Message(role="tool", tool_call_id=made.id, name=made.name, content=_probed(made))
            )
        messages.append(Message(role="assistant", content=LONG_ANSWER))
        record = SpawnRecord(
            session_id=session_id,
            persona="probe",
            prompt=LONG_QUESTION,
            user="alice",
            role="admin",
            status="ok",
            result=LONG_ANSWER,
            state=LoopState(messages=messages, turns=probes + 1, final=LONG_ANSWER),
        )
        site.cluster.client.store.create(record)
        chats.add_message(
            session_id, "user", LONG_QUESTION, agent="probe", spawn_id=record.spawn_id
        )
    finally:
        engine.dispose()
    _publish_run(site, record, calls)
    return session_id, record.spawn_id


def _probed(made: ToolCall) -> str:
    return f"probed {json.loads(made.arguments)['target']}: healthy"


def _publish_run(site: ConsoleSite, record: SpawnRecord, calls: list[ToolCall]) -> None:
    """The spawn's events in the order a run publishes them: tile, each call and its result,
    the answer's words, the notification."""
    tools = [{"name": "count_probe", "class": "read", "confirmation": "none"}]
    events: list[dict[str, Any]] = [
        {"type": "agent_tile", "persona": "probe", "description": "Probe.", "tools": tools}
    ]
    for made in calls:
        seen = {"call_id": made.id, "name": made.name}
        events.append({"type": "tool_call", **seen, "arguments": made.arguments})
        events.append({"type": "tool_result", **seen, "content": _probed(made)})
    events += [{"type": "text", "text": w} for w in re.split(r"(?<=\s)(?=\S)", LONG_ANSWER)]
    events.append(
        {"type": "task_notification", "status": "ok", "persona": "probe", "message": LONG_ANSWER}
    )
    ids = {"session_id": record.session_id, "spawn_id": record.spawn_id}
    for event in events:
        site.cluster.client.bus.publish(EVENT_ADAPTER.validate_python({**event, **ids}))


def test_a_session_of_a_thousand_events_renders_every_tool_call(console: ConsoleSite):
    probes = 495
    session_id, _spawn_id = _seed_long_session(console, probes)
    events = len(console.cluster.history(session_id))
    assert events >= 1_000, events

    started = time.monotonic()
    page = console.visit("alice", f"/chat/{session_id}")
    probe = tile(page, "probe")
    expect(last_prose(page)).to_contain_text(LONG_ANSWER)
    button(probe, "Open transcript of probe").click()
    transcript = page.get_by_role("dialog", name="Transcript of probe")
    expect(transcript.get_by_test_id("tool-card")).to_have_count(probes)
    rendered = time.monotonic() - started
    assert page.evaluate("() => document.querySelectorAll('[data-testid=tool-card]').length") >= (
        probes
    )
    print(f"{events} events: the session and its transcript rendered in {rendered:.1f} s")


def test_an_answer_in_markdown_is_rendered_and_sanitised(console: ConsoleSite):
    page = console.visit("alice")
    ask(page, MARKDOWN, agent="probe")
    prose = last_prose(page)
    expect(prose.locator("h2")).to_have_text("db8 incident")
    expect(prose.locator("li")).to_have_count(2)
    expect(prose.locator("table td").first).to_have_text("db8")
    expect(prose.locator("pre code")).to_contain_text("df -h /var")
    link = prose.locator("a")
    expect(link).to_have_attribute("rel", "noopener noreferrer")
    # Raw HTML is text, never markup; an image the model points at is not loaded.
    expect(prose).to_contain_text("<script>window.__pwned = true</script>")
    assert prose.locator("script").count() == 0 and prose.locator("b").count() == 0
    assert prose.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None
    # After the answer the composer is still in view, and the session says when it was used.
    expect(page.get_by_role("form", name="Composer")).to_be_in_viewport()
    expect(page.get_by_test_id("session-time").first).to_have_text(re.compile(r"\d"))


def test_a_saved_persona_with_a_misspelt_tool_says_so_at_once_and_on_its_row(
    console: ConsoleSite,
):
    page = console.visit("alice", "/settings/agents")
    button(page, "New persona").click()
    page.get_by_label("Name", exact=True).fill("typo-helper")
    page.get_by_label("Description", exact=True).fill("Summarises an edge.")
    page.get_by_label("When to use", exact=True).fill("When an edge needs a summary.")
    page.get_by_label("Model", exact=True).fill(MODEL)
    page.get_by_label("Tools", exact=True).fill("get_edge_sumary")
    button(page, "Save").click()

    status = page.get_by_role("status")
    expect(status, "the confirmation names the findings").to_contain_text("2 finding(s)")
    expect(status).to_contain_text("did you mean 'get_edge_summary'?")
    page.goto("/settings/agents")
    row = _agent_row(page, "typo-helper")
    expect(row.get_by_test_id("agent-findings")).to_contain_text("get_edge_sumary")
    expect(row.get_by_test_id("agent-availability")).not_to_have_class("settings-available")
