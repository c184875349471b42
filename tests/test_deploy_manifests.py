"""The Kubernetes manifests (deploy/k8s) and the images (docker/), checked without a cluster.

No Docker daemon or Kubernetes cluster runs here, so this is what stands between a typo and
a broken rollout: every object is validated against the pinned Kubernetes version's
OpenAPI schemas (strict: an unknown field is an error), offline, with the schemas that
kubernetes-validate bundles; then the pieces are checked against each other (Services
against pods, the ConfigMap's worker URLs against Services, probes, drain timing, MIG
requests, image tags), and the Dockerfiles against the Makefile.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from agent.config import load_config

REPO_ROOT = Path(__file__).resolve().parent.parent
MANIFEST_DIR = REPO_ROOT / "deploy" / "k8s"
DOCKER_DIR = REPO_ROOT / "docker"
K8S_VERSION = "1.33.0"  # the cluster version the manifests target; bundled by kubernetes-validate
NAMESPACE = "cadence"
GPU_WORKERS = {"llm", "orpheus", "snac", "asr", "embedder"}  # one MIG slice each
MIG_SLICES_PER_GPU = 7  # an H100 80GB under the all-1g.10gb layout (deploy/README.md)
MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-\d+g\.\d+gb$")
WORKER_LABEL = "cadence-worker"  # names the Deployment's entry in the ConfigMap's deployment.yaml


# --- loading -------------------------------------------------------------------------------

def manifest_files() -> list[Path]:
    return sorted(MANIFEST_DIR.glob("*.yaml"))


def load_objects() -> list[dict]:
    objects = []
    for path in manifest_files():
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return objects


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return load_objects()


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


def name_of(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def all_containers(deployment: dict) -> list[dict]:
    spec = pod_spec(deployment)
    return spec.get("initContainers", []) + spec["containers"]


def container_ports(container: dict) -> dict[str, int]:
    """name (or the number as text) -> port number."""
    ports = {}
    for port in container.get("ports", []):
        ports[str(port["containerPort"])] = port["containerPort"]
        if "name" in port:
            ports[port["name"]] = port["containerPort"]
    return ports


def config_map(objects: list[dict]) -> dict:
    (found,) = [cm for cm in of_kind(objects, "ConfigMap") if cm["metadata"]["name"] == "cadence-config"]
    return found


def deployment_file(objects: list[dict]) -> dict:
    return yaml.safe_load(config_map(objects)["data"]["deployment.yaml"])


def agent_deployment(objects: list[dict]) -> dict:
    (agent,) = [d for d in of_kind(objects, "Deployment")
                if d["metadata"]["labels"].get("app.kubernetes.io/component") == "agent-server"]
    return agent


def gpu_resources(container: dict) -> dict[str, object]:
    limits = container.get("resources", {}).get("limits", {})
    return {key: value for key, value in limits.items() if key.startswith("nvidia.com/")}


def worker_deployments(objects: list[dict]) -> dict[str, dict]:
    """Worker name -> its Deployment, for every Deployment that asks for a GPU."""
    workers = {}
    for deployment in of_kind(objects, "Deployment"):
        if any(gpu_resources(c) for c in all_containers(deployment)):
            workers[deployment["metadata"]["labels"].get(WORKER_LABEL)] = deployment
    return workers


def flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


# --- schema --------------------------------------------------------------------------------

def test_the_pinned_kubernetes_version_is_bundled() -> None:
    # validate() silently falls back to the newest bundled version at or below the one asked
    # for: make sure the schemas used are the pinned version's own.
    assert K8S_VERSION in kubernetes_validate.utils.all_versions()


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path: Path) -> None:
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert documents, f"{path.name} holds no object"
    errors = []
    for doc in documents:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{name_of(doc)} at {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_the_expected_objects_exist(objects: list[dict]) -> None:
    names = {name_of(obj) for obj in objects}
    for worker in GPU_WORKERS | {"agent"}:
        assert f"Deployment/cadence-{worker}" in names
        assert f"Service/cadence-{worker}" in names
    assert {"Namespace/cadence", "ConfigMap/cadence-config"} <= names


def test_every_object_is_in_the_cadence_namespace(objects: list[dict]) -> None:
    # Worker URLs use Services' short DNS names, which resolve only within one namespace.
    stray = [name_of(obj) for obj in objects
             if obj["kind"] != "Namespace" and obj["metadata"].get("namespace") != NAMESPACE]
    assert not stray


# --- pods ----------------------------------------------------------------------------------

def test_every_deployment_container_has_probes_on_its_own_ports(objects: list[dict]) -> None:
    problems = []
    for deployment in of_kind(objects, "Deployment"):
        for container in pod_spec(deployment)["containers"]:
            ports = container_ports(container)
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in container:
                    problems.append(f"{name_of(deployment)}/{container['name']}: no {probe}")
                    continue
                port = container[probe].get("httpGet", {}).get("port")
                if port is not None and str(port) not in ports:
                    problems.append(f"{name_of(deployment)}/{container['name']}: {probe} port {port} not declared")
    assert not problems, "\n".join(problems)


def test_every_container_has_cpu_and_memory_requests_and_limits(objects: list[dict]) -> None:
    missing = []
    for deployment in of_kind(objects, "Deployment"):
        for container in all_containers(deployment):
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    if resource not in resources.get(part, {}):
                        missing.append(f"{name_of(deployment)}/{container['name']}: {part}.{resource}")
    assert not missing, "\n".join(missing)


def test_pods_run_unprivileged(objects: list[dict]) -> None:
    problems = []
    for deployment in of_kind(objects, "Deployment"):
        pod_security = pod_spec(deployment).get("securityContext", {})
        if pod_security.get("runAsNonRoot") is not True:
            problems.append(f"{name_of(deployment)}: runAsNonRoot is not true")
        if pod_security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{name_of(deployment)}: no RuntimeDefault seccomp profile")
        for container in all_containers(deployment):
            security = container.get("securityContext", {})
            where = f"{name_of(deployment)}/{container['name']}"
            if security.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation is not false")
            if security.get("privileged"):
                problems.append(f"{where}: privileged")
            if "ALL" not in security.get("capabilities", {}).get("drop", []):
                problems.append(f"{where}: capabilities not dropped")
    assert not problems, "\n".join(problems)


def test_each_gpu_worker_requests_exactly_one_mig_slice(objects: list[dict]) -> None:
    workers = worker_deployments(objects)
    assert set(workers) == GPU_WORKERS
    slices = 0
    for name, deployment in workers.items():
        requests = [(c, gpu_resources(c)) for c in all_containers(deployment) if gpu_resources(c)]
        assert len(requests) == 1, f"{name}: {len(requests)} containers ask for a GPU"
        container, resources = requests[0]
        assert len(resources) == 1, f"{name}: {resources}"
        ((resource, count),) = resources.items()
        assert MIG_RESOURCE.match(resource), f"{name} asks for {resource}, not a MIG slice"
        assert int(count) == 1, f"{name} asks for {count} slices"
        requested = container["resources"].get("requests", {}).get(resource, count)
        assert int(requested) == int(count), f"{name}: extended resources need requests == limits"
        slices += deployment["spec"].get("replicas", 1) * int(count)
    assert slices <= MIG_SLICES_PER_GPU, f"{slices} slices do not fit one MIG'd H100"


def test_the_agent_server_holds_no_gpu(objects: list[dict]) -> None:
    assert not any(gpu_resources(c) for c in all_containers(agent_deployment(objects)))


# --- the agent server: affinity and draining -----------------------------------------------

def test_the_agent_service_keeps_a_caller_on_one_pod(objects: list[dict]) -> None:
    labels = agent_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    services = [s for s in of_kind(objects, "Service")
                if s["spec"]["selector"].items() <= labels.items()]
    assert services, "no Service selects the agent server"
    for service in services:
        assert service["spec"].get("sessionAffinity") == "ClientIP", \
            f"{name_of(service)}: a call's signalling requests could land on different pods"


def test_the_grace_period_outlasts_the_drain(objects: list[dict]) -> None:
    spec = pod_spec(agent_deployment(objects))
    (container,) = spec["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    if len(command) == 3 and command[:2] in (["sh", "-c"], ["/bin/sh", "-c"]):
        command = shlex.split(command[2])
    assert command[:2] == ["cadence", "drain"], command
    timeout = flag_value(command, "--timeout")
    assert timeout is not None, "the drain has no --timeout: it could outlast any grace period"
    url = urlsplit(flag_value(command, "--url") or "")
    assert url.hostname == "127.0.0.1" and url.port in container_ports(container).values(), url
    grace = spec.get("terminationGracePeriodSeconds", 30)
    assert grace > float(timeout), f"grace {grace} s <= drain {timeout} s: calls would be killed mid-drain"


def test_the_agent_config_loads_and_matches_the_pod(objects: list[dict], tmp_path: Path) -> None:
    data = config_map(objects)["data"]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(data["config.yaml"])
    config = load_config(config_file)  # strict: an unknown or mistyped key fails here
    (container,) = pod_spec(agent_deployment(objects))["containers"]
    assert config.server.host == "0.0.0.0", "a pod must listen beyond loopback"
    assert config.server.port in container_ports(container).values()
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for flag, key in (("--config", "config.yaml"), ("--deployment", "deployment.yaml")):
        path = Path(flag_value(container["args"], flag))
        assert path.name == key and str(path.parent) in mounts, f"{flag} {path} is not the mounted ConfigMap"
    store_dir = str(Path(config.store.path).parent)
    assert store_dir in mounts and not mounts[store_dir].get("readOnly"), "the store needs a writable volume"


# --- Services and workers ------------------------------------------------------------------

def test_every_service_selects_a_deployment_and_its_port(objects: list[dict]) -> None:
    problems = []
    deployments = of_kind(objects, "Deployment")
    for service in of_kind(objects, "Service"):
        selector = service["spec"].get("selector") or {}
        pods = [d for d in deployments
                if selector and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        if len(pods) != 1:
            problems.append(f"{name_of(service)} selects {len(pods)} Deployments")
            continue
        ports = {}
        for container in pod_spec(pods[0])["containers"]:
            ports.update(container_ports(container))
        for port in service["spec"]["ports"]:
            if str(port.get("targetPort", port["port"])) not in ports:
                problems.append(f"{name_of(service)}: targetPort {port.get('targetPort')} not in {name_of(pods[0])}")
    for deployment in deployments:
        match = deployment["spec"]["selector"]["matchLabels"]
        if not match.items() <= deployment["spec"]["template"]["metadata"]["labels"].items():
            problems.append(f"{name_of(deployment)}: selector does not match its own pods")
    assert not problems, "\n".join(problems)


def test_every_external_worker_url_names_a_service_and_its_port(objects: list[dict]) -> None:
    services = {s["metadata"]["name"]: s for s in of_kind(objects, "Service")}
    workers = deployment_file(objects)["workers"]
    assert set(workers) == GPU_WORKERS
    problems = []
    for name, worker in workers.items():
        if worker.get("run") != "external":
            problems.append(f"{name}: run is {worker.get('run')!r}, but it runs in its own Deployment")
            continue
        url = urlsplit(worker["url"])
        host = url.hostname or ""
        service = services.get(host.split(".")[0])
        if service is None or host not in _service_hostnames(service):
            problems.append(f"{name}: {worker['url']} names no Service")
        elif url.port not in {p["port"] for p in service["spec"]["ports"]}:
            problems.append(f"{name}: {worker['url']}: the Service has no port {url.port}")
    assert not problems, "\n".join(problems)


def _service_hostnames(service: dict) -> set[str]:
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    return {name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"}


def test_each_worker_deployment_runs_its_entry(objects: list[dict]) -> None:
    entries = deployment_file(objects)["workers"]
    for name, deployment in worker_deployments(objects).items():
        (container,) = pod_spec(deployment)["containers"]
        args, ports = container["args"], container_ports(container)
        if args[0] == "serve":  # vLLM: the model, port and batch must agree with the entry
            assert container["command"] == ["vllm"], name
            assert args[1] == entries[name]["model"], f"{name}: serves {args[1]}"
            assert flag_value(args, "--host") == "0.0.0.0", name
            assert int(flag_value(args, "--max-num-seqs")) == entries[name]["max_streams"], name
        else:  # Cadence's own worker reads its entry by name
            assert container["command"] == ["cadence"] and args[0] == "worker", name
            assert flag_value(args, "--worker") == name
            assert flag_value(args, "--deployment") == "/etc/cadence/deployment.yaml", name
        assert int(flag_value(args, "--port")) in ports.values(), f"{name}: --port is not the container port"


# --- images --------------------------------------------------------------------------------

def image_tag(image: str) -> str | None:
    """The tag of `[registry[:port]/]name[:tag][@digest]`, or "@digest"; None when neither."""
    if "@" in image:
        return "@" + image.split("@", 1)[1]
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


@pytest.mark.parametrize("image, tag", [
    ("cadence:0.10.0", "0.10.0"), ("registry:5000/cadence", None), ("vllm/vllm-openai:latest", "latest"),
    ("registry:5000/cadence:1.2", "1.2"), ("x@sha256:ab", "@sha256:ab"),
])
def test_image_tag_parsing(image: str, tag: str | None) -> None:
    assert image_tag(image) == tag


def test_every_image_tag_is_pinned(objects: list[dict]) -> None:
    images = [c["image"] for d in of_kind(objects, "Deployment") for c in all_containers(d)]
    assert images
    unpinned = [image for image in images if image_tag(image) in (None, "latest")]
    assert not unpinned, f"unpinned images: {unpinned}"


# --- Dockerfiles ---------------------------------------------------------------------------

def dockerfile(name: str) -> str:
    """The Dockerfile's instructions: comments dropped, line continuations joined."""
    lines = [line for line in (DOCKER_DIR / name).read_text().splitlines() if not line.lstrip().startswith("#")]
    return "\n".join(lines).replace("\\\n", " ")


