"""What the operator's S3 reads cost in memory: RSS of a fresh process before and after its first artifact check.

Starts the devenv's S3Server (SeaweedFS) holding a small model directory, then, for each client, a fresh Python process
that imports what the operator imports anyway (kopf, kubernetes, httpx, pydantic, the Kubernetes client and the pure
artifact checks), reads its RSS, imports the S3 client, makes the reads of one artifact check (the listing, then
config.json, the safetensors index and tokenizer.json), reads RSS again, then repeats those reads 50 times (connection
reuse, no growth) and reads it a last time. The files' contents are not parsed: only what reading S3 costs counts.

Clients: `operator` (clients/s3.py, what ships, with a storage-config entry's keys), `operator-web-identity` (the
same reads with the operator's own credentials from botocore's chain: a web identity exchanged at the S3 server's
STS, whose OpenID issuer is a key this script makes and serves on loopback); with `--compare` also boto3 the way the
operator used it before (`boto3-full`), and boto3 given a trimmed S3 service model (only ListObjectsV2 and
GetObject, generated into a temporary directory from the installed botocore's own model and put first on its
loader's search path) with and without a trimmed endpoints.json (`boto3-trimmed`, `boto3-trimmed-endpoints`), the
alternative weighed, and what each data file botocore loads for an S3 client costs once parsed.

    .venv/bin/python benchmarks/s3_client_memory.py [--compare] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
CHECKS = 50
OPERATOR_BASE = ("kopf", "kubernetes", "httpx", "pydantic", "arbiter_operator.kube.client",
                 "arbiter_operator.plan.artifacts")
MODEL = {
    "config.json": json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_attention_heads": 32,
                               "num_key_value_heads": 8, "max_position_embeddings": 40960}).encode(),
    "model.safetensors.index.json": json.dumps({"weight_map": {"a": "model-00001-of-00001.safetensors"}}).encode(),
    "model-00001-of-00001.safetensors": b"w" * 1024,
    "tokenizer.json": b'{"model": {"type": "BPE", "vocab": {}, "merges": []}}',
}


def rss_mib() -> float:
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


# ---- the child: one client in a fresh process -------------------------------------------------------------------

def trimmed_data_path(where: Path, endpoints: bool) -> Path:
    """botocore data holding only what the two reads need: the S3 model cut to ListObjectsV2 and GetObject with the
    shapes they reach (no documentation), its paginator, its endpoint rule set; and, if `endpoints`, endpoints.json
    cut to S3."""
    import botocore.loaders

    loader = botocore.loaders.Loader()
    model = loader.load_service_model("s3", "service-2")
    shapes, keep = model["shapes"], set()

    def reach(name: str) -> None:
        if name not in keep:
            keep.add(name)
            shape = shapes[name]
            for ref in [shape.get(k) for k in ("member", "key", "value")] + list(shape.get("members", {}).values()):
                if ref:
                    reach(ref["shape"])

    operations = {op: model["operations"][op] for op in ("ListObjectsV2", "GetObject")}
    for op in operations.values():
        for ref in [op.get("input"), op.get("output"), *op.get("errors", [])]:
            if ref:
                reach(ref["shape"])
    trimmed = {"version": model.get("version"), "metadata": model["metadata"], "operations": operations,
               "shapes": {k: shapes[k] for k in keep}}
    version_dir = where / "s3" / "2006-03-01"
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "service-2.json").write_text(json.dumps(trimmed))
    pages = loader.load_service_model("s3", "paginators-1")["pagination"]
    paginator = {"pagination": {"ListObjectsV2": pages["ListObjectsV2"]}}
    (version_dir / "paginators-1.json").write_text(json.dumps(paginator))
    rules = loader.load_service_model("s3", "endpoint-rule-set-1")
    (version_dir / "endpoint-rule-set-1.json").write_text(json.dumps(rules))
    if endpoints:
        data = loader.load_data("endpoints")
        for partition in data["partitions"]:
            partition["services"] = {k: v for k, v in partition["services"].items() if k == "s3"}
        (where / "endpoints.json").write_text(json.dumps(data))
    return where


def boto3_reader(kind: str, endpoint: str, access_key: str, secret_key: str):  # type: ignore[no-untyped-def]
    """A reader with the operator's interface (list_objects, get_bytes) on a boto3 client, as the operator had."""
    import boto3
    import botocore.session
    from botocore.config import Config

    session = botocore.session.get_session()
    if kind != "boto3-full":  # generated by the parent: loading the full model here would count it
        session.get_component("data_loader").search_paths.insert(0, os.environ[f"S3_MODEL_{kind}"])
    client = boto3.session.Session(botocore_session=session).client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=access_key,
        aws_secret_access_key=secret_key, config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"))

    class Listed(NamedTuple):
        key: str

    class Reader:
        async def list_objects(self, bucket: str, prefix: str, limit: int = 10000) -> list[Listed]:
            page = await asyncio.to_thread(client.list_objects_v2, Bucket=bucket, Prefix=prefix + "/")
            return [Listed(o["Key"][len(prefix) + 1:]) for o in page.get("Contents", [])]

        async def get_bytes(self, bucket: str, key: str, max_bytes: int = 4 << 20) -> bytes | None:
            def get() -> bytes:
                return client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{max_bytes - 1}")["Body"].read()
            return await asyncio.to_thread(get)

    return Reader()


