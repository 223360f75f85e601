"""The Helm chart (deploy/helm/jev), rendered by a real Helm engine (helm-python-sdk embeds Helm v4) over a matrix
of values, every core object validated strictly against a pinned Kubernetes version's schemas (kubernetes-validate),
KEDA's ScaledObject and the ServiceMonitor structurally (no package ships their CRD schemas), and the policy
asserted: selectors match pod labels, probes and resources set, the grace period longer than the drain, no
`latest`, only the frontend exposed, secrets only through secretKeyRef. No cluster is needed."""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from tools import chart as chart_tool  # noqa: E402

CHART = chart_tool.CHART
KUBERNETES = chart_tool.KUBERNETES
ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ("Deployment", "StatefulSet")

GPU_WORKER = {
    "name": "jev-vl",
    "recipe": "jev-27b-vl",
    "replicas": 2,
    "image": "cuda",
    "device": "cuda",
    "gpus": 1,
    "startupSeconds": 900,
    "drainSeconds": 60,
    "shmSize": "2Gi",
    "modelVolume": {"persistentVolumeClaim": {"claimName": "hf-cache"}},
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "resources": {"requests": {"cpu": "4", "memory": "64Gi"}, "limits": {"memory": "96Gi"}},
}
MATRIX = {
    "cpu-default": {},
    "jev-vl-gpu": {
        "workers": [GPU_WORKER],
        "preencoder": {
            "enabled": True,
            "recipe": "jev-27b-vl",
            "modelVolume": {"persistentVolumeClaim": {"claimName": "hf-cache"}},
        },
    },
    "two-recipes-x3": {
        "workers": [
            {
                "name": "small",
                "recipe": "smollm2-135m-cpu",
                "replicas": 3,
                "image": "cpu",
                "device": "cpu",
                "gpus": 0,
                "startupSeconds": 300,
                "drainSeconds": 30,
            },
            {**GPU_WORKER, "name": "decider", "recipe": "decider-2b-v11", "replicas": 3, "shmSize": ""},
        ]
    },
    "external-redis-and-extras": {
        "redis": {
            "enabled": False,
            "external": {
                "host": "redis.shared.svc",
                "port": 6380,
                "tls": True,
                "existingSecret": "shared-redis",
                "secretKey": "password",
            },
        },
        "apiKeys": {"existingSecret": "jev-api-keys", "key": "keys"},
        "internalToken": {"existingSecret": "jev-internal", "key": "internal-token"},
        "frontend": {
            "service": {"type": "LoadBalancer"},
            "ingress": {"enabled": True, "className": "nginx"},
            "autoscaling": {"enabled": True},
            "rateLimits": "default=60:20000,sha256:9f86d081884c7d65=600:",
        },
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "dashboard": {"enabled": True, "folder": "jev"},
        },
        "workers": [
            {
                "name": "cpu",
                "recipe": "smollm2-135m-cpu",
                "replicas": 2,
                "image": "cpu",
                "device": "cpu",
                "gpus": 0,
                "startupSeconds": 300,
                "drainSeconds": 30,
                "autoscaling": {"enabled": True},
            }
        ],
    },
}


def render(values: dict) -> list[dict]:
    """What `python -m tools.chart render` renders (values checked against the schema first), as objects; a YAML
    mapping with the same key twice is refused (Kubernetes would keep only one)."""
    return chart_tool.documents(chart_tool.render(values, name="demo", namespace="jev"))


@pytest.fixture(scope="module", params=sorted(MATRIX))
def rendered(request) -> tuple[str, dict, list[dict]]:
    return request.param, MATRIX[request.param], render(copy.deepcopy(MATRIX[request.param]))


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def containers(docs: list[dict]):
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield doc, container


def env_of(container: dict) -> dict:
    return {item["name"]: item for item in container.get("env", [])}


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_lint_has_no_errors():
    report = helm.lint(str(CHART))
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] > 1], report["messages"]


