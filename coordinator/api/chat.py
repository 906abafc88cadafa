"""Chat: sessions, turns and their event streams (SPEC §5, §6).

A turn is one user message: with ``agent`` the persona is spawned directly, without it the
coordinator's turn starts (:func:`coordinator.turns.start_turn`) and picks a specialist. The
response streams the session's events (SSE) until the turn's spawn sends its
``task_notification``; for a background persona, until its ``agent_tile`` (its result arrives
later, on ``GET …/events``). A client that goes away ends only its stream, never the turn.
A client that does not follow the turn live (automation starting background investigations)
asks ``Prefer: respond-async`` (RFC 7240): the turn starts the same way and the answer is 202
with the session, the spawn and the URL of the session's events, without a stream, a
subscription or a stream slot.

Nobody is left waiting on a queue no worker consumes: a turn whose queue has no live consumer
is refused before it starts (503, naming the queue and the command that starts a worker for
it), and while the stream is open, the turn's spawn or a specialist its coordinator dispatched
that waits unheld on such a queue for a few seconds (its worker died) is failed, with a
``task_notification`` that says the same; a session's events stream watches the session's
unfinished spawns the same way.

Nobody holds more than their share (:mod:`coordinator.api.limits`): a turn, a new session or a
stream past the caller's bound is refused (429) before anything is written or started.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, cast

import redis
from anyio import to_thread
from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from coordinator.agent_tool import child_spawn_id
from coordinator.api import _answers
from coordinator.api._sse import EventStreamResponse, ResumeAfter, UntilIdle, follow
from coordinator.api.deps import Caller, Chats, OwnedSession, Services, Svc
from coordinator.api.errors import Conflict
from coordinator.api.limits import StreamSlot
from coordinator.api.schemas import (
    CancelOut,
    ChatIn,
    ErrorOut,
    HistoryOut,
    MessageIn,
    MessageOut,
    SessionOut,
    TurnAcceptedOut,
)
from coordinator.auth import Principal
from coordinator.storage.chats import ChatSession
from coordinator.turns import start_turn
from registry.budget import Budget
from registry.errors import NotFoundError
from registry.tools import AGENT_TOOL_NAME
from workers.client import StrandedWatch
from workers.messages import Event
from workers.spawns import SpawnRecord

__all__ = ["router"]

log = logging.getLogger(__name__)

_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: `id:` the event's seq, `event:` its type (`text`, "
        "`agent_tile`, `tool_call`, `tool_result`, `confirmation_required`, "
        "`task_notification`), `data:` its JSON envelope (with `session_id`, `spawn_id`, `seq`).",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}
_ACCEPTED_DOC: dict[int | str, dict[str, Any]] = {
    202: {
        "description": "With `Prefer: respond-async`: the turn started, not streamed; follow it "
        "at `events` (also the `Location` header).",
        "model": TurnAcceptedOut,
    }
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 404, 409, 413, 422, 429, 503)
}
_TITLE_LENGTH = 80

router = APIRouter(prefix="/api/v1/chat", tags=["chat"], responses=_ERRORS)


# -- turns -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Turn:
    session_id: str
    record: SpawnRecord
    after: int  # the session's last seq before the turn: its stream starts after it

    def ends_with(self, event: Event) -> bool:
        if event.spawn_id != self.record.spawn_id:
            return False
        return event.type == "task_notification" or (
            self.record.background and event.type == "agent_tile"
        )


def _check_agent(svc: Services, agent: str) -> None:
    """404 for an unknown persona (with the names), 409 for one whose gate fails."""
    snap = svc.snapshot()
    snap.get(agent)
    if agent in snap.unavailable:
        reason = snap.unavailable[agent]
        raise Conflict(
            f"agent {agent!r} is unavailable: {reason}",
            {"agent": agent, "reason": reason},
            code="agent_unavailable",
        )


def _spawn(
    svc: Services,
    who: Principal,
    session_id: str,
    text: str,
    agent: str | None,
    context: dict,
    budget: Budget | None,
) -> SpawnRecord:
    if agent:
        return svc.client.spawn(
            agent,
            text,
            context=context,
            role=who.role,
            user=who.user,
            session_id=session_id,
            budget=budget,
        )
    return start_turn(
        svc.client,
        session_id=session_id,
        prompt=text,
        user=who.user,
        role=who.role,
        context=context,
        budget=budget,
    )


def _open_turn(
    svc: Services,
    who: Principal,
    session: ChatSession | None,
    text: str,
    agent: str | None,
    context: dict,
    budget: Budget | None = None,
) -> _Turn:
    """Check the agent and the caller's limits, start the spawn, then record the question
    (linked to the spawn)."""
    if agent:
        _check_agent(svc, agent)
    svc.database.ensure()
    if session is None:
        svc.limits.check_new_session(svc.chats, who.user)
    svc.limits.turns.take(who.user)
    if session is None:
        # The session's rows are written once the spawn is accepted, in one transaction: a
        # refused first turn leaves nothing behind, and a new chat costs one commit.
        session_id, after = uuid.uuid4().hex, 0
    else:
        session_id, after = session.id, svc.client.bus.last_seq(session.id)
    record = _spawn(svc, who, session_id, text, agent, context, budget)
    if session is None:
        title = " ".join(text.split())[:_TITLE_LENGTH]
        svc.chats.start_session(
            session_id, who.user, title, text, agent=agent, spawn_id=record.spawn_id
        )
        svc.limits.sessions.started(who.user)
    else:
        svc.chats.add_message(session_id, "user", text, agent=agent, spawn_id=record.spawn_id)
    return _Turn(session_id, record, after)


async def _start_turn(
    svc: Services, who: Principal, session: ChatSession | None, body: ChatIn | MessageIn
) -> _Turn:
    """:func:`_open_turn` off the event loop, on one of the process's few intake threads
    (``intake_threads``): a thread per waiting request would spend more CPU on the
    interpreter's lock than on the turns."""
    text = body.prompt if isinstance(body, ChatIn) else body.content
    opened = partial(_open_turn, svc, who, session, text, body.agent, body.context, body.budget)
    return await to_thread.run_sync(opened, limiter=svc.intake)


