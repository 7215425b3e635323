"""The deploy files work as written (issue 13): the Kubernetes manifests are valid against the
Kubernetes API schemas (bundled by the kubernetes-validate package, so offline) and fit together,
the kustomization ships no Secret, every setting the files name is one gateway/config.py knows,
Redis is persisted and never evicts, and the Dockerfiles copy only what exists.

No Docker engine and no cluster are needed; ``kubectl kustomize`` is used when kubectl is there.
"""

from __future__ import annotations

import copy
import fnmatch
import re
import shutil
import subprocess
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
#: Custom resources of an operator (Strimzi): outside the kustomization, checked by hand below.
OPERATOR_FILES = {"kafka-strimzi.yaml"}
FIELDS = {f.name for f in fields(Settings)}
#: MQGW_* variables that are not Settings fields but options of `mqgw serve` or Settings.load.
CLI_ENV = {"MQGW_CONFIG", "MQGW_HOST", "MQGW_PORT", "MQGW_WORKERS"}
#: The oldest Kubernetes release the manifests are checked against, besides the newest bundled.
OLDEST_K8S = "1.29.0"

Doc = dict[str, Any]


def docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization() -> Doc:
    out: Doc = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return out


def resources() -> list[tuple[str, Doc]]:
    """(file, document) of everything `kubectl apply -k deploy/k8s` applies."""
    return [(name, d) for name in kustomization()["resources"] for d in docs(K8S / name)]


def one(kind: str, name: str | None = None, pool: list[tuple[str, Doc]] | None = None) -> Doc:
    found = [d for _, d in (resources() if pool is None else pool)
             if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def gateway_container() -> Doc:
    containers = one("Deployment", "mq-gateway")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "gateway")


def configmap_toml() -> dict[str, Any]:
    return tomllib.loads(one("ConfigMap", "mq-gateway")["data"]["gateway.toml"])["gateway"]


def strimzi() -> list[tuple[str, Doc]]:
    return [("kafka-strimzi.yaml", d) for d in docs(K8S / "kafka-strimzi.yaml")]


# --- the kustomization ------------------------------------------------------------------------

def test_kustomization_applies_every_manifest_and_no_secret() -> None:
    listed = kustomization()["resources"]
    assert len(listed) == len(set(listed))
    for name in listed:
        assert (K8S / name).is_file(), f"kustomization.yaml lists {name}, which does not exist"
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) | OPERATOR_FILES == on_disk, "a manifest is neither applied nor an operator's"
    assert not set(listed) & OPERATOR_FILES
    # `kubectl apply -k` must never overwrite the Secret the user made (with a public value).
    assert [f for f, d in resources() if d["kind"] == "Secret"] == []
    assert "secretGenerator" not in kustomization()


