"""The Kubernetes manifests in ``deploy/kubernetes/`` validate against the API schemas (kubernetes-validate,
strict: an unknown field is an error); the Dockerfiles of the images they name (``deploy/docker/``) pass
hadolint. A cluster cannot run here, nor can an image be built (no container runtime on this machine):
the README says what was tried.

Run: pytest tests/test_deploy.py
"""

from __future__ import annotations

from pathlib import Path

import re
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from switch_front import checkpoint_names

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
VERSION = "1.33.0"  # a release current clusters run


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_strictly(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        if doc["kind"] != "RayService":  # KubeRay's, not the API's: checked part by part below
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


def pods():
    docs = [list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / name).read_text()))[-1]
            for name in ("hotweights-daemonset.yaml", "vllm-deployment.yaml")]
    return [d["spec"]["template"]["spec"] for d in docs]


def test_the_engine_keeps_its_file_digests_on_the_node_where_the_keeper_made_them_private():
    """Without a persisted digest cache every new engine container hashes the whole checkpoint again."""
    keeper, engine = pods()
    (vllm,) = engine["containers"]
    env = {e["name"]: e["value"] for e in vllm["env"]}
    mounts = {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}
    assert env["HOTWEIGHTS_CACHE_DIR"] == mounts["digests"]
    host = {pod_name: next(v["hostPath"]["path"] for v in pod["volumes"] if v["name"] == "digests")
            for pod_name, pod in (("keeper", keeper), ("engine", engine))}
    assert host["keeper"] == host["engine"]
    init = " ".join(keeper["initContainers"][0]["command"])
    assert "chown 1000:1000" in init and host["keeper"] in init.split("chmod", 1)[1]  # 0700, the uid's


@pytest.mark.parametrize("name", ["vllm-deployment.yaml", "switch-deployment.yaml"])
def test_vllms_compile_cache_and_triton_kernels_live_on_the_node(name):
    """In a new container's empty home vLLM compiles again (85-115 s for an 8B on an H200) and JIT-compiles its
    sampler's Triton kernels (16 s): both caches go under a hostPath the keeper's init container made the uid's."""
    (container,) = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / name).read_text()))[-1][
        "spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    digests = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "digests")
    assert env["VLLM_CACHE_ROOT"].startswith(digests + "/") and env["TRITON_CACHE_DIR"].startswith(digests + "/")


def test_the_dockerfiles_pass_hadolint_and_build_the_images_the_manifests_name():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    files = sorted((ROOT / "deploy" / "docker").glob("*.Dockerfile"))
    assert [f.name for f in files] == ["engine.Dockerfile", "keeper.Dockerfile"]
    done = subprocess.run([hadolint, *map(str, files)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    tags = {re.search(r"docker build -f deploy/docker/(\S+) -t (\S+) \.", f.read_text()).group(2) for f in files}
    keeper, engine = pods()
    assert {keeper["containers"][0]["image"], engine["containers"][0]["image"]} == tags


def test_the_switch_example_config_is_one_the_switch_takes(tmp_path):
    """The ConfigMap's switch.toml parses with the switch's own loader (checkpoints made to exist here)."""
    from hotweights.switch import config as switch_config

    configmap = next(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "switch-deployment.yaml").read_text()))
    text = configmap["data"]["switch.toml"]
    for directory in re.findall(r'checkpoint = "(/models/[^"]+)"', text):
        checkpoint_names(tmp_path / directory.lstrip("/"))
        text = text.replace(f'"{directory}"', f'"{tmp_path / directory.lstrip("/")}"')
    (tmp_path / "switch.toml").write_text(text)
    config = switch_config.load(tmp_path / "switch.toml")
    assert [m.name for m in config.models] == ["chat", "coder"] and config.default.name == "chat"
    assert config.host == "0.0.0.0" and all(m.engine == "vllm" for m in config.models)


def test_the_switch_docs_example_is_one_the_switch_takes(tmp_path):
    from hotweights.switch import config as switch_config

    text = (ROOT / "docs" / "switch.md").read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    for directory in set(re.findall(r'checkpoint = "(/models/[^"]+)"', text)):
        checkpoint_names(tmp_path / directory.lstrip("/"))
        text = text.replace(f'"{directory}"', f'"{tmp_path / directory.lstrip("/")}"')
    (tmp_path / "switch.toml").write_text(text)
    config = switch_config.load(tmp_path / "switch.toml")
    assert [m.name for m in config.models] == ["chat", "coder", "small"] and config.models[2].keep_awake


def test_switch_example_prints_the_docs_example_from_the_installed_package():
    """``switch --help`` points at ``hotweights switch example``, which a wheel ships: the docs' example, whole."""
    from conftest import run_cli

    done = run_cli("switch", "example")
    docs = (ROOT / "docs" / "switch.md").read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    assert done.returncode == 0 and done.stdout.endswith(docs), done.stderr
    helped = run_cli("switch", "--help").stdout
    assert "hotweights switch example" in helped and "docs/" not in helped


RAYSERVICE_SPEC = {"serveConfigV2", "rayClusterConfig", "upgradeStrategy", "serviceUnhealthySecondThreshold",
                   "deploymentUnhealthySecondThreshold", "excludeHeadPodFromServeSvc"}
RAYCLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling", "autoscalerOptions"}


def rayservice() -> tuple[dict, dict]:
    configmap, service = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "cluster-rayservice.yaml").read_text())
    return configmap, service


