"""KServe stand-in: NOT KServe. A small watcher that does, for InferenceServices, the two things the operator reads
from KServe's controller, which cannot run here (no kubelet, no GPUs):

- it writes the status KServe writes in RawDeployment mode (conditions PredictorReady/IngressReady/Ready, url,
  address, components.predictor, modelStatus, observedGeneration), in KServe's v1beta1 wire format;
- it creates the `<isvc>-predictor` Service KServe creates (port 80 -> 8080), owned by the InferenceService.

Tests steer it per InferenceService with the annotation `standin.arbiter.dev/state`:
  ready (default) | pending (never becomes ready) | failed (BlockedByFailedLoad, as after a crash-looping load).
The default for unannotated InferenceServices is a constructor argument.

    python -m arbiter_operator.devenv.kserve_standin [--kubeconfig PATH] [-n NAMESPACE] [--default-state ready]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from datetime import datetime, timezone
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException

from ..clients.kube import KubeError, raw_call

log = logging.getLogger("arbiter.kserve-standin")

STATE_ANNOTATION = "standin.arbiter.dev/state"
GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
STATES = ("ready", "pending", "failed")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def desired_status(isvc: dict[str, Any], state: str) -> dict[str, Any]:
    """The status KServe's controller would write for this InferenceService in `state` (no timestamps)."""
    meta = isvc["metadata"]
    name, ns = meta["name"], meta["namespace"]
    internal = f"http://{name}-predictor.{ns}.svc.cluster.local"
    ready = state == "ready"

    def cond(type_: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
        c: dict[str, Any] = {"type": type_, "status": "True" if ok else "False"}
        if not ok:
            c["reason"] = reason
            c["message"] = message
        return c

    if state == "failed":
        why = ("ModelLoadFailed", "predictor container exited with code 1 while loading the model (stand-in)")
        model_status = {
            "transitionStatus": "BlockedByFailedLoad",
            "states": {"activeModelState": "FailedToLoad", "targetModelState": "FailedToLoad"},
            "lastFailureInfo": {"reason": why[0], "message": why[1]},
            "copies": {"failedCopies": 1, "totalCopies": 0},
        }
    elif state == "pending":
        why = ("PredictorNotReady", "Deployment does not have minimum availability (stand-in: pending)")
        model_status = {
            "transitionStatus": "InProgress",
            "states": {"activeModelState": "Pending", "targetModelState": "Loaded"},
        }
    else:
        why = ("", "")
        model_status = {
            "transitionStatus": "UpToDate",
            "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"},
            "copies": {"failedCopies": 0, "totalCopies": 1},
        }
    status: dict[str, Any] = {
        "observedGeneration": meta.get("generation", 1),
        "deploymentMode": "RawDeployment",
        "conditions": [
            cond("IngressReady", True),
            cond("PredictorReady", ready, *why),
            cond("Ready", ready, *why),
        ],
        "modelStatus": model_status,
    }
    if ready:
        status["url"] = internal
        status["address"] = {"url": internal}
        status["components"] = {"predictor": {"url": internal, "address": {"url": internal}}}
    return status


def _strip_times(status: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(status))
    for c in out.get("conditions") or []:
        c.pop("lastTransitionTime", None)
    return out