async def _fail_stranded(watch: StrandedWatch, stop: asyncio.Event) -> None:
    """Every few seconds, fail the turn's spawns that wait on a queue nobody consumes: their
    ``task_notification`` then ends the stream with the queue and the command to run."""
    while not stop.is_set():
        await asyncio.sleep(watch.client.settings.stranded_check_seconds)
        if not watch.watching:
            continue  # an events stream of a session at rest: nothing to look up
        try:
            await run_in_threadpool(watch.check)
        except redis.RedisError as exc:  # the stream itself reports a lost Redis
            log.warning("could not check the queues of a turn's spawns: %s", exc)


async def _prefers_async(
    prefer: Annotated[
        str | None,
        Header(
            description="`respond-async`: answer 202 once the turn started, without its stream."
        ),
    ] = None,
) -> bool:
    """RFC 7240's ``Prefer: respond-async`` (among other preferences, any case). ``async``:
    FastAPI runs a plain function dependency in its thread pool, a hop per request."""
    return any(
        part.split(";", 1)[0].strip().lower() == "respond-async"
        for part in (prefer or "").split(",")
    )


RespondAsync = Annotated[bool, Depends(_prefers_async)]


async def _accepted_turn(
    svc: Services,
    who: Principal,
    session: ChatSession | None,
    body: ChatIn | MessageIn,
) -> JSONResponse:
    """The turn started and not streamed: 202 with where its events are. No stream slot is
    taken and nothing subscribes. The queue had a live consumer when the turn started (else
    503, as for a streamed turn); a worker lost later is reported on the session's events
    stream, which watches the session's unfinished spawns as a turn's stream does."""
    turn = await _start_turn(svc, who, session, body)
    events = f"/api/v1/chat/sessions/{turn.session_id}/events?after={turn.after}"
    accepted = TurnAcceptedOut(
        session_id=turn.session_id,
        spawn_id=turn.record.spawn_id,
        agent=turn.record.persona,
        background=turn.record.background,
        events=events,
    )
    headers = {
        "Location": events,
        "Preference-Applied": "respond-async",
        "X-Session-Id": turn.session_id,
        "X-Spawn-Id": turn.record.spawn_id,
    }
    return JSONResponse(accepted.model_dump(), status_code=202, headers=headers)