def test_kubectl_kustomize_builds_the_same_objects() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the schema checks below do not need it)")
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in built) == \
        sorted((d["kind"], d["metadata"]["name"]) for _, d in resources())
    image = kustomization()["images"][0]
    deployment = next(d for d in built if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == \
        f"{image['newName']}:{image['newTag']}"


# --- the Kubernetes API schemas ---------------------------------------------------------------

def _k8s_versions() -> list[str]:
    from kubernetes_validate import utils

    bundled = utils.all_versions()
    versions = [utils.latest_version()]
    if OLDEST_K8S in bundled:
        versions.append(OLDEST_K8S)
    return versions


def _validate(doc: Doc, version: str) -> None:
    from kubernetes_validate import utils

    # strict: a misspelt field is an error, not something the API server silently drops
    utils.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", _k8s_versions())
def test_manifests_are_valid_kubernetes_objects(version: str) -> None:
    from kubernetes_validate import utils

    errors, checked = [], 0
    for name, doc in resources():
        try:
            _validate(doc, version)
        except utils.ValidationError as e:
            errors.append(f"{name}: {doc['kind']} {doc['metadata'].get('name')}: {e.message} "
                          f"at {'/'.join(map(str, e.absolute_path)) or '/'}")
        checked += 1
    if errors:
        pytest.fail(f"invalid for Kubernetes {version}:\n" + "\n".join(errors), pytrace=False)
    assert checked >= 8  # ConfigMap, Deployment, PDB, 3 Services, StatefulSet, Ingress


def test_the_schema_check_fails_on_a_broken_manifest() -> None:
    """The check above can fail: a misspelt field, a wrong type and a missing required field."""
    from kubernetes_validate import utils

    version = _k8s_versions()[0]
    good = one("Deployment", "mq-gateway")
    _validate(good, version)
    misspelt = copy.deepcopy(good)
    misspelt["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    wrong_type = copy.deepcopy(good)
    wrong_type["spec"]["replicas"] = "three"
    missing = copy.deepcopy(one("StatefulSet", "redis"))
    del missing["spec"]["selector"]
    for broken in (misspelt, wrong_type, missing):
        with pytest.raises(utils.ValidationError):
            _validate(broken, version)


# --- the objects fit together -----------------------------------------------------------------

def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_services_ingress_and_budget_select_the_pods() -> None:
    gw = one("Deployment", "mq-gateway")
    pod_labels = gw["spec"]["template"]["metadata"]["labels"]
    assert _matches(gw["spec"]["selector"]["matchLabels"], pod_labels)
    svc = one("Service", "mq-gateway")
    assert _matches(svc["spec"]["selector"], pod_labels)
    assert _matches(one("PodDisruptionBudget", "mq-gateway")["spec"]["selector"]["matchLabels"],
                    pod_labels)
    port_names = {p["name"] for p in gateway_container()["ports"]}
    assert port_names >= {p["targetPort"] for p in svc["spec"]["ports"]}
    for rule in one("Ingress", "mq-gateway")["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            target = one("Service", backend["name"])
            assert backend["port"]["name"] in {p["name"] for p in target["spec"]["ports"]}

    redis = one("StatefulSet", "redis")
    redis_pods = redis["spec"]["template"]["metadata"]["labels"]
    assert _matches(redis["spec"]["selector"]["matchLabels"], redis_pods)
    assert one("Service", redis["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    for name in ("redis", redis["spec"]["serviceName"]):
        assert _matches(one("Service", name)["spec"]["selector"], redis_pods)
    # the gateway pods are not selected by Redis' Services, nor the other way round
    assert not _matches(one("Service", "redis")["spec"]["selector"], pod_labels)
    assert not _matches(svc["spec"]["selector"], redis_pods)


def test_the_gateway_reads_its_configmap_secret_and_image() -> None:
    gw = one("Deployment", "mq-gateway")
    c = gateway_container()
    env = {e["name"]: e for e in c["env"]}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    volume = next(v for v in gw["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    cm = one("ConfigMap", volume["configMap"]["name"])
    assert env["MQGW_CONFIG"]["value"] == f"{mount['mountPath']}/gateway.toml"
    assert "gateway.toml" in cm["data"]

    # The Secret is made by hand, as the kustomization (and docs/operations.md) say, with the name
    # and key the Deployment reads.
    ref = env["MQGW_HMAC_KEY"]["valueFrom"]["secretKeyRef"]
    for doc in (K8S / "kustomization.yaml", ROOT / "docs" / "operations.md"):
        made = re.findall(r"kubectl create secret generic (\S+) --from-literal=(\w+)=", doc.read_text())
        assert made, f"{doc.name} does not say how to create the Secret"
        assert set(made) == {(ref["name"], ref["key"])}, doc.name

    image = kustomization()["images"][0]["name"]
    assert c["image"].rpartition(":")[0] == image
    assert "example.com" not in c["image"]
    assert c["command"][:2] == ["mqgw", "serve"]


def test_configmap_addresses_are_the_example_services() -> None:
    gw = configmap_toml()
    redis_svc = one("Service", "redis")
    assert gw["redis_url"] == f"redis://{redis_svc['metadata']['name']}:{redis_svc['spec']['ports'][0]['port']}/0"
    kafka = one("Kafka", pool=strimzi())
    plain = next(li for li in kafka["spec"]["kafka"]["listeners"] if li["name"] == "plain")
    ns = kafka["metadata"]["namespace"]
    assert gw["kafka_bootstrap"] == f"{kafka['metadata']['name']}-kafka-bootstrap.{ns}.svc:{plain['port']}"


def test_strimzi_example_is_a_replicated_kraft_cluster() -> None:
    pool = strimzi()
    kafka = one("Kafka", pool=pool)
    name = kafka["metadata"]["name"]
    nodes = one("KafkaNodePool", pool=pool)
    topic = one("KafkaTopic", pool=pool)
    for d in (kafka, nodes, topic):
        assert d["apiVersion"].startswith("kafka.strimzi.io/")
        assert d["metadata"]["namespace"] == kafka["metadata"]["namespace"]
    assert nodes["metadata"]["labels"]["strimzi.io/cluster"] == name
    assert topic["metadata"]["labels"]["strimzi.io/cluster"] == name
    assert set(nodes["spec"]["roles"]) == {"broker", "controller"}
    assert nodes["spec"]["replicas"] >= 3
    config = kafka["spec"]["kafka"]["config"]
    assert config["default.replication.factor"] == 3 and config["min.insync.replicas"] == 2
    assert topic["spec"]["replicas"] <= nodes["spec"]["replicas"]
    assert "zookeeper" not in kafka["spec"]
    # the gateway's own topics are replicated like the rest
    assert configmap_toml().get("delay_replication", -1) in (-1, config["default.replication.factor"])


# --- settings named by the deploy files --------------------------------------------------------

def _compose() -> Doc:
    out: Doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return out


def test_environment_variables_are_gateway_settings() -> None:
    known = {f"MQGW_{f.upper()}" for f in FIELDS} | CLI_ENV
    sources = (ROOT / "gateway" / "cli" / "main.py").read_text() + \
        (ROOT / "gateway" / "config.py").read_text()
    for name in CLI_ENV:
        assert name in sources, f"{name} is read nowhere any more"
    named = [e["name"] for e in gateway_container()["env"]]
    for service in _compose()["services"].values():
        named += [k for k in (service.get("environment") or {}) if k.startswith("MQGW_")]
    for text in (DEPLOY / "Dockerfile").read_text(), (DEPLOY / "Dockerfile.report").read_text():
        named += re.findall(r"\bMQGW_[A-Z_]+\b", text)
    assert "MQGW_HMAC_KEY" in named
    unknown = sorted(n for n in set(named) if n.startswith("MQGW_") and n not in known)
    assert unknown == [], f"not settings of gateway/config.py nor mqgw serve options: {unknown}"


def _toml_keys_commented_out(text: str) -> set[str]:
    return set(re.findall(r"^# ?([a-z_]+) = ", text, flags=re.MULTILINE))


@pytest.mark.parametrize("which", ["gateway.example.toml", "configmap"])
def test_toml_files_load_and_hold_no_secret(which: str, tmp_path: Path) -> None:
    if which == "configmap":
        text = one("ConfigMap", "mq-gateway")["data"]["gateway.toml"]
    else:
        text = (DEPLOY / which).read_text()
    table = tomllib.loads(text)["gateway"]
    assert set(table) <= FIELDS, f"unknown keys: {sorted(set(table) - FIELDS)}"
    assert _toml_keys_commented_out(text) <= FIELDS
    assert "hmac_key" not in table  # from a Secret / MQGW_HMAC_KEY, never a file in git
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    s = Settings.load({"MQGW_CONFIG": str(path)})
    assert s.auth and not s.open_mode  # the production posture


def test_compose_files_and_names_exist() -> None:
    compose = _compose()
    gateway = compose["services"]["gateway"]
    assert (DEPLOY / gateway["build"]["context"] / gateway["build"]["dockerfile"]).is_file()
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), source
    assert gateway["environment"]["MQGW_CONFIG"] in [v.split(":")[1] for v in gateway["volumes"]]


# --- Redis ------------------------------------------------------------------------------------

def _flags(args: list[str]) -> dict[str, str]:
    assert args[0] == "redis-server"
    return {k.removeprefix("--"): v for k, v in zip(args[1::2], args[2::2], strict=True)}


def _bytes(size: str) -> int:
    m = re.fullmatch(r"(\d+)\s*(gb|mb|kb|gi|mi|ki)?", size.strip().lower())
    assert m, size
    unit = {"gb": 10**9, "mb": 10**6, "kb": 10**3, "gi": 2**30, "mi": 2**20, "ki": 2**10, None: 1}
    return int(m[1]) * unit[m[2]]


def test_redis_persists_and_never_evicts() -> None:
    redis = one("StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][0]
    for args in (redis["args"], _compose()["services"]["redis"]["command"]):
        flags = _flags(args)
        assert flags["appendonly"] == "yes"
        assert flags["appendfsync"] == "everysec"
        assert flags["maxmemory-policy"] == "noeviction"
        assert _bytes(flags["maxmemory"]) > 0  # noeviction means nothing without it
    # room for the fork of an AOF rewrite: maxmemory at most half the container's limit
    limit = _bytes(redis["resources"]["limits"]["memory"])
    assert _bytes(_flags(redis["args"])["maxmemory"]) * 2 <= limit
    assert one("StatefulSet", "redis")["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] in \
        {m["name"] for m in redis["volumeMounts"] if m["mountPath"] == "/data"}


def test_prefetch_figure_in_the_deployment_is_the_code_s() -> None:
    code = (ROOT / "gateway" / "broker" / "kafka" / "clients.py").read_text()
    in_code = re.findall(r'"queued\.max\.messages\.kbytes":\s*([\d_]+)', code)
    said = re.findall(r"queued\.max\.messages\.kbytes=(\d+)", (K8S / "deployment.yaml").read_text())
    assert len(in_code) == 1 and said == [in_code[0].replace("_", "")]


# --- Dockerfiles ------------------------------------------------------------------------------

DOCKERFILES = sorted(p for p in DEPLOY.glob("Dockerfile*") if not p.name.endswith(".dockerignore"))


def _ignored(path: str, patterns: list[str]) -> bool:
    first = path.strip("/").split("/")[0]
    return any(fnmatch.fnmatch(first, p) or fnmatch.fnmatch(path, p) for p in patterns)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_copy_what_exists_and_install_known_extras(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    ignore_file = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert ignore_file.is_file(), f"{ignore_file.name} is missing: the build would send the whole repo"
    patterns = [ln.strip() for ln in ignore_file.read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    copies = [ln.split()[1:] for ln in text.splitlines() if ln.startswith("COPY ")]
    assert copies
    for args in copies:
        sources = [a for a in args[:-1] if not a.startswith("--")]
        assert sources
        for source in sources:
            assert (ROOT / source).exists(), f"{dockerfile.name} copies {source}, which does not exist"
            assert not _ignored(source, patterns), f"{ignore_file.name} leaves {source} out"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    for wanted in re.findall(r'pip install "?\.\[([a-z,-]+)\]', text):
        assert set(wanted.split(",")) <= extras, wanted
    assert re.search(r"^FROM \S+:\S+", text, flags=re.MULTILINE), "pin the base image's tag"


def test_the_report_image_is_where_mqgw_report_runs() -> None:
    serve, report = (DEPLOY / "Dockerfile").read_text(), (DEPLOY / "Dockerfile.report").read_text()
    assert "Dockerfile.report" in serve and "spark-submit" in serve + report
    assert "jre" in report and '".[reports]"' in report
    assert 'ENTRYPOINT ["mqgw", "report"]' in report
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(d.startswith("pyspark") for d in pyproject["project"]["optional-dependencies"]["reports"])


# --- what is reachable from outside (issue 20) -------------------------------------------------

#: Paths that must not be public: the admin API and the metrics (README: Known limitations).
PRIVATE = ("/admin", "/metrics", "/console")


def _api_paths() -> list[str]:
    """Every path of openapi.yaml, with a sample value for each {parameter}."""
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    return [re.sub(r"\{[^}]+\}", "x", p) for p in spec["paths"]]


def _private(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PRIVATE)


def _ingress_routes(path: str) -> bool:
    """Whether one of the Ingress' paths takes ``path`` (Kubernetes' Prefix and Exact rules:
    a Prefix matches whole path elements)."""
    for rule in one("Ingress", "mq-gateway")["spec"]["rules"]:
        for p in rule["http"]["paths"]:
            want, kind = p["path"], p["pathType"]
            if kind == "Exact" and path == want:
                return True
            if kind == "Prefix" and (want == "/" or path == want.rstrip("/")
                                     or path.startswith(want.rstrip("/") + "/")):
                return True
    return False


def test_the_ingress_routes_the_public_api_only() -> None:
    paths = _api_paths()
    public = [p for p in paths if not _private(p)]
    assert {"/produce", "/message", "/ack"} <= set(public)
    assert [p for p in public if not _ingress_routes(p)] == []
    private = [*(p for p in paths if _private(p)), "/admin", "/admin/", "/metrics/", "/admin/x/y"]
    assert len(private) > 10
    assert [p for p in private if _ingress_routes(p)] == []


def _nginx_tree(text: str) -> list[Any]:
    """nginx.conf as nested [name, args, children] (comments and quotes handled; enough for
    this file, which has no regex locations and no includes)."""
    tokens = re.findall(r"""'[^']*'|"[^"]*"|[{};]|[^\s{};'"]+""",
                        re.sub(r"(?m)^\s*#.*$|\s#[^'\"\n]*$", "", text))
    root: list[Any] = []
    stack, words = [root], []
    for tok in tokens:
        if tok == "{":
            node = [words[0], words[1:], []]
            stack[-1].append(node)
            stack.append(node[2])
            words = []
        elif tok == "}":
            stack.pop()
        elif tok == ";":
            stack[-1].append([words[0], words[1:], None])
            words = []
        else:
            words.append(tok)
    assert len(stack) == 1 and not words
    return root


def _nginx_location(server: list[Any], path: str) -> list[Any]:
    """The location nginx picks for ``path`` (exact, then the longest prefix; the test below
    makes sure there is no regex location that could take over)."""
    locs = [n for n in server if n[0] == "location"]
    for n in locs:
        if n[1][0] == "=" and n[1][1] == path:
            return n
    prefixes = [(n[1][-1], n) for n in locs if n[1][0] in ("^~",) or len(n[1]) == 1]
    return max(((p, n) for p, n in prefixes if path.startswith(p)), key=lambda x: len(x[0]))[1]


def test_nginx_keeps_admin_and_metrics_off_the_public_port() -> None:
    tree = _nginx_tree((DEPLOY / "nginx.conf").read_text())
    http = next(n for n in tree if n[0] == "http")
    servers = [n[2] for n in http[2] if n[0] == "server"]
    assert len(servers) == 1
    server = servers[0]
    locs = [n for n in server if n[0] == "location"]
    assert not [n for n in locs if n[1][0] in ("~", "~*")], "a regex location could take over"
    for path in [*_api_paths(), "/admin", "/admin/", "/metrics/", "/"]:
        loc = _nginx_location(server, path)
        rules = [(n[0], n[1]) for n in loc[2] if n[0] in ("allow", "deny")]
        assert any(n[0] == "proxy_pass" for n in loc[2]), path
        if _private(path):
            assert rules and rules[-1] == ("deny", ["all"]), (path, rules)
            allowed = [a[0] for k, a in rules if k == "allow"]
            assert allowed and set(allowed) <= {"127.0.0.1", "::1"}, (path, allowed)
        else:
            assert rules == [], (path, rules)


# --- the snapshotter that lag reports need (issue 20) ------------------------------------------

def test_kubernetes_runs_mqgw_snapshot_onto_a_volume() -> None:
    deployments = [d for _, d in resources() if d["kind"] in ("Deployment", "CronJob")]
    runs = [(d, c) for d in deployments
            for c in d["spec"]["template"]["spec"]["containers"]
            if c.get("command", [])[:2] == ["mqgw", "snapshot"]]
    assert len(runs) == 1, "nothing (or more than one thing) runs `mqgw snapshot`"
    d, c = runs[0]
    spec = d["spec"]
    # one writer, also during a rollout: two would write every sample twice
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    args = c["command"]
    assert "--once" not in args
    out = args[args.index("--out") + 1]
    assert args[args.index("--every") + 1] == "60s"
    # --out is on a volume that outlives the pod, made by this kustomization
    mount = next(m for m in c["volumeMounts"] if out == m["mountPath"] or
                 out.startswith(m["mountPath"].rstrip("/") + "/"))
    assert not mount.get("readOnly")
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
    one("PersistentVolumeClaim", claim)
    # the gateway's configuration (redis_url, key_prefix) and image; no HMAC key needed
    env = {e["name"]: e for e in c["env"]}
    config_mount = next(m for m in c["volumeMounts"]
                        if env["MQGW_CONFIG"]["value"] == f"{m['mountPath']}/gateway.toml")
    assert volumes[config_mount["name"]]["configMap"]["name"] == "mq-gateway"
    assert "MQGW_HMAC_KEY" not in env
    assert c["image"] == gateway_container()["image"]
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # not one of the gateway's pods: neither its Service nor its disruption budget selects it
    labels = spec["template"]["metadata"]["labels"]
    assert _matches(spec["selector"]["matchLabels"], labels)
    assert not _matches(one("Service", "mq-gateway")["spec"]["selector"], labels)
    assert not _matches(one("PodDisruptionBudget", "mq-gateway")["spec"]["selector"]["matchLabels"],
                        labels)


# --- what the example files say (issue 20) -----------------------------------------------------

def test_example_toml_states_the_code_s_key_minimum_and_no_tansu_setting() -> None:
    from gateway.config import MIN_HMAC_KEY_BYTES

    text = (DEPLOY / "gateway.example.toml").read_text()
    said = re.findall(r"shorter than\s+(\d+)\s+bytes", text)
    assert said == [str(MIN_HMAC_KEY_BYTES)]
    # gap_recheck_ms is for Tansu, a development stand-in: a Kafka deployment keeps the default
    table = tomllib.loads(text)["gateway"]
    assert table.get("gap_recheck_ms", Settings().gap_recheck_ms) == 0
    assert "gap_recheck_ms" not in configmap_toml()
    comment = text[:text.index("# gap_recheck_ms")].rsplit("\n\n", 1)[-1]
    assert "Tansu only" in comment


def test_compose_says_it_needs_compose_v2() -> None:
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert "version" not in _compose()  # the Compose Specification, which v1 cannot read
    assert "Compose v2" in compose.split("\nname:")[0]
    ops = (ROOT / "docs" / "operations.md").read_text()
    deploy_part = ops[ops.index("[`deploy/`](../deploy) contains:"):]
    assert "Compose v2" in deploy_part[:deploy_part.index("```sh")]


# --- the Redis Sentinel variants (issue 34) -----------------------------------------------------

HA_K8S = DEPLOY / "k8s-redis-sentinel"
HA_COMPOSE = DEPLOY / "docker-compose.redis-sentinel.yml"


def _ha_k8s() -> list[Doc]:
    return docs(HA_K8S / "redis-sentinel.yaml")


def _sentinel_url(url: str, service: str, hosts: list[str]) -> None:
    """``url`` names the sentinels ``hosts`` (port 26379) and the primary ``service``."""
    from gateway.store.connect import parse_url

    a = parse_url(url)
    assert (a.scheme, a.service, a.db) == ("redis+sentinel", service, 0), url
    assert a.hosts == [(h, 26379) for h in hosts], url


@pytest.mark.parametrize("version", _k8s_versions())
def test_the_sentinel_manifests_are_valid_kubernetes_objects(version: str) -> None:
    kinds = []
    for doc in _ha_k8s():
        _validate(doc, version)
        kinds.append(doc["kind"])
    assert sorted(kinds) == ["ConfigMap", "PodDisruptionBudget", "Service", "StatefulSet"]


def test_the_sentinel_kustomization_swaps_the_redis_and_points_the_gateway_at_it() -> None:
    k: Doc = yaml.safe_load((HA_K8S / "kustomization.yaml").read_text())
    assert k["resources"] == ["../k8s", "redis-sentinel.yaml"]
    deleted = {(p["kind"], p["metadata"]["name"]) for p in
               (yaml.safe_load(x["patch"]) for x in k["patches"] if "target" not in x)
               if p.get("$patch") == "delete"}
    base = {(d["kind"], d["metadata"]["name"]) for _, d in resources()}
    redis_objects = {(kind, name) for kind, name in base if name.startswith("redis")}
    assert deleted == redis_objects, "every object of the single Redis goes, and nothing else"
    sts = next(d for d in _ha_k8s() if d["kind"] == "StatefulSet")
    svc = next(d for d in _ha_k8s() if d["kind"] == "Service")
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"] and svc["spec"]["clusterIP"] == "None"
    pods = [f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}"
            for i in range(sts["spec"]["replicas"])]
    targets = {x["target"]["name"] for x in k["patches"] if "target" in x}
    assert targets == {d["metadata"]["name"] for _, d in resources() if d["kind"] == "Deployment"}
    for x in k["patches"]:
        if "target" in x:
            (op,) = yaml.safe_load(x["patch"])
            assert op["value"]["name"] == "MQGW_REDIS_URL"
            _sentinel_url(op["value"]["value"], "mqgw", pods)
    scripts = next(d for d in _ha_k8s() if d["kind"] == "ConfigMap")["data"]
    assert f"sentinel monitor mqgw $primary 6379 {sts['spec']['replicas'] // 2 + 1}" in \
        scripts["sentinel.sh"]
    for name in ("primary.sh", "redis.sh", "sentinel.sh"):  # POSIX sh: the alpine image's
        assert subprocess.run(["sh", "-n"], input=scripts[name], text=True).returncode == 0, name
    for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert flag in scripts["redis.sh"]
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        out = subprocess.run([kubectl, "kustomize", str(HA_K8S)], capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, out.stderr
        built = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out.stdout) if d}
        assert built == (base - redis_objects) | {(d["kind"], d["metadata"]["name"])
                                                   for d in _ha_k8s()}


def test_the_compose_sentinel_override_fits_the_stack() -> None:
    base, ha = _compose(), yaml.safe_load(HA_COMPOSE.read_text())
    sentinels = sorted(s for s in ha["services"] if s.startswith("sentinel-"))
    assert len(sentinels) == 3
    _sentinel_url(ha["services"]["gateway"]["environment"]["MQGW_REDIS_URL"], "mqgw", sentinels)
    assert set(ha["services"]["gateway"]["depends_on"]) == set(sentinels)
    for s in sentinels:
        command = " ".join(ha["services"][s]["command"])
        assert "sentinel monitor mqgw redis 6379 2" in command
        assert f"{s}-data:/data" in ha["services"][s]["volumes"]  # what they learned survives
    command = list(ha["services"]["redis-replica"]["command"])
    at = command.index("--replicaof")  # the one flag with two values
    assert command[at + 1:at + 3] == ["redis", "6379"] and "redis" in base["services"]
    replica = _flags(command[:at] + command[at + 3:])
    for flags in (replica, _flags(ha["services"]["redis"]["command"])):
        assert flags["appendonly"] == "yes" and flags["maxmemory-policy"] == "noeviction"
    # the override's primary keeps the base's persistence flags
    assert {k: v for k, v in _flags(ha["services"]["redis"]["command"]).items()
            if k != "replica-announce-ip"} == _flags(base["services"]["redis"]["command"])
    named = {v.split(":")[0] for svc in ha["services"].values() for v in svc.get("volumes", [])}
    assert named <= set(ha["volumes"])
