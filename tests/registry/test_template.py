"""registry.template: the field-lookup subset of Go's text/template used by ``initial_prompt``."""

from __future__ import annotations

from typing import Any

import pytest

from registry.errors import PersonaError, TemplateError
from registry.parser import persona_from_mapping
from registry.template import MISSING, Rendered, check_template, render, render_template

CONTEXT: dict[str, Any] = {
    "incident_id": "INC-4211",
    "device_id": "edge-17",
    "device": {"id": "edge-17", "site": {"name": "lisbon-2"}, "rack": 4},
    "retries": 3,
    "ratio": 0.25,
    "urgent": True,
    "muted": False,
    "owner": None,
    "hosts": ["db-1", "db-2"],
    "labels": {"team": "sre", "env": "prod"},
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("Incident {{.incident_id}}", "Incident INC-4211"),
        ("Incident {{ .incident_id }} on {{  .device_id  }}", "Incident INC-4211 on edge-17"),
        ("{{.device.id}} at {{ .device.site.name }}", "edge-17 at lisbon-2"),
        ("rack {{.device.rack}}", "rack 4"),
        ("{{.retries}} retries, ratio {{.ratio}}", "3 retries, ratio 0.25"),
        ("urgent={{.urgent}} muted={{.muted}}", "urgent=true muted=false"),
        ("hosts: {{.hosts}}", 'hosts: ["db-1", "db-2"]'),
        ("labels: {{.labels}}", 'labels: {"env": "prod", "team": "sre"}'),
        ("no actions here, just {braces} and }}", "no actions here, just {braces} and }}"),
        ("", ""),
    ],
)
def test_field_lookups(template: str, expected: str) -> None:
    assert render_template(template, CONTEXT) == expected


@pytest.mark.parametrize(
    "template",
    [
        "{{.nope}}",
        "{{ .device.nope }}",
        "{{.device.id.deeper}}",  # walking into a string
        "{{.hosts.first}}",  # walking into a list
        "{{.owner}}",  # present but null
    ],
)
def test_missing_values_render_no_value(template: str) -> None:
    assert MISSING == "<no value>"
    assert render_template(template, CONTEXT) == "<no value>"


def test_missing_context_renders_no_value() -> None:
    assert render_template("id={{.incident_id}}", None) == "id=<no value>"
    assert render_template("id={{.incident_id}}", {}) == "id=<no value>"


@pytest.mark.parametrize(
    ("template", "missing"),
    [
        ("{{.incident_id}} on {{.device_id}}", []),
        ("{{.nope}}", ["nope"]),
        ("{{ .device.nope }} at {{.device.site.name}}", ["device.nope"]),
        ("{{.device.id.deeper}} {{.hosts.first}}", ["device.id.deeper", "hosts.first"]),
        ("owner {{.owner}}", ["owner"]),  # present but null renders <no value> too
        ("{{.ticket}}, again {{ .ticket }}, then {{.nope}}", ["ticket", "nope"]),
        ("{{.}}", []),
    ],
)
def test_render_names_the_keys_that_had_no_value(template: str, missing: list[str]) -> None:
    assert render(template, CONTEXT) == Rendered(render_template(template, CONTEXT), missing)


def test_a_value_that_reads_no_value_is_not_a_missing_key() -> None:
    assert render("{{.note}}", {"note": MISSING}) == Rendered(MISSING, [])


def test_render_without_context_misses_every_key() -> None:
    assert render("{{.incident_id}} on {{.device.id}}", None) == Rendered(
        "<no value> on <no value>", ["incident_id", "device.id"]
    )


def test_whole_context_dot() -> None:
    assert render_template("{{.}}", {"b": 2, "a": "x"}) == '{"a": "x", "b": 2}'


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("Incident   {{- .incident_id}}  !", "IncidentINC-4211  !"),
        ("Incident  {{.incident_id -}}  \n !", "Incident  INC-4211!"),
        ("[ \n {{- .device_id -}} \n\t]", "[edge-17]"),
    ],
)
def test_trim_markers(template: str, expected: str) -> None:
    assert render_template(template, CONTEXT) == expected


def test_dash_without_a_space_is_not_a_trim_marker() -> None:
    # As in Go, "{{-" must be followed by a space to trim; "-.x" is not a field lookup.
    with pytest.raises(TemplateError, match=r"unsupported template action \{\{-\.incident_id\}\}"):
        check_template("a {{-.incident_id}}")


@pytest.mark.parametrize(
    "template",
    [
        '{{ printf "%s" .incident_id }}',
        "{{ range .hosts }}{{ . }}{{ end }}",
        "{{ .incident_id | html }}",
        "{{ call .f }}",
        "{{ if .urgent }}now{{ end }}",
        "{{ with .device }}{{ .id }}{{ end }}",
        "{{ $x := .incident_id }}",
        "{{/* a comment */}}",
        '{{ template "x" }}',
        "{{ .hosts.0 }}",
        "{{ index .hosts 0 }}",
        "{{}}",
    ],
)
def test_anything_but_a_field_lookup_is_rejected(template: str) -> None:
    with pytest.raises(TemplateError) as info:
        check_template(template)
    assert "unsupported template action {{" in str(info.value)
    assert "only field lookups such as {{.incident_id}}" in str(info.value)
    with pytest.raises(TemplateError):
        render_template(template, CONTEXT)


@pytest.mark.parametrize(
    "template", ["Incident {{ .incident_id", "{{", "{{.a}} and then {{", "{ {{.a}} {{ .b"]
)
def test_unclosed_action_is_rejected(template: str) -> None:
    with pytest.raises(TemplateError, match=r"unclosed '\{\{'"):
        check_template(template)


def test_rejection_happens_before_any_output() -> None:
    with pytest.raises(TemplateError, match=r"\{\{ call \.f \}\}"):
        render_template("{{.incident_id}} then {{ call .f }}", {"f": lambda: "ran"})


def test_values_are_not_expanded_again() -> None:
    context = {"note": "{{.secret}}", "secret": "hunter2", "evil": "{{ call .f }}"}
    assert render_template("note: {{.note}}", context) == "note: {{.secret}}"
    assert render_template("{{.evil}}", context) == "{{ call .f }}"
    nested = {"a": {"b": "{{.a}}"}}
    assert render_template("{{.a.b}}", nested) == "{{.a}}"


def test_a_persona_with_an_unsupported_initial_prompt_does_not_load() -> None:
    data = {
        "name": "fleet",
        "description": "d",
        "when_to_use": "w",
        "initial_prompt": "Check {{ .hosts | join }}",
    }
    with pytest.raises(PersonaError) as info:
        persona_from_mapping(data, path="agents/fleet.md")
    assert [p.field for p in info.value.problems] == ["initial_prompt"]
    assert str(info.value).startswith("agents/fleet.md: initial_prompt: unsupported template")


def test_a_supported_initial_prompt_loads_and_renders() -> None:
    data = {
        "name": "inv",
        "description": "d",
        "when_to_use": "w",
        "initial_prompt": "You are investigating {{.incident_id}} on {{ .device.id }}.\n",
    }
    persona = persona_from_mapping(data)
    assert render_template(persona.initial_prompt, CONTEXT) == (
        "You are investigating INC-4211 on edge-17.\n"
    )