async def _opened_turn(
    svc: Services,
    who: Principal,
    session: ChatSession | None,
    body: ChatIn | MessageIn,
) -> EventStreamResponse:
    """The turn's stream, with the stream slot taken first: a caller at their bound of streams
    starts no turn."""
    slot = svc.limits.streams.take(who.user)
    try:
        turn = await _start_turn(svc, who, session, body)
    except BaseException:
        slot.release()
        raise
    return _turn_stream(svc, turn, slot)


def _turn_stream(svc: Services, turn: _Turn, slot: StreamSlot) -> EventStreamResponse:
    # The turn's spawn, and the specialists a coordinator dispatches (their ids follow from
    # its call ids): a worker lost after the enqueue must not leave the person in silence.
    watch = StrandedWatch(svc.client, [turn.record.spawn_id])

    async def observe(event: Event) -> None:
        _watch_dispatches(watch, event)
        if event.type == "task_notification" and event.spawn_id == turn.record.spawn_id:
            await run_in_threadpool(
                _answers.settle, svc.chats, svc.client.store, turn.session_id, event.spawn_id
            )

    def stream(stop: asyncio.Event) -> AsyncIterator[bytes]:
        events = follow(
            svc.hub,
            svc.client.bus,
            turn.session_id,
            turn.after,
            stop,
            until=turn.ends_with,
            on_event=observe,
        )
        return _watched(events, watch, stop)

    headers = {"X-Session-Id": turn.session_id, "X-Spawn-Id": turn.record.spawn_id}
    return EventStreamResponse(stream, headers=headers, slot=slot)


def _watch_dispatches(watch: StrandedWatch, event: Event) -> None:
    """A coordinator's dispatch: its specialist is watched too (its id follows from the call)."""
    if event.type == "tool_call" and event.name == AGENT_TOOL_NAME:
        watch.watch(child_spawn_id(event.spawn_id, event.call_id))


async def _watched(
    events: AsyncIterator[bytes], watch: StrandedWatch, stop: asyncio.Event
) -> AsyncIterator[bytes]:
    """``events``, while :func:`_fail_stranded` checks ``watch`` beside them."""
    watchdog = asyncio.create_task(_fail_stranded(watch, stop))
    try:
        async with aclosing(cast(AsyncGenerator[bytes, None], events)) as chunks:
            async for chunk in chunks:
                yield chunk
    finally:
        watchdog.cancel()


#: The latest turns of a session whose spawns its events stream watches (older ones have ended).
_WATCHED_TURNS = 20


def _unfinished_spawns(svc: Services, session_id: str) -> list[str]:
    """The spawns of the session's latest turns that have not ended."""
    asked = [m.spawn_id for m in svc.chats.messages(session_id) if m.role == "user" and m.spawn_id]
    pending = []
    for spawn_id in asked[-_WATCHED_TURNS:]:
        record = svc.client.store.get(spawn_id)
        if record is not None and not record.finished:
            pending.append(spawn_id)
    return pending


# -- endpoints ---------------------------------------------------------------------------------


