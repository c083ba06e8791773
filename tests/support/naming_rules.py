"""The CRD's rules on DecisionModel and version names, mirrored in Python for the property tests
(tests/unit/operator filters generated DecisionModels with it; tests/cluster/operator checks it against the real
apiserver's answers)."""

from __future__ import annotations

import re

from arbiter_operator.api import models as m

VERSION_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
ISVC_RE = re.compile(m.ISVC_NAME_PATTERN)


def legacy_isvc_name(dm_name: str, version: str) -> str:
    """The name builds before the `--` scheme gave an InferenceService (`<dm>-<slug>`, not injective): the operator
    finds such children by label and owner uid, never by this name; tests create them under it."""
    return f"{dm_name}-{m.version_slug(version)}"


def crd_accepts(name: str, versions: list[str], nodes: int = 1) -> bool:
    limit = m.MAX_NAME_PLUS_VERSION if nodes == 1 else m.MAX_NAME_PLUS_VERSION_MULTINODE
    slugs = [v.replace(".", "-") for v in versions]
    return (
        bool(ISVC_RE.match(name))
        and m.NAME_SEPARATOR not in name
        and all(VERSION_RE.match(v) and len(v) <= 40 and len(name) + len(v) <= limit for v in versions)
        and len(set(slugs)) == len(slugs)
        and len(versions) >= 1
    )