def loader_costs() -> dict[str, float]:
    """What each file a boto3 S3 client loads costs once parsed, loaded one after another with botocore's Loader."""
    import boto3  # noqa: F401
    import botocore.loaders

    loader = botocore.loaders.Loader()
    costs, held = {}, []
    for name, load in [("endpoints.json", lambda: loader.load_data("endpoints")),
                       ("partitions.json", lambda: loader.load_data("partitions")),
                       ("_retry.json", lambda: loader.load_data("_retry")),
                       ("sdk-default-configuration.json", lambda: loader.load_data("sdk-default-configuration")),
                       ("s3 service-2", lambda: loader.load_service_model("s3", "service-2")),
                       ("s3 endpoint-rule-set-1", lambda: loader.load_service_model("s3", "endpoint-rule-set-1")),
                       ("s3 paginators-1", lambda: loader.load_service_model("s3", "paginators-1"))]:
        before = rss_mib()
        held.append(load())
        costs[name] = rss_mib() - before
    return costs


def child(kind: str) -> dict[str, float]:
    import importlib

    for name in OPERATOR_BASE:
        importlib.import_module(name)
    if kind == "loader":
        return loader_costs()
    before = rss_mib()
    endpoint, bucket, prefix = os.environ["S3_ENDPOINT"], os.environ["S3_BUCKET"], os.environ["S3_PREFIX"]
    access_key, secret_key = os.environ["S3_ACCESS_KEY"], os.environ["S3_SECRET_KEY"]

    async def check(storage) -> None:  # type: ignore[no-untyped-def]
        """The artifact check's reads (observe/storage.py): the listing, then the three small files."""
        listed = {o.key for o in await storage.list_objects(bucket, prefix)}
        assert listed == set(MODEL), listed
        for name in ("config.json", "model.safetensors.index.json", "tokenizer.json"):
            assert await storage.get_bytes(bucket, f"{prefix}/{name}") == MODEL[name]

    if kind.startswith("operator"):
        from arbiter_operator.clients.s3 import OwnCredentials, S3Credentials, S3Storage
    else:
        import boto3  # noqa: F401
    imported = rss_mib()

    async def run() -> dict[str, float]:
        if kind == "operator":
            storage = S3Storage(S3Credentials(access_key_id=access_key, secret_access_key=secret_key,
                                              endpoint_url=endpoint))
        elif kind == "operator-web-identity":  # an entry without keys: botocore's chain finds the web identity
            storage = S3Storage(S3Credentials(endpoint_url=endpoint, own=OwnCredentials()))
        else:
            storage = boto3_reader(kind, endpoint, access_key, secret_key)
        await check(storage)
        first = rss_mib()
        started = time.perf_counter()
        for _ in range(CHECKS):
            await check(storage)
        per_check_ms = (time.perf_counter() - started) / CHECKS * 1000
        if kind.startswith("operator"):
            await storage.aclose()
        return {"base_mib": before, "imported_mib": imported, "first_check_mib": first,
                "after_more_mib": rss_mib(), "check_ms": per_check_ms}

    return asyncio.run(run())


# ---- the parent: the S3 server, the model directory, one child per client ---------------------------------------