@router.post(
    "",
    status_code=200,
    response_class=EventStreamResponse,
    responses={**_SSE_DOC, **_ACCEPTED_DOC},
)
async def chat(body: ChatIn, who: Caller, svc: Svc, respond_async: RespondAsync) -> Response:
    """Start a session with its first message and stream the turn (header `X-Session-Id`);
    with `Prefer: respond-async`, 202 once it started."""
    if respond_async:
        return await _accepted_turn(svc, who, None, body)
    return await _opened_turn(svc, who, None, body)


@router.get("/sessions", response_model=list[SessionOut])
def list_sessions(
    who: Caller, store: Chats, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> list[dict[str, Any]]:
    """The caller's sessions, most recently active first."""
    return [s.as_dict() for s in store.list_sessions(who.user, limit=limit)]


@router.post(
    "/sessions/{session_id}/messages",
    status_code=200,
    response_class=EventStreamResponse,
    responses={**_SSE_DOC, **_ACCEPTED_DOC},
)
async def post_message(
    body: MessageIn, session: OwnedSession, who: Caller, svc: Svc, respond_async: RespondAsync
) -> Response:
    """Add a message to a session and stream the turn it starts; with `Prefer: respond-async`,
    202 once it started."""
    if respond_async:
        return await _accepted_turn(svc, who, session, body)
    return await _opened_turn(svc, who, session, body)


@router.get(
    "/sessions/{session_id}/events",
    status_code=200,
    response_class=EventStreamResponse,
    responses=_SSE_DOC,
)
async def session_events(
    session: OwnedSession,
    who: Caller,
    svc: Svc,
    start: ResumeAfter,
    until_idle: UntilIdle = None,
) -> EventStreamResponse:
    """The session's events after `Last-Event-ID` (or `after`), then live, until disconnect."""
    slot = svc.limits.streams.take(who.user)
    try:
        await svc.hub.client.ping()  # a 503 naming the cause rather than a mute stream
        # The session's spawns still running or queued are watched as a turn's stream watches
        # its own: a turn started without its stream (respond-async) is followed here.
        pending = await run_in_threadpool(_unfinished_spawns, svc, session.id)
    except BaseException:
        slot.release()
        raise
    watch = StrandedWatch(svc.client, pending)

    async def settle(event: Event) -> None:
        _watch_dispatches(watch, event)
        if event.type == "task_notification":
            await run_in_threadpool(
                _answers.settle, svc.chats, svc.client.store, session.id, event.spawn_id
            )

    def stream(stop: asyncio.Event) -> AsyncIterator[bytes]:
        events = follow(
            svc.hub, svc.client.bus, session.id, start, stop, idle=until_idle, on_event=settle
        )
        return _watched(events, watch, stop)

    return EventStreamResponse(stream, headers={"X-Session-Id": session.id}, slot=slot)


@router.get("/sessions/{session_id}", response_model=HistoryOut)
def history(session: OwnedSession, store: Chats, svc: Svc) -> dict[str, Any]:
    """The session and its messages: each question, then its turn's final answer."""
    _answers.settle_all(store, svc.client.store, session.id)
    messages = _answers.in_turn_order(store.messages(session.id))
    return {
        "session": session.as_dict(),
        "messages": [MessageOut.model_validate(m.as_dict()) for m in messages],
    }


@router.post(
    "/sessions/{session_id}/spawns/{spawn_id}/cancel", status_code=202, response_model=CancelOut
)
def cancel(session: OwnedSession, spawn_id: str, svc: Svc) -> CancelOut:
    """Ask a running spawn of the session to stop; it ends with a `cancelled` notification."""
    record = svc.client.store.get(spawn_id)
    if record is None or record.session_id != session.id:
        raise NotFoundError("spawn", spawn_id)
    if record.finished:
        raise Conflict(
            f"spawn {spawn_id} already ended ({record.status})",
            {"status": record.status},
            code="spawn_finished",
        )
    svc.client.cancel(spawn_id)
    return CancelOut(spawn_id=spawn_id)