def test_core_objects_validate_strictly(rendered):
    _, _, docs = rendered
    core = [
        doc
        for doc in docs
        if "." not in doc["apiVersion"].split("/")[0]
        or doc["apiVersion"].split("/")[0] in ("apps", "policy", "autoscaling", "networking.k8s.io")
    ]
    assert core
    for doc in core:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_custom_resources_are_well_formed(rendered):
    name, values, docs = rendered
    deployments = {doc["metadata"]["name"] for doc in of_kind(docs, "Deployment")}
    services = of_kind(docs, "Service")
    for scaled in of_kind(docs, "ScaledObject"):
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        spec = scaled["spec"]
        assert spec["scaleTargetRef"]["name"] in deployments
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus" and set(trigger["metadata"]) >= {"serverAddress", "query", "threshold"}
        assert "jev_worker_queue_depth" in trigger["metadata"]["query"]
        assert isinstance(trigger["metadata"]["threshold"], str)  # KEDA reads trigger metadata as strings
    for monitor in of_kind(docs, "ServiceMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        ports = {port["name"] for service in services for port in service["spec"]["ports"]}
        assert all(
            endpoint["port"] in ports and endpoint["path"] == "/metrics" for endpoint in monitor["spec"]["endpoints"]
        )
    for monitor in of_kind(docs, "ServiceMonitor"):  # the job names the rules and the dashboard select by
        for endpoint in monitor["spec"]["endpoints"]:
            assert {
                "sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_component"],
                "targetLabel": "job",
                "replacement": "jev-$1",
            } in endpoint["relabelings"]
    rules = of_kind(docs, "PrometheusRule")
    dashboards = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    if values.get("metrics", {}).get("prometheusRule", {}).get("enabled"):
        (rule,) = rules
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert rule["spec"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "jev-rules.yml").read_text())
    else:
        assert not rules
    if values.get("metrics", {}).get("dashboard", {}).get("enabled"):
        (board,) = dashboards
        assert board["metadata"]["labels"]["grafana_dashboard"] == "1"  # the Grafana sidecar's default label
        assert board["metadata"]["annotations"]["grafana_folder"] == "jev"
        shipped = json.loads(board["data"]["jev-dashboard.json"])
        assert shipped == json.loads((ROOT / "deploy" / "grafana" / "jev-dashboard.json").read_text())
    else:
        assert not dashboards
    if name == "external-redis-and-extras":
        assert of_kind(docs, "ScaledObject") and of_kind(docs, "ServiceMonitor")
        worker = next(doc for doc in of_kind(docs, "Deployment") if "worker" in doc["metadata"]["name"])
        assert "replicas" not in worker["spec"]  # the autoscaler owns the count


def test_selectors_match_their_pods(rendered):
    _, _, docs = rendered
    workloads = [doc for doc in docs if doc["kind"] in WORKLOADS]
    pod_labels = [doc["spec"]["template"]["metadata"]["labels"] for doc in workloads]
    for doc in workloads:
        assert matches(doc["spec"]["selector"]["matchLabels"], doc["spec"]["template"]["metadata"]["labels"])
    for doc in of_kind(docs, "Service"):
        assert sum(matches(doc["spec"]["selector"], labels) for labels in pod_labels) == 1, doc["metadata"]["name"]
    for doc in of_kind(docs, "PodDisruptionBudget"):
        assert sum(matches(doc["spec"]["selector"]["matchLabels"], labels) for labels in pod_labels) == 1


def test_probes_resources_and_security(rendered):
    _, _, docs = rendered
    for doc, container in containers(docs):
        where = f"{doc['metadata']['name']}/{container['name']}"
        assert container.get("readinessProbe") and container.get("livenessProbe"), where
        assert container["resources"].get("requests") and container["resources"].get("limits"), where
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"], where
        assert doc["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"], where
        image = container["image"]
        assert re.fullmatch(r"[^:]+:[^:]+", image) and not image.endswith((":latest", ":stable")), where
        if container["name"] == "worker":
            assert container["startupProbe"]["httpGet"]["path"] == "/health"
            assert container["livenessProbe"]["httpGet"]["path"] == "/livez"  # the stall check, not readiness


