"""marketplace.formats: the official marketplace reads whole; hostile marketplaces, plugins,
trees and skills are refused with the reason."""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from marketplace.formats import (
    Marketplace,
    PluginEntry,
    check_tree,
    parse_source,
    read_json_file,
    read_marketplace,
    read_plugin,
    read_skill,
)
from marketplace.model import MAX_JSON_BYTES, BundleError

CORPUS = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "corpus"
    / "marketplaces"
    / "anthropics__claude-plugins-official"
)
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def marketplace(root: Path, plugins: list[Any], **extra: Any) -> Path:
    data = {"name": "team-tools", "owner": {"name": "Ops"}, "plugins": plugins, **extra}
    write(root / ".claude-plugin" / "marketplace.json", json.dumps(data))
    return root


def skill(folder: Path, front: str, body: str = "Do the thing.\n") -> Path:
    write(folder / "SKILL.md", f"---\n{front}---\n{body}")
    return folder


def entry(name: str = "p", **fields: Any) -> PluginEntry:
    components = {k: v for k, v in fields.items() if k != "strict"}
    return PluginEntry(
        name=name,
        source="./p",
        strict=fields.get("strict", True),
        components=components,
        raw={"name": name, **fields},
    )


# -- the official marketplace --------------------------------------------------------------------


@needs_corpus
def test_the_official_marketplace_lists_all_286_plugins_without_a_problem():
    market = read_marketplace(CORPUS)
    assert market.name == "claude-plugins-official"
    assert market.owner["name"] == "Anthropic"
    assert len(market.plugins) == 286
    assert market.problems == ()
    kinds = Counter(parse_source(e.source).kind for e in market.plugins)
    assert kinds == {"path": 53, "url": 150, "git-subdir": 83}


@needs_corpus
def test_every_path_plugin_of_the_corpus_reads_and_passes_the_tree_check():
    market = read_marketplace(CORPUS)
    layouts = {}
    for item in market.plugins:
        source = parse_source(item.source)
        if source.kind == "path":
            layout = read_plugin(market.root / source.path, item)
            check_tree(layout.root)
            layouts[item.name] = layout
    assert len(layouts) == 53
    # plugin.json, agents, commands listed as not used
    sdk = layouts["agent-sdk-dev"]
    assert [p.name for p in sdk.agent_files] == [
        "agent-sdk-verifier-py.md",
        "agent-sdk-verifier-ts.md",
    ]
    assert any(u.startswith("commands/ (") for u in sdk.unused)
    # strict: false, no plugin.json: the entry's inline lspServers define it
    assert "lspServers (inline)" in layouts["pyright-lsp"].unused
    assert layouts["pyright-lsp"].version == "1.0.0"
    # an MCP-only plugin, and skills
    assert layouts["github"].mcp_sources == (layouts["github"].root / ".mcp.json",)
    assert [d.name for d in layouts["mcp-server-dev"].skill_dirs] == [
        "build-mcp-app",
        "build-mcp-server",
        "build-mcpb",
    ]
    assert "hooks/hooks.json" in layouts["hookify"].unused
    assert layouts["security-guidance"].version == "2.0.7"


@needs_corpus
def test_all_31_skills_of_the_corpus_read():
    docs = [read_skill(path.parent) for path in sorted(CORPUS.rglob("SKILL.md"))]
    assert len(docs) == 31
    assert all(doc.description for doc in docs)
    hookify = next(d for d in docs if d.root.name == "writing-rules")
    assert hookify.name == "writing-hookify-rules"
    assert any("differs from its folder" in w for w in hookify.warnings)
    access = next(d for d in docs if d.name == "access" and "telegram" in str(d.root))
    assert "Bash(ls *)" in access.allowed_tools
    creator = next(d for d in docs if d.name == "skill-creator")
    assert "agents/grader.md" in creator.files
    assert "SKILL.md" not in creator.files


# -- JSON files ----------------------------------------------------------------------------------


def test_a_file_that_is_not_json_is_refused_with_line_and_column(tmp_path):
    path = write(tmp_path / "m.json", '{\n  "name": "x",\n  oops\n}\n')
    with pytest.raises(BundleError) as err:
        read_json_file(path, "marketplace.json")
    assert str(path) in str(err.value)
    assert "not valid JSON: line 3, column 3" in str(err.value)