class LocalIssuer:
    """An OpenID issuer of its own on loopback: an ES256 key, its JWKS over HTTP, and tokens it signs (the S3 server's
    STS verifies them as it verifies a cluster's ServiceAccount tokens)."""

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self.key = ec.generate_private_key(ec.SECP256R1())
        numbers = self.key.public_key().public_numbers()
        jwks = json.dumps({"keys": [{"kty": "EC", "crv": "P-256", "kid": "benchmark", "alg": "ES256", "use": "sig",
                                     "x": _b64(numbers.x.to_bytes(32, "big")),
                                     "y": _b64(numbers.y.to_bytes(32, "big"))}]}).encode()

        class Keys(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name for the GET handler
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(jwks)))
                self.end_headers()
                self.wfile.write(jwks)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Keys)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, subject: str, audience: str) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        now = int(time.time())
        header = _b64(json.dumps({"alg": "ES256", "typ": "JWT", "kid": "benchmark"}).encode())
        claims = _b64(json.dumps({"iss": self.url, "sub": subject, "aud": audience, "iat": now, "nbf": now,
                                  "exp": now + 3600}).encode())
        r, sig_s = decode_dss_signature(self.key.sign(f"{header}.{claims}".encode(), ec.ECDSA(hashes.SHA256())))
        return f"{header}.{claims}.{_b64(r.to_bytes(32, 'big') + sig_s.to_bytes(32, 'big'))}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", action="store_true", help="also measure boto3, full and with a trimmed model")
    parser.add_argument("--repetitions", type=int, default=3, help="fresh processes per client (median reported)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/s3-client-memory.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return

    from arbiter_devenv.s3server import OidcIssuer, S3Server

    kinds = ["operator", "operator-web-identity"] + (
        ["boto3-full", "boto3-trimmed", "boto3-trimmed-endpoints"] if args.compare else [])
    results: dict[str, dict[str, float]] = {}
    issuer = LocalIssuer()
    web_identity = OidcIssuer(issuer=issuer.url, jwks_url=issuer.url + "/keys", audience="arbiter-benchmark",
                              subjects=("arbiter-operator",))
    with S3Server(web_identity=web_identity) as s3, tempfile.TemporaryDirectory(prefix="s3-models-") as work:
        client = s3.client()
        client.create_bucket(Bucket="models")
        for key, body in MODEL.items():
            client.put_object(Bucket="models", Key=f"credit/1/{key}", Body=body)
        env = dict(os.environ, S3_ENDPOINT=s3.endpoint_url, S3_BUCKET="models", S3_PREFIX="credit/1",
                   S3_ACCESS_KEY=s3.access_key, S3_SECRET_KEY=s3.secret_key)
        for kind in kinds[3:]:
            env[f"S3_MODEL_{kind}"] = str(trimmed_data_path(Path(work) / kind, kind == "boto3-trimmed-endpoints"))
        token = Path(work) / "token"
        token.write_text(issuer.token("arbiter-operator", "arbiter-benchmark"))
        # The web identity alone, as the chart renders it: no keys, no profile, no instance metadata to find.
        web_env = {k: v for k, v in env.items() if not k.startswith("AWS_")} | {
            "AWS_ROLE_ARN": s3.role_arn, "AWS_WEB_IDENTITY_TOKEN_FILE": str(token), "AWS_REGION": s3.region,
            "AWS_ENDPOINT_URL_STS": s3.endpoint_url, "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}
        for kind in kinds:
            runs = []
            for _ in range(args.repetitions):
                out = subprocess.run([sys.executable, __file__, "--child", kind],
                                     env=web_env if kind == "operator-web-identity" else env, capture_output=True,
                                     text=True, timeout=300, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            runs.sort(key=lambda r: r["first_check_mib"] - r["base_mib"])
            results[kind] = runs[len(runs) // 2]
    print("| client | RSS without S3 (MiB) | + import (MiB) | after the first check (MiB) | added in all (MiB) "
          f"| after {CHECKS} more checks (MiB) | ms per check |")
    print("|---|---|---|---|---|---|---|")
    for kind, r in results.items():
        print(f"| {kind} | {r['base_mib']:.1f} | {r['imported_mib'] - r['base_mib']:.1f} | "
              f"{r['first_check_mib']:.1f} | {r['first_check_mib'] - r['base_mib']:.1f} | "
              f"{r['after_more_mib']:.1f} | {r['check_ms']:.1f} |")
    files: dict[str, float] = {}
    if args.compare:
        out = subprocess.run([sys.executable, __file__, "--child", "loader"], capture_output=True, text=True,
                             timeout=300, check=True)
        files = json.loads(out.stdout.strip().splitlines()[-1])
        print("\n| botocore file (what a boto3 S3 client loads) | RSS once parsed (MiB) |\n|---|---|")
        for name, mib in files.items():
            print(f"| {name} | {mib:.1f} |")
    issuer.server.shutdown()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"checks": CHECKS, "repetitions": args.repetitions, "results": results,
                                          "botocore_files": files}, indent=2))


if __name__ == "__main__":
    main()