def base_images(text: str) -> list[str]:
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    return [re.sub(r"\$\{(\w+)\}", lambda m: args.get(m[1], m[0]), image) for image in froms]


# `make` as a command: the start of a RUN (after its --mount flags) or after && or ;, with
# optional VAR=value assignments before it. Not the word in `apt-get install make`.
MAKE_CALL = re.compile(r"(?:^RUN\s+(?:--\S+\s+)*|&&\s*|;\s*)(?:\w+=\S+\s+)*make\s+([^&;|\n]+)", re.M)


def make_targets(text: str) -> list[str]:
    targets = []
    for call in MAKE_CALL.findall(text):
        targets += [word for word in call.split() if "=" not in word and not word.startswith("-")]
    return targets


def makefile_targets() -> set[str]:
    text = (REPO_ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+)\s*:?=\s*(.*?)\s*$", text, re.M))

    def expand(word: str) -> str:
        for _ in range(5):
            word = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m[1], ""), word)
        return word

    targets = set()
    for names in re.findall(r"^([^\s#:=][^:=]*?)\s*:(?!=)", text, re.M):
        targets |= {expand(name) for name in names.split()}
    return targets


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfile_runs_makefile_targets(name: str) -> None:
    text = dockerfile(name)
    targets = make_targets(text)
    assert targets, f"{name} does not run make"
    assert set(targets) <= makefile_targets(), f"{name} runs targets the Makefile lacks: {targets}"
    assert "HF_HUB_OFFLINE=1" in text, f"{name}: the build must not reach a model hub"


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfile_bases_are_pinned(name: str) -> None:
    for image in base_images(dockerfile(name)):
        if image in ("build", "runtime"):  # earlier stages of the same file
            continue
        assert image_tag(image) not in (None, "latest"), f"{name}: FROM {image}"