def test_gpu_workers_request_gpus_and_the_grace_period_outlasts_the_drain(rendered):
    _, values, docs = rendered
    by_name = {doc["metadata"]["name"]: doc for doc in of_kind(docs, "Deployment")}
    defaults = {"gpus": 0, "startupSeconds": 300, "drainSeconds": 30}
    for worker in ({**defaults, **w} for w in values.get("workers", [{"name": "cpu"}])):
        pod = by_name[f"demo-jev-worker-{worker['name']}"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = env_of(container)
        drain = float(env["JEV_SHUTDOWN_GRACE_S"]["value"])
        pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        assert pod["terminationGracePeriodSeconds"] > pre_stop + drain
        assert (
            container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"]
            >= worker["startupSeconds"]
        )
        gpus = container["resources"]["limits"].get("nvidia.com/gpu", 0)
        assert gpus == worker["gpus"] == container["resources"]["requests"].get("nvidia.com/gpu", 0)
        assert env["JEV_WORKER_URL"]["value"] == "http://$(POD_IP):8000"  # each pod announced by its own address
        mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
        if worker.get("modelVolume"):
            assert mounts["model"]["readOnly"]
        assert mounts["assets"]["readOnly"]  # workers read assets; the preencoder alone writes them


def test_only_the_frontend_is_exposed(rendered):
    _, _, docs = rendered
    for doc in of_kind(docs, "Service"):
        if doc["spec"]["type"] != "ClusterIP":
            assert doc["metadata"]["name"] == "demo-jev-frontend"
    for ingress in of_kind(docs, "Ingress"):
        backends = {
            path["backend"]["service"]["name"] for rule in ingress["spec"]["rules"] for path in rule["http"]["paths"]
        }
        assert backends == {"demo-jev-frontend"}
    policies = of_kind(docs, "NetworkPolicy")
    internal = next(p for p in policies if p["metadata"]["name"] == "demo-jev-internal")
    components = next(
        e for e in internal["spec"]["podSelector"]["matchExpressions"] if e["key"] == "app.kubernetes.io/component"
    )["values"]
    assert set(components) == {"worker", "preencoder", "redis"}
    assert all("podSelector" in source for rule in internal["spec"]["ingress"] for source in rule["from"])


def test_secrets_only_through_secret_key_refs(rendered):
    name, values, docs = rendered
    for _doc, container in containers(docs):
        env = env_of(container)
        for item in env.values():
            value = item.get("value", "")
            assert not re.search(r"(?i)(^|_)(password|token|secret|keys?)(_|$)", item["name"]) or "valueFrom" in item, (
                item
            )
            assert not re.search(r"redis://[^$@]*:[^$@]+@", value), item  # no literal password in a URL
        if "JEV_REDIS_URL" in env:
            assert "$(JEV_REDIS_PASSWORD)" in env["JEV_REDIS_URL"]["value"]
            assert "secretKeyRef" in env["JEV_REDIS_PASSWORD"]["valueFrom"]
        if values.get("apiKeys", {}).get("existingSecret") and container["name"] == "frontend":
            assert env["JEV_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "jev-api-keys"
        if container["name"] == "worker":  # the callers' keys are the frontend's: it reaches workers by token
            assert "JEV_API_KEYS" not in env
        if container["name"] in ("frontend", "worker", "preencoder"):
            token = env["JEV_INTERNAL_TOKENS"]["valueFrom"]["secretKeyRef"]
            assert token == {
                "name": values.get("internalToken", {}).get("existingSecret") or "demo-jev-internal-token",
                "key": "internal-token",
            }
    generated = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"] == "demo-jev-internal-token"]
    if values.get("internalToken", {}).get("existingSecret"):
        assert not generated
    else:  # generated at install (never a default in the chart), kept across upgrades by lookup
        token = base64.b64decode(generated[0]["data"]["internal-token"]).decode()
        assert len(token) == 48 and token.isalnum()
    frontend_env = env_of(next(c for d, c in containers(docs) if c["name"] == "frontend"))
    rate_limits = values.get("frontend", {}).get("rateLimits")  # in the release's Redis: one limit for all replicas
    assert frontend_env.get("JEV_RATE_LIMITS", {}).get("value") == rate_limits
    if name == "external-redis-and-extras":
        assert not of_kind(docs, "StatefulSet") and not of_kind(docs, "Secret")
        frontend = next(c for d, c in containers(docs) if c["name"] == "frontend")
        assert (
            env_of(frontend)["JEV_REDIS_URL"]["value"]
            == "rediss://default:$(JEV_REDIS_PASSWORD)@redis.shared.svc:6380/0"
        )


def test_the_frontend_knows_every_recipe_and_its_preencoder_which_shares_the_asset_volume(rendered):
    name, values, docs = rendered
    frontend = next(c for d, c in containers(docs) if c["name"] == "frontend")
    backends = env_of(frontend)["JEV_BACKENDS"]["value"].split(",")
    workers = values.get("workers", [{"name": "cpu", "recipe": "smollm2-135m-cpu"}])
    assert backends == [f"{w['recipe']}=http://demo-jev-worker-{w['name']}:8000" for w in workers]
    claims = of_kind(docs, "PersistentVolumeClaim")
    preencoder_url = env_of(frontend).get("JEV_PREENCODER_URL", {}).get("value")
    if values.get("preencoder", {}).get("enabled"):  # callers reach it through the frontend's POST /v1/preencode
        service = next(d for d in of_kind(docs, "Service") if d["metadata"]["name"] == "demo-jev-preencoder")
        assert preencoder_url == f"http://demo-jev-preencoder:{service['spec']['ports'][0]['port']}"
        (claim,) = claims
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        preencoder = next(c for d, c in containers(docs) if c["name"] == "preencoder")
        assert not any(m.get("readOnly") for m in preencoder["volumeMounts"] if m["name"] == "assets")
    else:
        assert not claims and preencoder_url is None


@pytest.mark.parametrize(
    "values, why",
    [
        (
            {
                "image": {
                    "cpu": {"repository": "jev-cpu", "tag": "latest"},
                    "cuda": {"repository": "jev-cuda", "tag": "1"},
                }
            },
            "latest",
        ),
        (
            {
                "workers": [
                    {
                        "name": "cpu",
                        "recipe": "x",
                        "replicas": 1,
                        "image": "cpu",
                        "device": "cpu",
                        "gpus": 1,
                        "startupSeconds": 60,
                        "drainSeconds": 10,
                    }
                ]
            },
            "gpus on the cpu image",
        ),
        ({"redis": {"enabled": False}}, "no external Redis host"),
        ({"frontend": {"rateLimits": "k-secret-key=10:100"}}, "a key itself in the rate limits"),
        (
            {
                "workers": [
                    {
                        "name": "cpu",
                        "recipe": "x",
                        "replicas": 1,
                        "image": "cpu",
                        "device": "cpu",
                        "gpus": 0,
                        "startupSeconds": 60,
                        "drainSeconds": 10,
                        "extraEnv": {"JEV_REDIS_URL": "redis://:pw@h"},
                    }
                ]
            },
            "a secret in extraEnv",
        ),
    ],
)
def test_the_schema_refuses(values, why):
    with pytest.raises(chart_tool.ChartError):  # in words: tests/unit/test_chart_tool.py
        render(values)


def test_the_routing_values_are_the_frontends_modes():
    """values.schema.json admits exactly the JEV_ROUTING modes the frontend accepts (it offered `load` and
    `round-robin`, which the frontend refuses at start)."""
    from jev_frontend.settings import ROUTING_MODES

    schema = json.loads((ROOT / "deploy" / "helm" / "jev" / "values.schema.json").read_text())

    def enums(node):
        if isinstance(node, dict):
            if "routing" in node.get("properties", {}):
                yield node["properties"]["routing"]["enum"]
            for value in node.values():
                yield from enums(value)
        elif isinstance(node, list):
            for value in node:
                yield from enums(value)

    found = list(enums(schema))
    assert found and all(set(enum) == set(ROUTING_MODES) for enum in found), found
