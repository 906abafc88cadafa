"""What a notification says: a Slack Block Kit message, or the generic webhook's JSON.

Both are rendered once, when the event is taken into the outbox, so every attempt sends the same
bytes. Answers, arguments and persona names come from models and bundles, so they are untrusted:
Slack text is escaped (``&``, ``<``, ``>``: no ``<!channel>`` mention, no disguised link) and cut
to Slack's limits; the webhook's JSON carries them as plain strings.

The webhook payload (``version`` 1) is documented in ``docs/operators/notifications.md``; a
field is only ever added to version 1, never changed or removed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from coordinator.notify.events import Notice
from workers.messages import ApprovalDecided, ConfirmationRequired, SpawnEnded

__all__ = ["PAYLOAD_VERSION", "console_link", "render", "slack_message", "webhook_payload"]

PAYLOAD_VERSION = 1
#: Lines of an answer a notification shows, and characters at most (the console has the rest).
ANSWER_LINES, ANSWER_CHARS = 12, 1500
#: Characters of a waiting call's arguments a notification shows.
ARGUMENTS_CHARS = 1500
_TITLES = {
    "approval.requested": "Approval needed",
    "approval.decided": "Approval decided",
    "approval.expired": "Approval expired",
    "spawn.finished": "Finished",
    "spawn.failed": "Failed",
    "budget.reached": "Budget reached",
}


def console_link(base: str, notice: Notice) -> str:
    """The console page of the notice: the approval's card, or the spawn's transcript."""
    event = notice.event
    spawn = quote(event.spawn_id, safe="")
    if isinstance(event, ConfirmationRequired | ApprovalDecided):
        return f"{base}/approvals/{spawn}/{quote(event.call_id, safe='')}"
    return f"{base}/spawns/{spawn}"


def _first_lines(text: str) -> str:
    lines = text.strip().splitlines()
    kept = "\n".join(lines[:ANSWER_LINES])
    cut = len(lines) > ANSWER_LINES or len(kept) > ANSWER_CHARS
    return kept[:ANSWER_CHARS] + ("\n…" if cut else "")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def webhook_payload(
    delivery_id: str, notice: Notice, link: str, may_decide: list[str]
) -> dict[str, Any]:
    """The generic webhook's JSON (see the module docstring)."""
    event = notice.event
    payload: dict[str, Any] = {
        "version": PAYLOAD_VERSION,
        "id": delivery_id,
        "event": notice.kind,
        "occurred_at": _iso(event.ts),
        "spawn": {
            "id": event.spawn_id,
            "session_id": event.session_id,
            "persona": notice.persona,
            "owner": notice.owner,
        },
        "link": link,
    }
    if isinstance(event, SpawnEnded):
        payload["spawn"].update(
            status=event.status,
            background=event.background,
            budget_reached=event.budget_reached,
            cost_usd=event.cost_usd,
        )
        payload["text"] = _first_lines(event.message)
    elif isinstance(event, ConfirmationRequired):
        payload["approval"] = {
            "call_id": event.call_id,
            "tool": event.name,
            "tool_class": event.tool_class,
            "arguments": event.arguments[:ARGUMENTS_CHARS],
            "needed": event.needed,
            "may_decide": may_decide,
            "expires_at": _iso(event.expires_at) if event.expires_at else None,
        }
    elif isinstance(event, ApprovalDecided):
        payload["approval"] = {
            "call_id": event.call_id,
            "tool": event.name,
            "decision": event.decision,
            "by": event.by,
            "approved_by": event.approved_by,
            "needed": event.needed,
        }
    return payload


def _escape(text: str) -> str:
    """Slack's mrkdwn escaping: model text can neither mention nor link anyone."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    return "```" + _escape(text).replace("```", "'''") + "```"


def slack_message(notice: Notice, link: str, may_decide: list[str]) -> dict[str, Any]:
    """A Slack incoming webhook's message: header, facts, the answer or the waiting call, and
    a button to the console page (which asks to sign in)."""
    event = notice.event
    title = f"{_TITLES[notice.kind]}: {notice.persona or 'a spawn'}"
    facts = [
        f"*Persona*\n{_escape(notice.persona or '-')}",
        f"*Owner*\n{_escape(notice.owner or '-')}",
    ]
    body: list[str] = []
    button = "Open in the console"
    if isinstance(event, SpawnEnded):
        facts.append(f"*Status*\n{event.status}")
        if event.budget_reached:
            facts.append(f"*Budget reached*\n{event.budget_reached}")
        if event.message.strip():
            body.append(_code(_first_lines(event.message)))
    elif isinstance(event, ConfirmationRequired):
        facts.append(f"*Tool*\n`{_escape(event.name)}` ({event.tool_class or 'unknown'} class)")
        deciders = ", ".join(may_decide) or "a user whose role may approve"
        need = "two different people" if event.needed > 1 else "one person"
        facts.append(f"*Who may decide*\n{_escape(deciders)} ({need})")
        if event.expires_at:
            facts.append(f"*Expires*\n{_iso(event.expires_at)}")
        body.append(_code(event.arguments[:ARGUMENTS_CHARS]))
        button = "Review in the console"
    elif isinstance(event, ApprovalDecided):
        facts.append(f"*Tool*\n`{_escape(event.name)}`")
        by = f" by {event.by}" if event.by else ""
        facts.append(f"*Decision*\n{event.decision}{_escape(by)}")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": False}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f[:2000]} for f in facts]},
    ]
    blocks += [{"type": "section", "text": {"type": "mrkdwn", "text": b[:3000]}} for b in body]
    blocks.append(
        {
            "type": "actions",
            "elements": [
                {"type": "button", "text": {"type": "plain_text", "text": button}, "url": link}
            ],
        }
    )
    return {"text": _escape(f"{title} ({notice.kind})")[:3000], "blocks": blocks}


def render(
    channel_type: str, delivery_id: str, notice: Notice, link: str, may_decide: list[str]
) -> str:
    """The body of ``notice`` for a channel of ``channel_type``, as sent."""
    if channel_type == "slack":
        message = slack_message(notice, link, may_decide)
    else:
        message = webhook_payload(delivery_id, notice, link, may_decide)
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))
