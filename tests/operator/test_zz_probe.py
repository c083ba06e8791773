import json, uuid
from kubernetes import client
from arbiter_operator.clients.kube import RestKubeClient, KubeError

def test_probe(control_plane, namespace):
    api = control_plane.api_client()
    kc = RestKubeClient(api)
    for av, kind in (("v1", "ConfigMap"), ("route.openshift.io/v1", "Route")):
        body = {"apiVersion": av, "kind": kind, "metadata": {"name": "x", "namespace": namespace, "uid": str(uuid.uuid4()), "labels": {"a": "b"}}}
        if kind == "ConfigMap": body["data"] = {"k": "v"}
        else: body["spec"] = {"to": {"kind": "Service", "name": "s", "weight": 100}}
        out = kc.apply(body, force=False)
        print(kind, "created uid", out["metadata"]["uid"], "sent", body["metadata"]["uid"], json.dumps(out["metadata"].get("managedFields")))
        body2 = json.loads(json.dumps(body)); body2["metadata"]["uid"] = str(uuid.uuid4()); body2["metadata"]["labels"] = {"c": "d"}
        try:
            kc.apply(body2, force=False); print("SECOND APPLY SUCCEEDED")
        except KubeError as e:
            print("second", e.status, e)
        try:
            kc.apply(body2, force=True); print("SECOND FORCED APPLY SUCCEEDED")
        except KubeError as e:
            print("second forced", e.status, e)
        print(kc.get(av, kind, namespace, "x")["metadata"].get("labels"))
        b3 = json.loads(json.dumps(body)); del b3["metadata"]["uid"]; b3["metadata"]["labels"] = {"e": "f"}
        print("later apply", kc.apply(b3, force=True)["metadata"].get("labels"))