@pytest.mark.parametrize(
    ("text", "kind"), [("[1, 2]", "an array"), ('"x"', "a string"), ("null", "null")]
)
def test_json_that_is_not_an_object_is_refused(tmp_path, text, kind):
    with pytest.raises(BundleError, match=f"must be a JSON object, got {kind}"):
        read_json_file(write(tmp_path / "m.json", text), "plugin.json")


def test_json_nested_too_deeply_or_too_large_is_refused(tmp_path):
    deep = write(tmp_path / "deep.json", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(BundleError, match="too deeply"):
        read_json_file(deep, "plugin.json")
    big = tmp_path / "big.json"
    with big.open("wb") as handle:
        handle.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(BundleError, match="at most 1 MiB"):
        read_json_file(big, "plugin.json")


def test_a_fifo_in_place_of_a_json_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "plugin.json"
    os.mkfifo(fifo)
    with pytest.raises(BundleError, match="FIFO"):
        read_json_file(fifo, "plugin.json")


# -- marketplace.json ----------------------------------------------------------------------------


def test_a_marketplace_json_that_is_not_json_is_refused_whole(tmp_path):
    write(tmp_path / ".claude-plugin" / "marketplace.json", "{not json")
    with pytest.raises(BundleError, match="not valid JSON: line 1, column 2"):
        read_marketplace(tmp_path)


def test_a_folder_without_marketplace_json_is_not_a_marketplace(tmp_path):
    with pytest.raises(BundleError, match="not a plugin marketplace"):
        read_marketplace(tmp_path)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"name": "Bad Name", "plugins": []}, "not a valid name"),
        ({"plugins": []}, "a name is required"),
        ({"name": "x" * 65, "plugins": []}, "at most 64"),
        ({"name": "ok"}, "plugins must be an array"),
        ({"name": "ok", "plugins": {}}, "plugins must be an array"),
        ({"name": "ok", "owner": "me", "plugins": []}, "owner and metadata must be objects"),
    ],
)
def test_a_marketplace_without_a_valid_name_or_plugin_list_is_refused(tmp_path, data, reason):
    write(tmp_path / ".claude-plugin" / "marketplace.json", json.dumps(data))
    with pytest.raises(BundleError, match=reason):
        read_marketplace(tmp_path)


def test_bad_entries_are_set_aside_and_the_others_kept(tmp_path):
    root = marketplace(
        tmp_path,
        [
            {"name": "good", "source": "./plugins/good", "version": "1.2.0", "category": "ops"},
            {"name": "Upper", "source": "./plugins/u"},
            {"name": "escape", "source": "../../etc"},
            {"name": "absolute", "source": "/etc"},
            {"name": "sneaky", "source": "./a/../../b"},
            {"name": "npm", "source": {"source": "npm", "package": "@x/y"}},
            {"name": "nosource"},
            {"name": "badstrict", "source": "./x", "strict": "no"},
            {"name": "badagents", "source": "./x", "agents": ["../outside"]},
            {"name": "twice", "source": "./a"},
            {"name": "twice", "source": "./b"},
            "not an object",
            {"name": "remote", "source": {"source": "github", "repo": "acme/tools"}},
        ],
    )
    market = read_marketplace(root)
    assert [p.name for p in market.plugins] == ["good", "remote"]
    good = market.plugins[0]
    assert (good.version, good.category, good.strict) == ("1.2.0", "ops", True)
    problems = dict(market.problems)
    assert "not a valid name" in problems["Upper"]
    assert "'..' is refused" in problems["escape"]
    assert "absolute path" in problems["absolute"]
    assert "'..' is refused" in problems["sneaky"]
    assert "npm sources are not supported" in problems["npm"]
    assert "source: required" in problems["nosource"]
    assert "strict: must be true or false" in problems["badstrict"]
    assert "agents" in problems["badagents"]
    assert "2 entries share this name" in problems["twice"]
    assert "must be an object" in problems["plugins[11]"]


