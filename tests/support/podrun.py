"""A Deployment's pod, started on this machine the way the kubelet would start it from the image (no container
runtime runs here). Everything comes from the Deployment object as the apiserver holds it and from the image's
Dockerfile:

- the command: the container's `command`, else the image's ENTRYPOINT, with the image's install prefix mapped to the
  virtualenv the tests run (the console script the image puts there is the same entry point), then `args`, else CMD;
- the environment: the image's ENV, then the container's `env` (values; the pod's own fields by `fieldRef` as the
  kubelet resolves them, including OLM's annotations; Secret and ConfigMap keys);
- the volumes: emptyDir, Secret, ConfigMap and projected ServiceAccount tokens (a TokenRequest for the pod's
  ServiceAccount, as the kubelet makes one), written under a directory; each mount path in the args and the
  environment is rewritten to where its volume lies (the one liberty: no mount namespace of the pod's own);
- the credentials: the pod's ServiceAccount token (a TokenRequest), handed over as a kubeconfig, where a pod would
  read the same token from its in-cluster mount;
- the network: a namespace of its own (a pod's ports are its own: the Deployment's fixed ports cannot collide with
  anything on this machine), with the apiserver and any other host port the test names forwarded into it.
A Secret or ConfigMap the pod needs that does not exist fails the start, naming it, as the kubelet would keep the pod
from starting.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlparse

from arbiter_devenv.olm import NetNamespace
from kubernetes import client
from kubernetes.client.rest import ApiException

_FIELD = re.compile(r"^metadata\.(annotations|labels)\['([^']+)'\]$")


def image_config(dockerfile: pathlib.Path) -> tuple[list[str], list[str], dict[str, str], str]:
    """(ENTRYPOINT, CMD, ENV, WORKDIR) of the Dockerfile's last stage (exec-form ENTRYPOINT and CMD)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    stage = text.split("\nFROM ")[-1]
    entrypoint: list[str] = []
    cmd: list[str] = []
    env: dict[str, str] = {}
    workdir = "/"
    for line in stage.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif word == "CMD":
            cmd = json.loads(rest)
        elif word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
        elif word == "WORKDIR":
            workdir = rest.strip()
    return entrypoint, cmd, env, workdir


