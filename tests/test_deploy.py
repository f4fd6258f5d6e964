"""The Kubernetes manifests in ``deploy/kubernetes/`` validate against the API schemas (kubernetes-validate,
strict: an unknown field is an error). A cluster cannot run here; the README says what was tried.

Run: pytest tests/test_deploy.py
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
VERSION = "1.33.0"  # a release current clusters run


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_strictly(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_keeper_and_the_engine_run_as_one_uid_and_share_the_socket_directory():
    daemonset, engine = (list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / name).read_text()))[-1]
                         for name in ("hotweights-daemonset.yaml", "vllm-deployment.yaml"))
    keeper_pod, engine_pod = daemonset["spec"]["template"]["spec"], engine["spec"]["template"]["spec"]
    assert keeper_pod["securityContext"]["runAsUser"] == engine_pod["securityContext"]["runAsUser"]
    paths = [next(v["hostPath"]["path"] for v in pod["volumes"] if v["name"] == "sockets")
             for pod in (keeper_pod, engine_pod)]
    assert paths[0] == paths[1] == "/run/hotweights"
    assert "resources" not in keeper_pod["containers"][0] or "nvidia.com/gpu" not in str(
        keeper_pod["containers"][0]["resources"])  # the keeper requests no GPU