def test_plugin_root_is_prepended_to_bare_sources(tmp_path):
    root = marketplace(
        tmp_path,
        [{"name": "a", "source": "a"}, {"name": "b", "source": "./elsewhere/b"}],
        metadata={"pluginRoot": "./plugins", "description": "Ours"},
    )
    market = read_marketplace(root)
    assert market.plugin_root == "plugins"
    assert market.description == "Ours"
    paths = [parse_source(p.source, plugin_root=market.plugin_root).path for p in market.plugins]
    assert paths == ["plugins/a", "elsewhere/b"]


# -- sources -------------------------------------------------------------------------------------


def test_parse_source_reads_each_kind():
    assert parse_source("./plugins/x/") == parse_source("plugins/x")
    assert parse_source("./").path == "."
    github = parse_source({"source": "github", "repo": "acme/tools", "ref": "v1"})
    assert (github.kind, github.url, github.ref) == (
        "github",
        "https://github.com/acme/tools.git",
        "v1",
    )
    sha = "a" * 40
    sub = parse_source(
        {"source": "git-subdir", "url": "acme/mono", "path": "./plugins/p", "sha": sha.upper()}
    )
    assert (sub.kind, sub.url, sub.path, sub.sha) == (
        "git-subdir",
        "https://github.com/acme/mono.git",
        "plugins/p",
        sha,
    )
    url = parse_source({"source": "url", "url": "git@gitlab.com:acme/tools.git"})
    assert (url.kind, url.url, url.path) == ("url", "git@gitlab.com:acme/tools.git", "")
    assert parse_source({"source": "url", "url": "file:///srv/repo"}).url == "file:///srv/repo"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("../../etc", "'..' is refused"),
        ("/etc", "absolute path"),
        ("./a/../../b", "'..' is refused"),
        ("~/x", "absolute path"),
        ("a\\..\\b", "backslashes"),
        ("", "non-empty relative path"),
        (42, "must be a relative path or an object"),
        ({"source": "svn", "url": "x"}, "unknown source kind"),
        ({"url": "https://h/r.git"}, "unknown source kind"),
        ({"source": "github"}, "needs repo"),
        ({"source": "github", "repo": "../../x"}, "needs repo"),
        ({"source": "git-subdir", "url": "https://h/r.git"}, "needs path"),
        ({"source": "git-subdir", "url": "https://h/r.git", "path": "../x"}, "'..' is refused"),
        ({"source": "url"}, "a git URL is required"),
        ({"source": "url", "url": "ext::sh -c touch% /tmp/pwned"}, "not a usable git URL"),
        ({"source": "url", "url": "ext::sh"}, "only https, ssh and file"),
        ({"source": "url", "url": "--upload-pack=touch /tmp/x"}, "not a usable git URL"),
        ({"source": "url", "url": "http://h/r.git"}, "unencrypted"),
        ({"source": "url", "url": "./relative"}, "is not a git URL"),
        ({"source": "url", "url": "https://h/r.git", "ref": "--force"}, "not a branch or tag"),
        ({"source": "url", "url": "https://h/r.git", "ref": "a..b"}, "not a branch or tag"),
        ({"source": "url", "url": "https://h/r.git", "sha": "abc123"}, "full commit SHA"),
    ],
)
def test_parse_source_refuses(raw, reason):
    with pytest.raises(BundleError, match=reason):
        parse_source(raw)


# -- plugins -------------------------------------------------------------------------------------


def plugin(root: Path, manifest: dict[str, Any] | None = None) -> Path:
    if manifest is not None:
        write(root / ".claude-plugin" / "plugin.json", json.dumps(manifest))
    write(root / "agents" / "triage.md", "---\nname: triage\ndescription: d\n---\nBody\n")
    write(root / "agents" / "notes.txt", "not an agent")
    skill(root / "skills" / "disk-usage", "name: disk-usage\ndescription: Find big files.\n")
    write(root / "skills" / "disk-usage" / "ongrid-tools.yaml", "tools: []\n")
    write(root / "skills" / "README.md", "a folder without SKILL.md is not a skill")
    write(root / ".mcp.json", '{"time": {"command": "uvx", "args": ["mcp-server-time"]}}')
    write(root / "commands" / "a.md", "a")
    write(root / "commands" / "b.md", "b")
    write(root / "hooks" / "hooks.json", "{}")
    write(root / "ongrid-tools.yaml", "tools: []\n")
    return root