def test_the_images_are_the_ones_the_manifests_name(objects: list[dict]) -> None:
    assert base_images(dockerfile("Dockerfile"))[0].startswith("python:3.11-slim")
    (gpu_base,) = base_images(dockerfile("Dockerfile.gpu"))
    images = {c["image"] for d in of_kind(objects, "Deployment") for c in all_containers(d)}
    vllm_images = {image for image in images if image.startswith("vllm/vllm-openai:")}
    assert vllm_images == {gpu_base}, "the GPU workers' base and the vLLM pods' image differ"
    cadence_tags = {image_tag(image) for image in images if image.split(":")[0] in ("cadence", "cadence-gpu")}
    assert len(cadence_tags) == 1, f"the two Cadence images carry different versions: {cadence_tags}"


def test_dockerignore_keeps_local_state_out() -> None:
    entries = {line.strip().rstrip("/") for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()}
    for needed in (".venv", "data", "test-artifacts", ".git"):
        assert needed in entries, needed
    assert entries & {"node_modules", "**/node_modules"}


def test_the_configmap_deployment_is_one_the_agent_server_loads():
    from workers.deployment import parse_deployment

    config_map = next(d for d in load_objects() if d.get("kind") == "ConfigMap")
    deployment = parse_deployment(yaml.safe_load(config_map["data"]["deployment.yaml"]), "configmap")
    assert {w.run for w in deployment.workers} == {"external"}
    assert {w.role for w in deployment.workers} >= {"llm", "tts", "asr", "embedder"}
