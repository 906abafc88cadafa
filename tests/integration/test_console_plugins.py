"""Settings → Plugins end to end: headless Chromium against a real ``ongrid api`` and worker.

An admin adds a marketplace built in the test's directory (one plugin of its own folder with a
persona, a skill and a command; one whose source is a remote repository, unreachable here),
installs the local plugin from the keyboard at 800 px, finds its persona on Settings → Agents,
updates and removes it, and removes the marketplace. A viewer gets no Plugins link. The
marketplace root is the cluster's own temporary one (``ONGRID_MARKETPLACE_ROOT``, set by the
harness). Screenshots land in ``artifacts/console/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import console_site
from console_site import WAIT_MS, ConsoleSite, button
from harness import wait_for
from playwright.sync_api import Locator, Page, expect

# The fixtures, under the names the tests ask for.
chromium = console_site.chromium
console = console_site.console

MARKET = "acme-tools"
LOCAL = "ops-kit"
LOCAL_VERSION = "1.2.0"
REMOTE = "remote-kit"
REMOTE_URL = "https://git.example.invalid/acme/remote-kit.git"
AGENT = "runbook-finder"
PERSONA = f"{LOCAL}:{AGENT}"
SKILL = "runbooks"


def _marketplace(root: Path) -> Path:
    """A Claude Code marketplace of two plugins under ``root``; its folder."""
    market = root / "acme-market"
    plugin = market / "plugins" / LOCAL
    (market / ".claude-plugin").mkdir(parents=True)
    (market / ".claude-plugin" / "marketplace.json").write_text(
        json.dumps(
            {
                "name": MARKET,
                "owner": {"name": "Acme Ops"},
                "metadata": {"description": "Acme's operations plugins."},
                "plugins": [
                    {
                        "name": LOCAL,
                        "source": f"./plugins/{LOCAL}",
                        "description": "Finds runbooks for alerts.",
                        "version": LOCAL_VERSION,
                        "category": "operations",
                    },
                    {
                        "name": REMOTE,
                        "source": {"source": "url", "url": REMOTE_URL},
                        "description": "Lives in a repository of its own.",
                        "category": "operations",
                    },
                ],
            }
        ),
        encoding="utf-8",
    )
    (plugin / ".claude-plugin").mkdir(parents=True)
    (plugin / ".claude-plugin" / "plugin.json").write_text(
        json.dumps({"name": LOCAL, "version": LOCAL_VERSION, "description": "Runbooks."}),
        encoding="utf-8",
    )
    (plugin / "agents").mkdir()
    (plugin / "agents" / f"{AGENT}.md").write_text(
        f"---\nname: {AGENT}\ndescription: Finds the runbook that covers an alert.\n---\n\n"
        "You find the runbook that covers the alert you are given and quote its steps.\n",
        encoding="utf-8",
    )
    skill = plugin / "skills" / SKILL
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        f"---\nname: {SKILL}\ndescription: The team's runbooks, by alert.\n---\n\n"
        "# Runbooks\n\nRB-17 covers a full /var: rotate the logs, then clear the core dumps.\n",
        encoding="utf-8",
    )
    (skill / "references" / "rb-17.md").write_text("# RB-17\n\nA full /var.\n", encoding="utf-8")
    (plugin / "commands").mkdir()
    (plugin / "commands" / "hello.md").write_text("Say hello.\n", encoding="utf-8")
    return market


def _row(page: Page | Locator, name: str) -> Locator:
    return page.locator(f'[data-testid="plugin-row"][data-name="{name}"]')


def _installed(page: Page, name: str) -> Locator:
    return page.locator(f'[data-testid="installed-plugin"][data-name="{name}"]')


def _notice(page: Page) -> Locator:
    return page.locator("main p.settings-notice")


def _tab_to(page: Page, target: Locator, limit: int = 80) -> None:
    """Press Tab until ``target`` has the focus (at most ``limit`` times)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if target.evaluate("(el) => el === document.activeElement"):
            return
    raise AssertionError(f"{target} not reached with {limit} presses of Tab")