def test_a_plugin_reads_its_default_folders(tmp_path):
    root = plugin(tmp_path / "p", {"name": "p", "version": "2.0.0", "author": {"name": "Ops"}})
    layout = read_plugin(root)
    assert layout.name == "p"
    assert layout.version == "2.0.0"
    assert layout.author == {"name": "Ops"}
    assert [p.name for p in layout.agent_files] == ["triage.md"]
    assert [p.name for p in layout.skill_dirs] == ["disk-usage"]
    assert layout.mcp_sources == (layout.root / ".mcp.json",)
    assert layout.manifest_files == (
        layout.root / "ongrid-tools.yaml",
        layout.root / "skills" / "disk-usage" / "ongrid-tools.yaml",
    )
    assert layout.unused == ("commands/ (2 files)", "hooks/hooks.json")
    assert layout.warnings == ()


def test_without_plugin_json_the_entry_and_then_the_folder_name_the_plugin(tmp_path):
    root = plugin(tmp_path / "folder-name")
    assert read_plugin(root).name == "folder-name"
    assert read_plugin(root).version == ""
    layout = read_plugin(root, PluginEntry(name="listed", source="./x", version="0.3.0"))
    assert (layout.name, layout.version) == ("listed", "0.3.0")


def test_plugin_json_version_wins_over_the_entry_with_a_warning(tmp_path):
    root = plugin(tmp_path / "p", {"name": "p", "version": "2.0.0"})
    layout = read_plugin(root, PluginEntry(name="p", source="./p", version="1.0.0"))
    assert layout.version == "2.0.0"
    assert any("wins over 1.0.0" in w for w in layout.warnings)


def test_custom_component_paths_replace_the_default_folders(tmp_path):
    root = plugin(
        tmp_path / "p",
        {
            "name": "p",
            "agents": ["./extra/reviewer.md"],
            "skills": "./more-skills/",
            "commands": "./cmds",
            "mcpServers": {"inline": {"type": "http", "url": "https://example.invalid/mcp"}},
        },
    )
    write(root / "extra" / "reviewer.md", "---\nname: reviewer\ndescription: d\n---\n")
    skill(root / "more-skills" / "logs", "name: logs\ndescription: Read logs.\n")
    write(root / "cmds" / "x.md", "x")
    layout = read_plugin(root)
    assert [p.name for p in layout.agent_files] == ["reviewer.md"]
    assert [p.name for p in layout.skill_dirs] == ["logs"]
    # mcpServers adds to .mcp.json
    assert layout.mcp_sources == (
        layout.root / ".mcp.json",
        {"inline": {"type": "http", "url": "https://example.invalid/mcp"}},
    )
    assert "commands: ./cmds (1 file)" in layout.unused
    assert not any(u.startswith("commands/") for u in layout.unused)


def test_listing_the_default_folder_keeps_it_next_to_custom_paths(tmp_path):
    root = plugin(tmp_path / "p", {"name": "p", "agents": ["./agents/", "./extra/"]})
    write(root / "extra" / "reviewer.md", "---\nname: reviewer\ndescription: d\n---\n")
    layout = read_plugin(root)
    assert [p.name for p in layout.agent_files] == ["triage.md", "reviewer.md"]


def test_a_skill_path_that_is_itself_a_skill_folder(tmp_path):
    root = tmp_path / "p"
    skill(root, "name: whole-plugin\ndescription: The plugin is one skill.\n")
    layout = read_plugin(root, entry(strict=False, skills=["./"]))
    assert layout.skill_dirs == (layout.root,)


def test_strict_false_lets_the_entry_define_the_plugin(tmp_path):
    root = tmp_path / "p"
    skill(root / "a", "name: a\ndescription: A.\n")
    skill(root / "b", "name: b\ndescription: B.\n")
    layout = read_plugin(root, entry(strict=False, skills=["./a", "./b"], lspServers={"x": {}}))
    assert [p.name for p in layout.skill_dirs] == ["a", "b"]
    assert "lspServers (inline)" in layout.unused


