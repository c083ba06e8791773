"""The plugin's one way into a cluster: kubectl's kubeconfig rules and flags, one-line errors with documented exit
codes, and the few reads and writes the commands make (DecisionModels, their Events, pods and InferenceServices).

Every read is the user's own: the kubeconfig's credentials, optionally impersonating (--as/--as-group). A read the
user may not make raises CliError(EXIT_FORBIDDEN); commands that can do without it (diagnose, the dashboard) say so
instead of failing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3._collections import HTTPHeaderDict

from ..api.names import CLI_FIELD_MANAGER, GROUP, PLURAL, VERSION

FIELD_MANAGER = CLI_FIELD_MANAGER

# Exit codes (documented in docs/operations.md): scripts tell "fix your kubeconfig" from "the cluster said no".
EXIT_OK = 0
EXIT_REFUSED = 1  # the resource's state does not allow the command (nothing to retry, unknown version, ...)
EXIT_USAGE = 2  # argparse's own code for a malformed command line
EXIT_GITOPS = 3  # managed by Argo CD: nothing changed, the change for Git was printed
EXIT_CONFIG = 4  # no usable kubeconfig or context
EXIT_UNREACHABLE = 5  # the apiserver could not be reached or did not answer in time
EXIT_FORBIDDEN = 6  # 401/403: not authenticated or not allowed
EXIT_NOT_FOUND = 7  # the DecisionModel (or the DecisionModel API itself) does not exist
EXIT_API = 8  # any other apiserver error (conflict, invalid, 5xx)
EXIT_DEGRADED = 9  # status --timeout: the promotion failed or was rolled back, or the model is Stalled
EXIT_TIMEOUT = 10  # status --timeout: still in progress when the time ran out
EXIT_PROBLEMS = 11  # lint: a manifest the apiserver or the operator would refuse; diagnose: a problem found


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_timeout(text: str) -> float | None:
    """kubectl's --request-timeout: a bare number of seconds or a Go duration ("500ms", "1m30s"); 0 means none."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    elif text and _DURATION.sub("", text) == "":
        scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
        seconds = sum(float(n) * scale[u] for n, u in _DURATION.findall(text))
    else:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (use e.g. 30, 10s, 1m, 500ms; 0 = no limit)")
    return seconds or None