class KServeStandIn:
    """Start with `.start()`, stop with `.stop()`; or use as a context manager."""

    def __init__(self, api_client: k8s.ApiClient, namespaces: list[str] | None = None, default_state: str = "ready"):
        if default_state not in STATES:
            raise ValueError(f"default_state must be one of {STATES}")
        self.api = api_client
        self.custom = k8s.CustomObjectsApi(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.namespaces = namespaces
        self.default_state = default_state
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list[k8s_watch.Watch] = []
        self._services: set[str] = set()  # uids of InferenceServices whose predictor Service exists

    # -- lifecycle --------------------------------------------------------------------------------------------------
    def start(self) -> KServeStandIn:
        for ns in self.namespaces or [None]:
            t = threading.Thread(target=self._run, args=(ns,), name=f"kserve-standin-{ns or 'all'}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for w in self._watches:
            w.stop()
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> KServeStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop ---------------------------------------------------------------------------------------------------
    def _list(self, ns: str | None) -> dict[str, Any]:
        if ns:
            return self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        return self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)

    def _run(self, ns: str | None) -> None:
        while not self._stop.is_set():
            try:
                listing = self._list(ns)
                for item in listing.get("items", []):
                    self.handle(item)
                rv = listing["metadata"]["resourceVersion"]
                w = k8s_watch.Watch()
                self._watches.append(w)
                kwargs: dict[str, Any] = {"resource_version": rv, "timeout_seconds": 60}
                if ns:
                    stream = w.stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, **kwargs)
                else:
                    stream = w.stream(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, **kwargs)
                for event in stream:
                    if self._stop.is_set():
                        break
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.handle(event["object"])
                self._watches.remove(w)
            except Exception as exc:  # keep going: a test cluster may be restarting or the namespace gone
                if not self._stop.is_set():
                    log.debug("stand-in watch on %s restarts after: %s", ns or "all namespaces", exc)
                    self._stop.wait(0.5)

    def handle(self, isvc: dict[str, Any]) -> None:
        meta = isvc["metadata"]
        if meta.get("deletionTimestamp"):
            return
        state = (meta.get("annotations") or {}).get(STATE_ANNOTATION, self.default_state)
        if state not in STATES:
            state = "pending"
        self._ensure_service(isvc)
        want = desired_status(isvc, state)
        have = isvc.get("status") or {}
        keep = {k: v for k, v in have.items() if k not in ("url", "address", "components", "modelStatus")}
        if _strip_times({**keep, **want}) == _strip_times(have):
            return  # already what KServe would say: no write (our own status write comes back as an event)
        now = _now()
        old = {c["type"]: c for c in have.get("conditions") or []}
        for c in want["conditions"]:
            prev = old.get(c["type"])
            c["lastTransitionTime"] = prev.get("lastTransitionTime", now) if prev and prev.get(
                "status") == c["status"] else now
        patch = {"status": {**want}}
        # Fields of a ready status that a not-ready one lacks are removed (merge patch null).
        for key in ("url", "address", "components"):
            if key not in want and key in have:
                patch["status"][key] = None
        if "lastFailureInfo" in (have.get("modelStatus") or {}) and "lastFailureInfo" not in want["modelStatus"]:
            patch["status"]["modelStatus"] = {**want["modelStatus"], "lastFailureInfo": None}
        try:
            raw_call(
                self.api,
                "PATCH",
                f"/apis/{GROUP}/{VERSION}/namespaces/{meta['namespace']}/{PLURAL}/{meta['name']}/status",
                body=patch,
                content_type="application/merge-patch+json",
            )
            log.info("stand-in: %s/%s is %s", meta["namespace"], meta["name"], state)
        except KubeError as exc:
            if exc.status != 404:
                log.warning("stand-in could not write status of %s/%s: %s", meta["namespace"], meta["name"],
                            exc.reason)

    def _ensure_service(self, isvc: dict[str, Any]) -> None:
        meta = isvc["metadata"]
        # Each re-list (every 60 s) hands every InferenceService back; create its Service once, not once a minute.
        if meta["uid"] in self._services:
            return
        name = f"{meta['name']}-predictor"
        body = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {"serving.kserve.io/inferenceservice": meta["name"], "component": "predictor"},
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "InferenceService",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "selector": {"app": f"isvc.{name}"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
            },
        }
        try:
            self.core.create_namespaced_service(meta["namespace"], body)
            self._services.add(meta["uid"])
        except ApiException as exc:
            if exc.status == 409:
                self._services.add(meta["uid"])
            else:
                log.debug("stand-in could not create Service %s: %s", name, exc.reason)


def main(argv: list[str] | None = None) -> int:
    from kubernetes import config

    parser = argparse.ArgumentParser(description="KServe stand-in (marks InferenceServices ready; NOT KServe)")
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("-n", "--namespace", action="append", default=None)
    parser.add_argument("--default-state", choices=STATES, default="ready")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    configuration = k8s.Configuration()
    config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    standin = KServeStandIn(k8s.ApiClient(configuration), args.namespace, args.default_state).start()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        standin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