def test_strict_false_and_plugin_json_components_conflict(tmp_path):
    root = plugin(tmp_path / "p", {"name": "p", "agents": "./agents/"})
    with pytest.raises(BundleError, match="strict: false .* declares components too"):
        read_plugin(root, entry(strict=False, agents="./agents/"))
    # with strict: true (the default) they merge
    layout = read_plugin(root, entry(agents="./agents/triage.md"))
    assert [p.name for p in layout.agent_files] == ["triage.md", "triage.md"]


def test_a_missing_component_path_is_a_warning(tmp_path):
    root = plugin(tmp_path / "p", {"name": "p", "agents": "./nowhere/"})
    layout = read_plugin(root)
    assert layout.agent_files == ()
    assert layout.warnings == ("agents path ./nowhere/ does not exist",)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("agents", "../outside", "'..' is refused"),
        ("skills", ["/etc"], "absolute path"),
        ("mcpServers", "./x/../../y.json", "'..' is refused"),
        ("hooks", 3, "must be a path or a list of paths, or an inline object"),
        ("commands", {"a": 1}, "must be a path or a list of paths"),
    ],
)
def test_component_paths_that_leave_the_plugin_are_refused(tmp_path, key, value, reason):
    root = plugin(tmp_path / "p", {"name": "p", key: value})
    with pytest.raises(BundleError, match=reason):
        read_plugin(root)


def test_a_component_folder_symlinked_out_of_the_plugin_is_refused(tmp_path):
    outside = tmp_path / "outside"
    write(outside / "evil.md", "---\nname: evil\ndescription: d\n---\n")
    root = tmp_path / "p"
    root.mkdir()
    (root / "agents").symlink_to(outside)
    with pytest.raises(BundleError, match="outside"):
        read_plugin(root)
    (root / "agents").unlink()
    (root / "agents").mkdir()
    (root / "agents" / "evil.md").symlink_to(outside / "evil.md")
    with pytest.raises(BundleError, match="agents/evil.md: resolves to"):
        read_plugin(root)


def test_a_plugin_json_that_is_not_json_or_misnames_the_plugin_is_refused(tmp_path):
    root = tmp_path / "p"
    write(root / ".claude-plugin" / "plugin.json", "{")
    with pytest.raises(BundleError, match="plugin.json is not valid JSON"):
        read_plugin(root)
    write(root / ".claude-plugin" / "plugin.json", '{"name": "Has Spaces"}')
    with pytest.raises(BundleError, match="not a valid name"):
        read_plugin(root)


# -- trees ---------------------------------------------------------------------------------------


def test_check_tree_lists_files_skips_git_and_allows_symlinks_inside(tmp_path):
    write(tmp_path / "a.md", "a")
    write(tmp_path / "scripts" / "run.sh", "echo")
    write(tmp_path / ".git" / "config", "[core]")
    (tmp_path / "link.sh").symlink_to("scripts/run.sh")
    (tmp_path / "more").symlink_to("scripts")
    assert check_tree(tmp_path) == [
        Path("a.md"),
        Path("link.sh"),
        Path("more/run.sh"),
        Path("scripts/run.sh"),
    ]


def test_check_tree_refuses_a_symlink_out_of_the_bundle(tmp_path):
    write(tmp_path / "ok.md", "a")
    (tmp_path / "skills").mkdir()
    (tmp_path / "skills" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(BundleError) as err:
        check_tree(tmp_path)
    assert err.value.where == "skills/passwd"
    assert "outside the bundle" in err.value.reason
    (tmp_path / "skills" / "passwd").unlink()
    (tmp_path / "skills" / "up").symlink_to("../..")
    with pytest.raises(BundleError, match="outside the bundle"):
        check_tree(tmp_path)


def test_check_tree_refuses_loops_and_dangling_links(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "loop").symlink_to("..")
    with pytest.raises(BundleError, match="loops back"):
        check_tree(tmp_path)
    (tmp_path / "sub" / "loop").unlink()
    (tmp_path / "sub" / "gone").symlink_to("missing.md")
    with pytest.raises(BundleError, match="does not exist"):
        check_tree(tmp_path)


def test_check_tree_refuses_a_100_mb_file_from_its_size(tmp_path):
    big = tmp_path / "assets" / "big.bin"
    big.parent.mkdir()
    with big.open("wb") as handle:
        handle.truncate(100 * 1024 * 1024)  # sparse: nothing is written, nothing must be read
    with pytest.raises(BundleError) as err:
        check_tree(tmp_path)
    assert err.value.where == "assets/big.bin"
    assert err.value.reason == "file is 100 MiB; at most 10 MiB"


def test_check_tree_refuses_fifos_and_sockets(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(BundleError, match="pipe: is a FIFO"):
        check_tree(tmp_path)
    (tmp_path / "pipe").unlink()
    # AF_UNIX paths are short: bind inside a short directory name under tmp_path
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "s"))
        with pytest.raises(BundleError, match="s: is a socket"):
            check_tree(tmp_path)