class _Impersonating:
    """Adds Impersonate-User and one Impersonate-Group header per group (kubectl's --as/--as-group) to every request.

    The generated client keeps headers in a plain dict, which cannot repeat a name; urllib3's HTTPHeaderDict can.
    """

    def __init__(self, pool: Any, user: str | None, groups: Sequence[str]) -> None:
        self._pool, self._user, self._groups = pool, user, list(groups)

    def request(self, method: str, url: str, headers: Any = None, **kw: Any) -> Any:
        merged = HTTPHeaderDict(headers or {})
        if self._user:
            merged["Impersonate-User"] = self._user
        for group in self._groups:
            merged.add("Impersonate-Group", group)
        return self._pool.request(method, url, headers=merged, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def api_error(exc: ApiException, what: str) -> CliError:
    detail = exc.reason
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        detail = json.loads(exc.body or "").get("message", detail)
    if exc.status in (401, 403):
        hint = " (log in again)" if exc.status == 401 else " (ask for a Role that allows it, or use --as)"
        return CliError(f"{what}: {detail}{hint}", EXIT_FORBIDDEN)
    if exc.status == 404:
        return CliError(f"{what}: {detail}", EXIT_NOT_FOUND)
    return CliError(f"{what}: {exc.status} {detail}", EXIT_API)


def checked(obj: Any, what: str) -> dict[str, Any]:
    """The shape every command relies on; anything else is the apiserver (or a proxy) answering nonsense."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not (isinstance(meta, dict) and isinstance(meta.get("name"), str) and isinstance(meta.get("namespace"), str)
            and isinstance(obj.get("spec") or {}, dict) and isinstance(obj.get("status") or {}, dict)):
        raise CliError(f"unexpected answer for {what}: not a DecisionModel object", EXIT_API)
    return cast("dict[str, Any]", obj)


def checked_list(items: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(items, list):
        raise CliError(f"unexpected answer for {what}: no item list", EXIT_API)
    return [checked(item, what) for item in items]


def _items(found: Any) -> list[dict[str, Any]]:
    items = found.get("items") if isinstance(found, dict) else None
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


class Cluster:
    def __init__(self, kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None,
                 user: str | None = None, groups: Sequence[str] = (), timeout: float | None = None) -> None:
        configuration = client.Configuration()
        ctx_ns = None
        # kubectl's order: --kubeconfig, then $KUBECONFIG (a ':'-separated list; empty counts as unset), then ~/.kube.
        files = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        exists = any(os.path.exists(os.path.expanduser(f)) for f in files.split(os.pathsep) if f)
        try:
            if exists or kubeconfig:
                config.load_kube_config(config_file=files, context=context, client_configuration=configuration,
                                        persist_config=False)
                contexts, active = config.list_kube_config_contexts(config_file=files)
                if context:
                    active = next((c for c in contexts if c.get("name") == context), active)
                ctx_ns = (active or {}).get("context", {}).get("namespace")
            elif os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(client_configuration=configuration)
            else:
                raise CliError(f"no kubeconfig: {files} does not exist; log in (oc login, or kubectl config) or "
                               "pass --kubeconfig FILE", EXIT_CONFIG)
        except (config.ConfigException, OSError, yaml.YAMLError, TypeError, ValueError, KeyError,
                AttributeError) as exc:
            raise CliError(f"cannot use kubeconfig {files}: {exc}", EXIT_CONFIG) from None
        # One attempt per request, like kubectl: an unreachable server answers within --request-timeout, not 4x.
        configuration.retries = urllib3.Retry(total=0, connect=0, read=0, redirect=3, status=0, other=0)
        self.configuration = configuration
        self.server = configuration.host
        self.namespace = namespace or ctx_ns or "default"
        self.namespace_given = namespace is not None
        self.timeout = timeout
        self.api_client = client.ApiClient(configuration)
        if user or groups:
            if groups and not user:
                raise CliError("--as-group needs --as (the apiserver impersonates groups only with a user)",
                               EXIT_CONFIG)
            self.api_client.rest_client.pool_manager = _Impersonating(  # type: ignore[assignment]  # (a wrapper)
                self.api_client.rest_client.pool_manager, user, groups)
        self.api = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)

    def bearer_token(self) -> str | None:
        """The kubeconfig's bearer token, if it has one (a token user, `oc login`): what Prometheus on OpenShift and
        the runtime's metrics endpoint accept from a user allowed to read metrics."""
        value = (self.configuration.api_key or {}).get("authorization") or ""
        return value.removeprefix("Bearer ").strip() or None

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if self.timeout and "_request_timeout" not in kw:
            kw["_request_timeout"] = self.timeout
        try:
            return fn(*args, **kw)
        except ApiException as exc:
            raise api_error(exc, what) from None
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            timed_out = (isinstance(exc, urllib3.exceptions.TimeoutError) or isinstance(
                reason, (TimeoutError, urllib3.exceptions.TimeoutError, socket.timeout)))
            if isinstance(reason, urllib3.exceptions.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(reason):
                msg = f"TLS to {self.server} failed: {reason}"
            elif isinstance(reason, urllib3.exceptions.NewConnectionError):  # a subclass of the timeout error
                msg = f"cannot reach the apiserver {self.server}: {reason}"
            elif timed_out:
                limit = f"within --request-timeout={self.timeout:g}s" if self.timeout else "in time"
                msg = f"the apiserver {self.server} did not answer {limit}"
            else:
                msg = f"cannot reach the apiserver {self.server}: {reason}"
            raise CliError(msg, EXIT_UNREACHABLE) from None

    # -- DecisionModels -----------------------------------------------------------------------------------------------
    def get(self, name: str) -> dict[str, Any]:
        try:
            obj = self.call(f"cannot read decisionmodel {self.namespace}/{name}",
                            self.api.get_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name)
        except CliError as exc:
            if exc.code == EXIT_NOT_FOUND:
                raise CliError(f'decisionmodel "{name}" not found in namespace "{self.namespace}" (is Arbiter '
                               "installed on this cluster? `kubectl get crd decisionmodels.arbiter.dev`)",
                               EXIT_NOT_FOUND) from None
            raise
        return checked(obj, f"decisionmodel {self.namespace}/{name}")

    def list_models(self, all_namespaces: bool = False) -> tuple[list[dict[str, Any]], str]:
        """Every DecisionModel of the namespace (or of all namespaces) and the list's resourceVersion."""
        if all_namespaces:
            found = self.call("cannot list decisionmodels in all namespaces",
                              self.api.list_cluster_custom_object, GROUP, VERSION, PLURAL)
        else:
            found = self.call(f"cannot list decisionmodels in namespace {self.namespace}",
                              self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL)
        items = found.get("items") if isinstance(found, dict) else None
        version = str(((found or {}).get("metadata") or {}).get("resourceVersion") or "")
        return checked_list(items, "decisionmodels"), version

    def names(self) -> list[str]:
        return [str(item["metadata"]["name"]) for item in self.list_models()[0]]

    def patch(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return checked(self.call(f"cannot update decisionmodel {self.namespace}/{name}",
                       self.api.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name, body,
                       field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json"), "the patch")

    def watch(self, name: str | None = None, all_namespaces: bool = False, resource_version: str = "",
              seconds: int = 300) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) of DecisionModels from `resource_version` for at most `seconds`: one DecisionModel
        (a field selector on its name), a namespace's, or all. Ends when the apiserver ends the watch."""
        if all_namespaces:
            fn: Callable[..., Any] = self.api.list_cluster_custom_object
            args: tuple[Any, ...] = (GROUP, VERSION, PLURAL)
        else:
            fn, args = self.api.list_namespaced_custom_object, (GROUP, VERSION, self.namespace, PLURAL)
        selector = f"metadata.name={name}" if name else None
        for kind, obj in self.stream("decisionmodels", fn, args, resource_version, seconds, selector):
            yield kind, checked(obj, "a watched decisionmodel")

    def stream(self, what: str, fn: Callable[..., Any], args: tuple[Any, ...], resource_version: str = "",
               seconds: int = 300, field_selector: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """A watch of any list call: (ADDED|MODIFIED|DELETED, object); an ERROR event ends it with a CliError."""
        kw: dict[str, Any] = {"timeout_seconds": seconds, "allow_watch_bookmarks": False}
        if resource_version:
            kw["resource_version"] = resource_version
        if field_selector:
            kw["field_selector"] = field_selector
        # The watch's read timeout: a little longer than the apiserver's own end of the watch.
        kw["_request_timeout"] = (self.timeout or 30, seconds + 30)
        stream = watch.Watch().stream(fn, *args, **kw)
        try:
            while True:
                try:
                    event = self.call(f"cannot watch {what}", next, stream)
                except StopIteration:
                    return
                obj = event.get("object") if isinstance(event, dict) else None
                kind = str(event.get("type") or "") if isinstance(event, dict) else ""
                if kind == "ERROR":
                    raise CliError(f"the watch of {what} ended: {(obj or {}).get('message', obj)}", EXIT_API)
                if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                    yield kind, obj
        finally:
            stream.close()

    def list_events(self, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        """The Events of a namespace (or of all) and the list's resourceVersion."""
        if namespace is None:
            found = self.call("cannot list events in all namespaces", self.core.list_event_for_all_namespaces,
                              _preload_content=False)
        else:
            found = self.call(f"cannot list events in namespace {namespace}", self.core.list_namespaced_event,
                              namespace, _preload_content=False)
        doc = _json(found)
        return _items(doc), str(((doc or {}).get("metadata") or {}).get("resourceVersion") or "")

    def watch_events(self, namespace: str | None, resource_version: str,
                     seconds: int = 300) -> Iterator[tuple[str, dict[str, Any]]]:
        if namespace is None:
            fn: Callable[..., Any] = self.core.list_event_for_all_namespaces
            args: tuple[Any, ...] = ()
        else:
            fn, args = self.core.list_namespaced_event, (namespace,)
        # The generated client would build V1Event objects; the raw dicts are what the pages read.
        yield from self.stream("events", _raw(fn), args, resource_version, seconds)

    # -- what diagnose and the dashboard read besides ---------------------------------------------------------------
    def events(self, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]:
        """Events of the namespace about these objects (the DecisionModel, its InferenceServices, its pods), newest
        last. One list of the namespace's Events, filtered here: a field selector takes one name at a time."""
        found = self.call(f"cannot list events in namespace {namespace}",
                          self.core.list_namespaced_event, namespace, _preload_content=False)
        items = _items(_json(found))
        wanted = set(names)
        mine = [e for e in items if ((e.get("involvedObject") or {}).get("name") in wanted
                                     or any(str((e.get("involvedObject") or {}).get("name") or "").startswith(f"{n}--")
                                            for n in names))]
        return sorted(mine, key=_event_time)

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        found = self.call(f"cannot list pods in namespace {namespace}", self.core.list_namespaced_pod, namespace,
                          label_selector=selector, _preload_content=False)
        return _items(_json(found))

    def inference_services(self, namespace: str, model: str) -> list[dict[str, Any]]:
        found = self.call(f"cannot list inferenceservices in namespace {namespace}",
                          self.api.list_namespaced_custom_object, "serving.kserve.io", "v1beta1", namespace,
                          "inferenceservices", label_selector=f"arbiter.dev/decision-model={model}")
        return _items(found)


def _raw(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A generated client's list call that hands the watch its raw JSON lines (kubernetes.watch decodes them to dicts
    when the call has no return type to deserialize into)."""

    def call(*args: Any, **kw: Any) -> Any:
        return fn(*args, **kw)

    call.__doc__ = ":return: object"  # kubernetes.watch reads the return type from the docstring
    return call


def _json(resp: Any) -> Any:
    try:
        return json.loads(resp.data)
    except (ValueError, AttributeError):
        raise CliError("unexpected answer: not JSON", EXIT_API) from None


def _event_time(event: dict[str, Any]) -> str:
    series: dict[str, Any] = event["series"] if isinstance(event.get("series"), dict) else {}
    return str(series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
               or (event.get("metadata") or {}).get("creationTimestamp") or "")
