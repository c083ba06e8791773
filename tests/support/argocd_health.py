"""The Argo CD health check (helm/arbiter/health/decisionmodel.lua) run the way Argo CD runs it, by a real Lua
interpreter (lupa): shared by the pure snapshot tests and the end-to-end promotion tests."""

from __future__ import annotations

import json

from lupa import LuaRuntime

from support.paths import REPO

LUA = REPO / "helm" / "arbiter" / "health" / "decisionmodel.lua"


def health(obj: dict) -> tuple[str, str]:
    """Run the check the way Argo CD does: the resource as global `obj`, the script's return value is the health."""
    lua = LuaRuntime(unpack_returned_tuples=True)

    def to_lua(v):
        # JSON objects become Lua tables with string keys, arrays become 1-based sequences: what Argo CD hands over.
        if isinstance(v, dict):
            return lua.table_from({k: to_lua(x) for k, x in v.items()})
        if isinstance(v, list):
            return lua.table_from([to_lua(x) for x in v])
        return v

    lua.globals().obj = to_lua(json.loads(json.dumps(obj)))
    hs = lua.execute(LUA.read_text())
    return hs["status"], hs["message"]
