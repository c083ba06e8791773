"""ensure_tool builds a Go binary from its tools module once, then only finds it in the cache."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest
from arbiter_devenv import tools


@pytest.fixture
def hello_repo(tmp_path, monkeypatch):
    """A checkout with one tiny tools module, and an empty binary cache."""
    module = tmp_path / "repo" / "hack" / "tools" / "hello"
    module.mkdir(parents=True)
    (module / "go.mod").write_text("module example.com/hello\n\ngo 1.24\n")
    (module / "main.go").write_text(
        'package main\n\nimport "fmt"\n\nvar version = "unset"\n\nfunc main() { fmt.Println("hello", version) }\n'
    )
    (module / "tool.json").write_text(json.dumps({
        "name": "hello", "version": "v1.2.3", "package": ".", "binary": "hello",
        "ldflags": "-s -w -X main.version=v1.2.3",
    }))
    # Go keeps its build cache under XDG_CACHE_HOME too; pin it first so only Arbiter's binary cache is fresh.
    gocache = subprocess.run(["go", "env", "GOCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setenv("GOCACHE", gocache)
    monkeypatch.setenv("ARBITER_REPO_ROOT", str(tmp_path / "repo"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_builds_once_into_the_versioned_cache(hello_repo, monkeypatch, capsys):
    path = tools.ensure_tool("hello")
    assert path == hello_repo / "cache" / "arbiter" / "bin" / "hello-v1.2.3" / "hello"
    assert subprocess.run([path], capture_output=True, text=True).stdout == "hello v1.2.3\n"
    assert "building hello v1.2.3" in capsys.readouterr().err

    # Cached: found without Go on PATH and without building.
    monkeypatch.setenv("PATH", "/nonexistent")
    assert tools.ensure_tool("hello") == path
    assert "building" not in capsys.readouterr().err
    # No temporary build output is left beside the binary (only the record of what it was built from).
    assert sorted(os.listdir(path.parent)) == [".hello.inputs", "hello"]


def test_changed_inputs_rebuild_without_a_version_bump(hello_repo, capsys):
    path = tools.ensure_tool("hello")
    spec = hello_repo / "repo" / "hack" / "tools" / "hello" / "tool.json"
    spec.write_text(spec.read_text().replace("main.version=v1.2.3", "main.version=v1.2.3-patched"))
    assert tools.ensure_tool("hello") == path
    assert subprocess.run([path], capture_output=True, text=True).stdout == "hello v1.2.3-patched\n"
    assert capsys.readouterr().err.count("building hello") == 2


def test_parallel_callers_build_once(hello_repo, capsys):
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(tools.ensure_tool("hello"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 3
    assert capsys.readouterr().err.count("building hello") == 1


def test_unknown_tool_names_the_known_ones(hello_repo):
    with pytest.raises(tools.ToolError, match="known: hello"):
        tools.ensure_tool("nope")


def test_build_failure_reports_go_output(hello_repo):
    (hello_repo / "repo" / "hack" / "tools" / "hello" / "main.go").write_text("package main\n\nfunc main() { x }\n")
    with pytest.raises(tools.ToolError, match="undefined: x"):
        tools.ensure_tool("hello")
    assert not (hello_repo / "cache" / "arbiter" / "bin" / "hello-v1.2.3" / "hello").exists()


def test_repository_tools_are_described():
    names = tools.tool_names()
    assert {"etcd", "kube-apiserver", "seaweedfs"} <= set(names)
    for name in names:
        tool = tools.load_tool(name)
        assert tool.version and tool.package


def test_optional_tools_are_built_on_demand_only(hello_repo, capsys):
    spec = hello_repo / "repo" / "hack" / "tools" / "hello" / "tool.json"
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "optional": True}))
    assert tools.main(["build"]) == 0  # what hack/setup.sh runs: every tool but the optional ones
    assert "hello" not in capsys.readouterr().out
    assert not tools.load_tool("hello").is_cached()
    assert tools.main(["build", "hello"]) == 0 and tools.load_tool("hello").is_cached()