def test_the_rayservice_holds_a_serve_config_ray_takes_pods_kubernetes_takes_and_known_keys():
    """KubeRay's CRD cannot be checked here (no cluster); its parts can: the Serve config against Ray Serve's own
    schema with its import path resolving to hotweights' builder, each pod template against Kubernetes' schema, the
    RayService's own keys against the ones KubeRay's ray.io/v1 has (rayStartParams are strings)."""
    import importlib

    from ray.serve.schema import ServeDeploySchema

    _configmap, service = rayservice()
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    spec = service["spec"]
    assert set(spec) <= RAYSERVICE_SPEC and set(spec["rayClusterConfig"]) <= RAYCLUSTER_SPEC
    serve_config = ServeDeploySchema.model_validate(yaml.safe_load(spec["serveConfigV2"]))
    (app,) = serve_config.applications
    module, name = app.import_path.split(":")
    assert callable(getattr(importlib.import_module(module), name))
    assert app.args == {"config": "/etc/hotweights/cluster.toml"}
    cluster = spec["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values()), group["rayStartParams"]
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                                      "template": group["template"]}, VERSION, strict=True)
    workers = cluster["workerGroupSpecs"][0]
    assert '"hotweights_node": 1' in workers["rayStartParams"]["resources"].replace("\\", "")


def test_the_rayservices_workers_share_the_daemonset_keepers_uid_and_socket_directory():
    _configmap, service = rayservice()
    worker = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    keeper = pods()[0]
    assert worker["securityContext"]["runAsUser"] == keeper["securityContext"]["runAsUser"]
    assert next(v["hostPath"]["path"] for v in worker["volumes"] if v["name"] == "sockets") == "/run/hotweights"
    env = {e["name"]: e["value"] for e in worker["containers"][0]["env"]}
    assert env["HOTWEIGHTS_SOCKET_DIR"] == "/run/hotweights"


def test_the_rayservices_config_is_one_the_cluster_and_each_nodes_front_take(tmp_path):
    from hotweights.cluster.config import parse
    from hotweights.switch import config as switch_config

    configmap, _service = rayservice()
    text = configmap["data"]["cluster.toml"]
    cluster = parse(text, tmp_path / "cluster.toml")
    assert cluster.settings.node_resource == "hotweights_node" and cluster.default.name == "chat"
    assert [m.ready_nodes for m in cluster.models] == [2, 2, 1]
    for directory in set(re.findall(r'checkpoint = "(/models/[^"]+)"', text)):
        checkpoint_names(tmp_path / directory.lstrip("/"))
    node = cluster.node_toml("n0", ["n0", "n1"], 9000, tmp_path / "logs", "")
    for directory in set(re.findall(r'checkpoint = "(/models/[^"]+)"', node)):
        node = node.replace(f'"{directory}"', f'"{tmp_path / directory.lstrip("/")}"')
    (tmp_path / "node.toml").write_text(node)
    front = switch_config.load(tmp_path / "node.toml")
    assert [m.name for m in front.models] == ["chat", "coder", "long"] and front.port == 9000
