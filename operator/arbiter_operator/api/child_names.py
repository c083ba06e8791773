"""How a DecisionModel's children are named after it and its versions, and the length limits that follow from the
names KServe derives (docs/architecture.md "Child names" has the proof that they never coincide)."""

from __future__ import annotations

# The InferenceService is `<name>--<version slug>`, and KServe v0.17 derives from it the predictor Deployment and
# Service `<isvc>-predictor` and the pod label `app: isvc.<isvc>-predictor`; a label value is at most 63 characters,
# so the InferenceService name is at most 63 - len("isvc.") - len("-predictor") = 48 characters, i.e. name plus
# version at most 48 - len("--") = 46. Multi-node predictors add `-worker` (label `isvc.<isvc>-predictor-worker`):
# 41 and 39.
NAME_SEPARATOR = "--"
LABEL_VALUE_MAX = 63
MAX_ISVC_NAME = LABEL_VALUE_MAX - len("isvc.") - len("-predictor")
MAX_ISVC_NAME_MULTINODE = MAX_ISVC_NAME - len("-worker")
MAX_NAME_PLUS_VERSION = MAX_ISVC_NAME - len(NAME_SEPARATOR)
MAX_NAME_PLUS_VERSION_MULTINODE = MAX_ISVC_NAME_MULTINODE - len(NAME_SEPARATOR)
# KServe's RawDeployment host label for a predictor, `<isvc>-predictor-<namespace>`, is one DNS label too, and KServe
# refuses the InferenceService when it is longer: name plus version at most 63 - len("--") - len("-predictor-") = 50
# characters less the namespace's length. The CRD cannot see the namespace; the operator (plan/validate.py) and the
# chart's admission policy (its CEL holds the same 50, tested against this) refuse it.
HOST_LABEL_SUFFIX = "-predictor-"
NAME_PLUS_VERSION_BEFORE_NAMESPACE = LABEL_VALUE_MAX - len(NAME_SEPARATOR) - len(HOST_LABEL_SUFFIX)
# KServe's InferenceService name rule (IsvcNameFmt in its validating webhook); the DecisionModel's name starts every
# InferenceService name, so it must fit the same rule (no dots, a letter first).
ISVC_NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"


def name_plus_version_limit(namespace: str) -> int:
    """How long a DecisionModel's name plus a version's name may be in `namespace` (never more than the CRD's)."""
    return min(MAX_NAME_PLUS_VERSION, NAME_PLUS_VERSION_BEFORE_NAMESPACE - len(namespace))


def version_slug(version: str) -> str:
    """Version name as it appears in child names (a DNS label has no dots)."""
    return version.replace(".", "-")


def isvc_name(dm_name: str, version: str) -> str:
    """`<dm>--<slug>`. Injective on (dm, slug) because a DecisionModel name never contains `--` and never ends with
    `-` (the CRD refuses both): the first `--` of an InferenceService name is the separator."""
    return f"{dm_name}{NAME_SEPARATOR}{version_slug(version)}"