def test_check_tree_bounds_the_count_and_the_total(tmp_path):
    for i in range(4):
        write(tmp_path / f"f{i}.txt", "x" * 100)
    with pytest.raises(BundleError, match="more than 3 files"):
        check_tree(tmp_path, max_files=3)
    with pytest.raises(BundleError, match="larger than 250 bytes"):
        check_tree(tmp_path, max_total=250)
    assert len(check_tree(tmp_path, max_files=4, max_total=400)) == 4


# -- skills --------------------------------------------------------------------------------------


def test_a_skill_reads_its_frontmatter_and_lists_its_files(tmp_path):
    folder = skill(
        tmp_path / "pdf-tools",
        "name: pdf-tools\ndescription: Split PDFs.\nlicense: Apache-2.0\n"
        "compatibility: needs qpdf\nmetadata:\n  author: ops\n"
        "allowed-tools: Bash(qpdf *) Read, Grep\nuser-invocable: true\n",
        body="# PDF tools\n",
    )
    write(folder / "scripts" / "split.sh", "qpdf")
    write(folder / "references" / "qpdf.md", "ref")
    doc = read_skill(folder)
    assert (doc.name, doc.description, doc.license, doc.compatibility) == (
        "pdf-tools",
        "Split PDFs.",
        "Apache-2.0",
        "needs qpdf",
    )
    assert doc.metadata == {"author": "ops"}
    assert doc.allowed_tools == ("Bash(qpdf *)", "Read", "Grep")
    assert doc.body == "# PDF tools\n"
    assert doc.files == ("references/qpdf.md", "scripts/split.sh")
    assert doc.raw["user-invocable"] is True
    assert doc.warnings == ()


def test_a_skill_without_a_name_takes_its_folders_with_a_warning(tmp_path):
    doc = read_skill(skill(tmp_path / "log-reader", "description: Read logs.\n"))
    assert doc.name == "log-reader"
    assert doc.warnings == ("no name in the frontmatter: the folder's name log-reader is used",)


@pytest.mark.parametrize(
    ("front", "reason"),
    [
        ("name: ok\n", "description: required"),
        ("name: Bad_Name\ndescription: d\n", "is not a skill name"),
        ("name: a--b\ndescription: d\n", "is not a skill name"),
        ("name: ok\ndescription: d\nmetadata: [1]\n", "metadata: must be a mapping"),
        ("name: ok\ndescription: d\nallowed-tools: {a: 1}\n", "allowed-tools"),
        ("name: ok\ndescription: d\nlicense: [MIT]\n", "license: must be a string"),
    ],
)
def test_a_skill_with_bad_frontmatter_is_refused(tmp_path, front, reason):
    with pytest.raises(BundleError, match=reason):
        read_skill(skill(tmp_path / "ok", front))


def test_a_skill_without_frontmatter_or_with_a_symlink_out_is_refused(tmp_path):
    folder = tmp_path / "s"
    write(folder / "SKILL.md", "no frontmatter here\n")
    with pytest.raises(BundleError, match="no frontmatter"):
        read_skill(folder)
    skill(folder, "name: s\ndescription: d\n")
    (folder / "secrets").symlink_to("/etc")
    with pytest.raises(BundleError, match="outside the bundle"):
        read_skill(folder)


def test_a_marketplace_with_a_dangerous_entry_still_reads_the_good_one(tmp_path):
    root = marketplace(tmp_path, [{"name": "ok", "source": "./ok"}, {"name": "x", "source": "/"}])
    market: Marketplace = read_marketplace(root)
    assert [p.name for p in market.plugins] == ["ok"]
    assert market.root == tmp_path.resolve()