class DeploymentPod:
    def __init__(self, api: client.ApiClient, control_plane: Any, namespace: str, deployment: str,
                 workdir: pathlib.Path, dockerfile: pathlib.Path, image_prefix: str,
                 forward_ports: tuple[int, ...] = ()) -> None:
        """image_prefix: where the image installs the program (its ENTRYPOINT's folder), mapped to this virtualenv's
        bin folder. forward_ports: host ports on 127.0.0.1 the pod reaches at the same address (S3, ...)."""
        self.api, self.cp, self.namespace, self.workdir = api, control_plane, namespace, workdir
        self.dep = client.AppsV1Api(api).read_namespaced_deployment(deployment, namespace)
        self.template = self.dep.spec.template
        self.pod_name = f"{deployment}-{self.dep.metadata.uid[:8]}-local"
        self.dockerfile, self.image_prefix = dockerfile, image_prefix.rstrip("/")
        self.forward_ports = forward_ports
        self.mounts: dict[str, pathlib.Path] = {}
        self.netns: NetNamespace | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._host_forwards: list[subprocess.Popen[bytes]] = []

    # -- what the pod is ---------------------------------------------------------------------------------------
    @property
    def container(self) -> client.V1Container:
        return self.template.spec.containers[0]

    @property
    def service_account(self) -> str:
        return self.template.spec.service_account_name or "default"

    def token(self, audiences: list[str] | None = None, expiration: int = 3600) -> str:
        spec = client.V1TokenRequestSpec(audiences=audiences or [], expiration_seconds=expiration)
        return client.CoreV1Api(self.api).create_namespaced_service_account_token(
            self.service_account, self.namespace, client.AuthenticationV1TokenRequest(spec=spec)).status.token

    def field(self, path: str) -> str:
        """A `fieldRef` of this pod, as the kubelet resolves it."""
        meta = self.template.metadata
        if path == "metadata.namespace":
            return self.namespace
        if path == "metadata.name":
            return self.pod_name
        if path == "spec.serviceAccountName":
            return self.service_account
        if m := _FIELD.match(path):
            return ((meta.annotations if m.group(1) == "annotations" else meta.labels) or {}).get(m.group(2), "")
        raise ValueError(f"the pod stand-in does not resolve fieldRef {path}")

    def _key(self, kind: str, name: str, key: str, optional: bool) -> str | None:
        core = client.CoreV1Api(self.api)
        try:
            obj = (core.read_namespaced_secret if kind == "Secret" else core.read_namespaced_config_map)(
                name, self.namespace)
        except ApiException as exc:
            if exc.status == 404 and optional:
                return None
            raise RuntimeError(f"the kubelet would not start {self.pod_name}: {kind} {self.namespace}/{name} "
                               f"is missing ({exc.status})") from None
        data = obj.data or {}
        if key not in data:
            if optional:
                return None
            raise RuntimeError(f"the kubelet would not start {self.pod_name}: {kind} {name} has no key {key}")
        if kind == "Secret":
            import base64

            return base64.b64decode(data[key]).decode()
        return str(data[key])

    # -- volumes -------------------------------------------------------------------------------------------------
    def _write(self, directory: pathlib.Path, path: str, content: str, mode: int | None) -> None:
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(0o600 if mode is None else mode | 0o200)  # the test process owns it and may refresh it

    def _items(self, kind: str, name: str, items: list[Any] | None, optional: bool) -> dict[str, str]:
        core = client.CoreV1Api(self.api)
        if items:
            out = {}
            for item in items:
                value = self._key(kind, name, item.key, optional)
                if value is not None:
                    out[item.path] = value
            return out
        try:
            obj = (core.read_namespaced_secret if kind == "Secret" else core.read_namespaced_config_map)(
                name, self.namespace)
        except ApiException:
            if optional:
                return {}
            raise RuntimeError(f"the kubelet would not start {self.pod_name}: {kind} {name} is missing") from None
        return {k: self._key(kind, name, k, False) or "" for k in (obj.data or {})}

    def materialise_volumes(self) -> None:
        root = self.workdir / "volumes"
        for volume in self.template.spec.volumes or []:
            directory = root / volume.name
            directory.mkdir(parents=True, exist_ok=True)
            if volume.empty_dir is not None:
                continue
            if volume.secret is not None:
                files = self._items("Secret", volume.secret.secret_name, volume.secret.items,
                                    bool(volume.secret.optional))
                mode = volume.secret.default_mode
            elif volume.config_map is not None:
                files = self._items("ConfigMap", volume.config_map.name, volume.config_map.items,
                                    bool(volume.config_map.optional))
                mode = volume.config_map.default_mode
            elif volume.projected is not None:
                files, mode = {}, volume.projected.default_mode
                for source in volume.projected.sources or []:
                    if source.service_account_token is not None:
                        sat = source.service_account_token
                        audiences = [sat.audience] if sat.audience else None
                        files[sat.path] = self.token(audiences, sat.expiration_seconds or 3600)
                    elif source.config_map is not None:
                        files.update(self._items("ConfigMap", source.config_map.name, source.config_map.items,
                                                 bool(source.config_map.optional)))
                    elif source.secret is not None:
                        files.update(self._items("Secret", source.secret.name, source.secret.items,
                                                 bool(source.secret.optional)))
                    else:
                        raise ValueError(f"the pod stand-in does not project {source}")
            else:
                raise ValueError(f"the pod stand-in does not mount volume {volume.name}: {volume}")
            for path, content in files.items():
                self._write(directory, path, content, mode)
        for mount in self.container.volume_mounts or []:
            self.mounts[mount.mount_path.rstrip("/")] = root / mount.name / (mount.sub_path or "")

    def local(self, text: str) -> str:
        """`text` with each mount path (the longest that matches, at a path boundary) and the image's install
        prefix rewritten to where they lie here, in one pass (a local path is never rewritten again)."""
        where = {**{path: str(d) for path, d in self.mounts.items()},
                 self.image_prefix: str(pathlib.Path(sys.executable).parent)}
        alternatives = "|".join(re.escape(p) for p in sorted(where, key=len, reverse=True))
        return re.sub(rf"(?<![\w/.-])({alternatives})(?=/|$|[^\w.-])", lambda m: where[m.group(1)], text)

    # -- the process ---------------------------------------------------------------------------------------------
    def argv_env(self) -> tuple[list[str], dict[str, str], str]:
        entrypoint, cmd, image_env, workdir = image_config(self.dockerfile)
        c = self.container
        argv = list(c.command or entrypoint) + list(c.args if c.args is not None else ([] if c.command else cmd))
        env = dict(image_env)
        for var in c.env or []:
            if var.value_from is None:
                env[var.name] = var.value or ""
            elif var.value_from.field_ref is not None:
                env[var.name] = self.field(var.value_from.field_ref.field_path)
            elif var.value_from.secret_key_ref is not None:
                ref = var.value_from.secret_key_ref
                env[var.name] = self._key("Secret", ref.name, ref.key, bool(ref.optional)) or ""
            elif var.value_from.config_map_key_ref is not None:
                ref = var.value_from.config_map_key_ref
                env[var.name] = self._key("ConfigMap", ref.name, ref.key, bool(ref.optional)) or ""
            else:
                raise ValueError(f"the pod stand-in does not resolve env {var.name}: {var.value_from}")
        env = {k: self.local(v) for k, v in env.items()}
        return [self.local(a) for a in argv], env, self.local(c.working_dir or workdir)

    def start(self, timeout: float = 90.0) -> DeploymentPod:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.materialise_volumes()
        argv, env, cwd = self.argv_env()
        kubeconfig = self.cp.write_kubeconfig(self.workdir / "serviceaccount.kubeconfig", token=self.token(),
                                              namespace=self.namespace)
        env["KUBECONFIG"] = str(kubeconfig)  # where a pod reads the same token from its in-cluster mount
        api_port = urlparse(self.cp.server).port or 443
        sockets = {port: self.workdir / f"forward-{port}.sock" for port in (api_port, *self.forward_ports)}
        for port, sock in sockets.items():
            self._host_forwards.append(subprocess.Popen(
                [sys.executable, "-m", "arbiter_devenv.olm", "forward", f"unix:{sock}", f"127.0.0.1:{port}"],
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while not all(s.exists() for s in sockets.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("the host forwarders did not start")
            time.sleep(0.1)
        self.netns = NetNamespace(self.workdir, "pod", api_port, sockets[api_port])
        for port in self.forward_ports:
            self.netns.run(f"forward-{port}", [sys.executable, "-m", "arbiter_devenv.olm", "forward",
                                               f"127.0.0.1:{port}", f"unix:{sockets[port]}"])
            self.netns.wait_listening(port)
        pathlib.Path(cwd).mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(["nsenter", "-t", str(self.netns.holder.pid), "-n", "--wd=" + cwd, *argv],
                                     stdout=open(self.workdir / "pod.log", "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        self.netns.procs.append(self.proc)
        self._wait_started(timeout)
        return self

    def _wait_started(self, timeout: float) -> None:
        """Until the startup probe's port answers, as the kubelet waits before it calls the pod started."""
        probe = self.container.startup_probe or self.container.liveness_probe
        port = probe.http_get.port
        if isinstance(port, str):
            port = next(p.container_port for p in self.container.ports if p.name == port)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the pod's process exited ({self.proc.returncode}):\n{self.log()[-3000:]}")
            try:
                assert self.netns is not None
                self.netns.wait_listening(int(port), timeout=2)
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nothing answers the startup probe on {port}:\n{self.log()[-3000:]}") from None

    def log(self) -> str:
        path = self.workdir / "pod.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.netns is not None:
            self.netns.stop()
            self.netns = None
        for proc in self._host_forwards:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=10)
        self._host_forwards.clear()