def _no_sideways_scroll(page: Page, what: str) -> None:
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 800, f"{what} scrolls sideways at 800 px: {width} px wide"


def test_a_marketplace_is_added_a_plugin_installed_used_and_removed(
    console: ConsoleSite, tmp_path: Path
):
    # Provoked on purpose, and logged by Chromium as failed loads: the 400 of a source that is
    # no marketplace, the 409 of removing a marketplace a plugin is still installed from.
    console.allow_console_error(r"status of (400|409)")
    market = _marketplace(tmp_path)
    page = console.visit("alice", "/chat")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Plugins").click()
    expect(page).to_have_url(f"{console.proxy.url}/settings/plugins")
    expect(page.get_by_role("heading", name="Plugins", exact=True)).to_be_visible()
    expect(page.get_by_text("None added yet")).to_be_visible()

    form = page.get_by_role("form", name="Add marketplace")
    missing = tmp_path / "no-such-market"
    form.get_by_label("Source", exact=True).fill(str(missing))
    button(form, "Add").click()
    refused = form.get_by_test_id("marketplace-add-error")
    expect(refused, "the server's reason at the form").to_contain_text("no-such-market")
    expect(form.get_by_label("Source", exact=True)).to_have_attribute("aria-invalid", "true")

    form.get_by_label("Source", exact=True).fill(str(market))
    button(form, "Add").click()
    expect(_notice(page)).to_contain_text(f"Added marketplace '{MARKET}': 2 plugins")
    expect(refused).to_have_count(0)
    row = page.locator(f'[data-testid="marketplace-row"][data-name="{MARKET}"]')
    expect(row.get_by_test_id("marketplace-count")).to_have_text("2")
    expect(row).to_contain_text("directory")
    expect(row).to_contain_text("Acme Ops")

    plugins = page.get_by_role("table", name=f"Plugins of {MARKET}")
    expect(_row(plugins, LOCAL).get_by_role("button", name=f"Install {LOCAL}")).to_be_visible()
    remote = _row(plugins, REMOTE).get_by_test_id("plugin-state")
    expect(remote, "the remote plugin, with why it cannot be had").to_contain_text("Unreachable:")
    expect(remote).to_contain_text("network sources are off")
    expect(_row(plugins, REMOTE).get_by_role("button")).to_have_count(0)
    console.shoot(page, "plugins-marketplace")

    # From the keyboard, at 800 px: filter, pick the allowed mode, install.
    page.set_viewport_size({"width": 800, "height": 900})
    _no_sideways_scroll(page, "the plugins page")
    page.get_by_label("Filter by name").fill("ops")
    expect(_row(plugins, REMOTE), "filtered out").to_have_count(0)
    expect(page.get_by_test_id("plugins-shown")).to_contain_text("1 of 2 plugins")
    mode = page.get_by_label(f"Allowed mode for {LOCAL}")
    _tab_to(page, mode)
    page.keyboard.type("m")  # a select picks the option its typed letters begin
    expect(mode).to_have_value("mutating-with-confirm")
    network = page.get_by_label(f"Network for {LOCAL}")
    _tab_to(page, network)
    page.keyboard.press("Space")
    expect(network).to_be_checked()
    install = button(_row(plugins, LOCAL), f"Install {LOCAL}")
    _tab_to(page, install)
    page.keyboard.press("Enter")

    expect(_row(plugins, LOCAL).get_by_test_id("plugin-state")).to_have_text(
        f"Installed {LOCAL_VERSION}"
    )
    expect(_notice(page)).to_contain_text(f"Installed {LOCAL} {LOCAL_VERSION} from {MARKET}")
    expect(_notice(page), "the focus lands on what the change did").to_be_focused()
    card = _installed(page, LOCAL)
    expect(card.get_by_test_id("plugin-agents")).to_contain_text(PERSONA)
    expect(card.get_by_test_id("plugin-skills")).to_contain_text(SKILL)
    expect(card.get_by_test_id("plugin-mode")).to_have_text("mutating-with-confirm")
    grants = card.get_by_test_id("plugin-grants")
    expect(grants, "what the install granted, said").to_contain_text("network: ")
    expect(grants).to_contain_text("never this cluster's Redis, database or hosts")
    expect(card.get_by_test_id("plugin-unused")).to_contain_text("Kept, not used:")
    expect(card.get_by_test_id("plugin-unused")).to_contain_text("commands")
    recorded = console.api("alice").get("/api/v1/plugins").json()
    assert [(p["name"], p["allowed_mode"], p["network"]) for p in recorded] == [
        (LOCAL, "mutating-with-confirm", True)
    ]
    expect(card.get_by_test_id("plugin-hash")).to_have_text(recorded[0]["content_hash"][:12])
    _no_sideways_scroll(page, "the plugins page with a plugin installed")
    console.shoot(page, "plugins-800")
    page.set_viewport_size({"width": 1280, "height": 900})

    button(row, f"Remove marketplace {MARKET}").click()
    blocked = row.get_by_test_id("marketplace-remove-error")
    expect(blocked, "the 409's reason at the marketplace").to_contain_text(LOCAL)
    expect(blocked).to_contain_text("remove them first")

    card.get_by_role("link", name=PERSONA).click()
    expect(page).to_have_url(re.compile(rf"/settings/agents/{LOCAL}(%3A|:){AGENT}$"))
    agent_row = page.locator(f'[data-testid="agent-row"][data-name="{PERSONA}"]')
    expect(agent_row, "the plugin's persona among the agents").to_be_visible()
    expect(agent_row).to_contain_text("Finds the runbook that covers an alert.")

    page.goto("/settings/plugins")
    card = _installed(page, LOCAL)
    button(card, f"Update {LOCAL}").click()
    expect(_notice(page)).to_contain_text(f"{LOCAL} is up to date")

    button(card, f"Remove {LOCAL}").click()
    keep = button(card, "Keep it")
    expect(keep, "the in-page question takes the focus").to_be_focused()
    keep.press("Enter")
    expect(button(card, f"Remove {LOCAL}"), "focus back on Remove").to_be_focused()
    assert console.api("alice").get("/api/v1/plugins").json() != []
    button(card, f"Remove {LOCAL}").click()
    button(card, f"Confirm remove {LOCAL}").click()
    expect(_notice(page)).to_contain_text(f"Removed {LOCAL}")
    expect(_installed(page, LOCAL)).to_have_count(0)
    expect(page.get_by_test_id("no-installed-plugins")).to_be_visible()
    expect(button(_row(plugins, LOCAL), f"Install {LOCAL}")).to_be_visible()
    assert console.api("alice").get("/api/v1/plugins").json() == []

    page.goto(f"/settings/agents/{PERSONA}")
    expect(page.get_by_role("heading", name="Agents", exact=True)).to_be_visible()
    expect(page.locator('[data-testid="agent-row"]').first).to_be_visible()
    expect(page.locator(f'[data-testid="agent-row"][data-name="{PERSONA}"]')).to_have_count(0)

    page.goto("/settings/plugins")
    row = page.locator(f'[data-testid="marketplace-row"][data-name="{MARKET}"]')
    button(row, f"Remove marketplace {MARKET}").click()
    expect(_notice(page)).to_contain_text(f"Removed marketplace '{MARKET}'")
    expect(page.get_by_text("None added yet")).to_be_visible()
    wait_for(
        lambda: console.api("alice").get("/api/v1/marketplaces").json() == [],
        WAIT_MS / 1000,
        "the marketplace to be forgotten",
    )
    console.shoot(page, "plugins-empty")


def test_a_viewer_gets_no_plugins_link_and_the_page_says_why(console: ConsoleSite):
    alice = console.visit("alice")
    nav = alice.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Plugins")).to_be_visible()

    bob = console.visit("bob")
    nav = bob.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Skills")).to_be_visible()
    expect(nav.get_by_role("link", name="Plugins")).to_have_count(0)
    bob.goto("/settings/plugins")
    expect(bob.get_by_test_id("read-only-reason")).to_contain_text("manage_plugins")
    expect(bob.get_by_role("form", name="Add marketplace")).to_have_count(0)
    assert console.api("bob").get("/api/v1/marketplaces").status_code == 403
