"""The release (hack/release.sh, arbiter_devenv.release) run with two image digests, as a team releasing for its own
registry runs it: every artifact names those images, the bundle passes the Operator Framework's validator, the chart
package passes `helm lint --strict` and its values schema, the krew manifest's sha256 is its archive's and the
archive runs on a bare interpreter, the wheel carries the LICENSE; and the generator's image flags change the images
and nothing else."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import zipfile

import pytest
import yaml
from arbiter_devenv import olmbundle, release
from arbiter_devenv.tools import ensure_tool
from support.paths import REPO

OPERATOR = "registry.example.com/risk/arbiter-operator@sha256:" + "1" * 64
RUNTIME = "registry.example.com/risk/arbiter-runtime@sha256:" + "2" * 64
PYTHON = "{}.{}".format(*sys.version_info[:2])
CSV_PATH = f"bundle/manifests/{olmbundle.PACKAGE}.clusterserviceversion.yaml"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("release") / "dist"
    # The krew archive for this machine's platform and CPython only: the other platforms' wheels are the same
    # lock's, fetched from the index, which the suite does not depend on.
    assert release.main(["--operator-image", OPERATOR, "--runtime-image", RUNTIME, "--out", str(out),
                         "--krew-platforms", "linux/amd64", "--krew-pythons", PYTHON]) == 0
    return out


def _helm(*args: str, tmp: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **{f"HELM_{k}_HOME": str(tmp / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}
    return subprocess.run([str(ensure_tool("helm", quiet=True)), *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_every_file_is_listed_with_its_sha256(dist: pathlib.Path) -> None:
    sums = dict(reversed(line.split("  ", 1)) for line in (dist / "SHA256SUMS").read_text().splitlines())
    for name, digest in sums.items():
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest, name
    listed = set(sums)
    assert {"python/arbiter_operator-0.1.0-py3-none-any.whl", "python/arbiter_operator-0.1.0.tar.gz",
            "arbiter-0.1.0.tgz", "olm/" + CSV_PATH, "olm/bundle.Dockerfile",
            f"olm/catalog/{olmbundle.PACKAGE}/catalog.yaml", "krew/arbiter.yaml",
            "krew/kubectl-arbiter-v0.1.0-linux-amd64.tar.gz"} <= listed
    summary = json.loads((dist / "release.json").read_text())
    assert summary["images"]["operator"] == OPERATOR and summary["disconnected"] is True


def test_bundle_names_the_digests_and_passes_the_validator(dist: pathlib.Path) -> None:
    csv = yaml.safe_load((dist / "olm" / CSV_PATH).read_text())
    ann = csv["metadata"]["annotations"]
    assert ann["features.operators.openshift.io/disconnected"] == "true"
    assert ann["containerImage"] == OPERATOR
    assert {i["name"]: i["image"] for i in csv["spec"]["relatedImages"]} == {"operator": OPERATOR, "runtime": RUNTIME}
    (container,) = csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == OPERATOR and env["ARBITER_RUNTIME_IMAGE"] == RUNTIME
    catalog = list(yaml.safe_load_all((dist / "olm" / "catalog" / olmbundle.PACKAGE / "catalog.yaml").read_text()))
    (bundle,) = [d for d in catalog if d and d["schema"] == "olm.bundle"]
    assert bundle["image"] == "registry.example.com/risk/arbiter-operator-bundle:v0.1.0"
    assert {i["image"] for i in bundle["relatedImages"]} == {bundle["image"], OPERATOR, RUNTIME}
    proc = subprocess.run([str(ensure_tool("operator-bundle-validator")), "--k8s-version", "1.34",
                           str(dist / "olm" / "bundle")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stdout + proc.stderr


def test_chart_package_lints_and_defaults_to_the_digests(dist: pathlib.Path, tmp_path: pathlib.Path) -> None:
    package = dist / "arbiter-0.1.0.tgz"
    lint = _helm("lint", "--strict", str(package), tmp=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    with tarfile.open(package) as tar:
        assert tar.extractfile("arbiter/LICENSE").read() == (REPO / "LICENSE").read_bytes()  # type: ignore[union-attr]
    rendered = _helm("template", "arbiter", str(package), "-n", "arbiter-system", tmp=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    (dep,) = [d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"] == OPERATOR
    assert {"name": "ARBITER_RUNTIME_IMAGE", "value": RUNTIME} in container["env"]
    # The package keeps values.schema.json: a digest that is not one is refused, naming the key.
    bad = _helm("template", "arbiter", str(package), "--set", "image.digest=sha256:short", tmp=tmp_path)
    assert bad.returncode != 0 and "digest" in bad.stderr


def test_krew_manifest_names_its_archive_by_sha256_and_the_archive_runs(dist: pathlib.Path,
                                                                        tmp_path: pathlib.Path) -> None:
    manifest = yaml.safe_load((dist / "krew" / "arbiter.yaml").read_text())
    assert manifest["spec"]["version"] == "v0.1.0"
    (platform,) = manifest["spec"]["platforms"]
    archive = dist / "krew" / "kubectl-arbiter-v0.1.0-linux-amd64.tar.gz"
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert platform["uri"].endswith("/v0.1.0/kubectl-arbiter-v0.1.0-linux-amd64.tar.gz")
    assert platform["selector"] == {"matchLabels": {"os": "linux", "arch": "amd64"}}
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "plugin", filter="data")
    names = {op["from"] for op in platform["files"]}
    assert names == {"kubectl-arbiter", "lib", "LICENSE"} and all((tmp_path / "plugin" / n).exists() for n in names)
    # krew links the binary into its bin folder; a bare interpreter (-I -S: no site-packages, no PYTHONPATH) proves
    # the archive holds everything the plugin imports.
    link = tmp_path / "bin" / "kubectl-arbiter"
    link.parent.mkdir()
    link.symlink_to(tmp_path / "plugin" / "kubectl-arbiter")
    python = getattr(sys, "_base_executable", sys.executable)
    version = subprocess.run([python, "-I", "-S", str(link), "--version"], capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == "kubectl-arbiter 0.1.0", version.stderr
    missing = subprocess.run([python, "-I", "-S", str(link), "--kubeconfig", str(tmp_path / "none"), "status", "x"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 4 and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr


def test_wheel_carries_the_license_and_one_extra_per_program(dist: pathlib.Path) -> None:
    with zipfile.ZipFile(dist / "python" / "arbiter_operator-0.1.0-py3-none-any.whl") as whl:
        names = whl.namelist()
        metadata = whl.read("arbiter_operator-0.1.0.dist-info/METADATA").decode()
    assert "arbiter_operator-0.1.0.dist-info/licenses/LICENSE" in names
    assert not [n for n in names if "devenv" in n or "standin" in n]
    assert "License-Expression: Apache-2.0" in metadata
    for extra in ("operator", "runtime", "kubectl"):
        assert f"Provides-Extra: {extra}" in metadata
    assert "Requires-Dist: starlette" in metadata and 'extra == "runtime"' in metadata


def _tagged() -> olmbundle.Images:
    return olmbundle.images_from("registry.example.com/risk/arbiter-operator:1.2.3",
                                 "registry.example.com/risk/arbiter-runtime:1.2.3", None)


def test_image_flags_change_the_images_and_nothing_else() -> None:
    """The generator with a team's images differs from the committed files only where an image is named (and, for
    digests, in `disconnected`): the flags are the way to build for another registry, never an edit."""
    committed = olmbundle.render(REPO)
    default_operator = yaml.safe_load(committed[CSV_PATH])["metadata"]["annotations"]["containerImage"]
    bundle_default = f"{olmbundle.BUNDLE_IMAGE_REPO}:v0.1.0"
    for images, disconnected in ((_tagged(), "false"), (olmbundle.images_from(OPERATOR, RUNTIME, None), "true")):
        ours = olmbundle.render(REPO, images)
        assert set(ours) == set(committed)
        for path, text in ours.items():
            back = text.replace(str(images.operator), default_operator).replace(
                images.runtime, olmbundle.models.DEFAULT_RUNTIME_IMAGE)
            if path.startswith("catalog/"):
                # The catalog embeds the CSV (base64): compare what it says after decoding.
                docs = [d for d in yaml.safe_load_all(back) if d]
                want = [d for d in yaml.safe_load_all(committed[path]) if d]
                assert [d["schema"] for d in docs] == [d["schema"] for d in want]
                continue
            back = back.replace("features.operators.openshift.io/disconnected: '" + disconnected,
                                "features.operators.openshift.io/disconnected: 'false")
            assert back == committed[path], path
        assert f"features.operators.openshift.io/disconnected: '{disconnected}'" in ours[CSV_PATH]
    assert bundle_default in committed[f"catalog/{olmbundle.PACKAGE}/catalog.yaml"]


@pytest.mark.parametrize("ref", ["arbiter-operator", "Registry/UPPER:1", "r.io/a/b@sha256:abc", "r.io/a/b:",
                                 "r.io/a/b:1 ", "r.io/a b:1"])
def test_a_reference_without_tag_or_digest_is_refused(ref: str) -> None:
    with pytest.raises(ValueError, match="tag or a digest"):
        olmbundle.parse_image(ref)


def test_the_release_refuses_a_bad_reference_and_a_folder_it_did_not_write(tmp_path: pathlib.Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        release.main(["--operator-image", "arbiter-operator", "--runtime-image", RUNTIME, "--out", str(tmp_path)])
    assert "not an image reference" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="did not write"):
        release.main(["--operator-image", OPERATOR, "--runtime-image", RUNTIME, "--out", str(tmp_path)])
    assert (tmp_path / "notes.txt").read_text() == "mine"
