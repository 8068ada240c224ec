"""The Helm chart of `specbuild deploy`, rendered with real Helm and validated strictly, for the example spec
(engine path, one node) and a two-node LLM API spec (LeaderWorkerSet); bad values refused at render time."""

from __future__ import annotations

import hashlib
import json
import shlex

import pytest
import yaml
from click.testing import CliRunner
from deploy_support import by_kind, deploy, lint, render, validate_all, write_spec

from specbuild.cli import main
from specbuild.deploy import facts

pytest.importorskip("helm_python")
pytest.importorskip("kubernetes_validate")


@pytest.fixture(scope="module")
def example_chart(tmp_path_factory):
    """The chart for the spec `specbuild init --example` writes."""
    folder = tmp_path_factory.mktemp("example")
    runner = CliRunner()
    assert runner.invoke(main, ["init", "--example", "--out", str(folder / "specbuild.toml")]).exit_code == 0
    result = deploy("-c", str(folder / "specbuild.toml"), "--out-dir", str(folder / "chart"))
    assert result.exit_code == 0, result.output
    return folder / "chart"


@pytest.fixture(scope="module")
def two_node_chart(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llmapi")
    spec = write_spec(folder, build={"tp_size": 4, "backend": "llmapi"}, gpu={"name": "H200", "count": 4})
    result = deploy("-c", str(spec), "--nodes", "2", "--out-dir", str(folder / "chart"))
    assert result.exit_code == 0, result.output
    return folder / "chart", spec


def test_example_chart_lints_and_every_object_is_valid(example_chart):
    report = lint(example_chart)
    assert [m for m in report["messages"] if m["severity"] >= 2] == [] and report["errors"] == []
    objects = render(example_chart)
    kinds = by_kind(objects)
    assert {
        "ConfigMap",
        "PersistentVolumeClaim",
        "Job",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "HorizontalPodAutoscaler",
    } <= set(kinds)
    assert "LeaderWorkerSet" not in kinds
    checked = validate_all(objects)
    assert "ServiceMonitor: CRD schema" in checked and len(checked) == len(objects)


def test_the_alternatives_render_valid_objects(example_chart):
    """PodMonitor instead of ServiceMonitor, KEDA instead of the HPA, an existing claim, the CPU backend."""
    objects = render(
        example_chart,
        {
            "monitoring": {"kind": "PodMonitor"},
            "autoscaling": {"engine": "keda"},
            "storage": {"existingClaim": "engines"},
            "models": {"existingClaim": "hf"},
        },
    )
    kinds = by_kind(objects)
    assert "PodMonitor" in kinds and "ScaledObject" in kinds and "HorizontalPodAutoscaler" not in kinds
    assert "PersistentVolumeClaim" not in kinds
    assert validate_all(objects).count("ScaledObject: CRD schema") == 1
    cpu = render(example_chart, {"backend": "reference", "gpu": {"enabled": False, "name": ""}})
    pod = by_kind(cpu)["Deployment"][0]["spec"]["template"]["spec"]
    assert "affinity" not in pod and "nvidia.com/gpu" not in json.dumps(pod["containers"][0]["resources"])
    validate_all(cpu)


def test_a_strict_validator_refuses_an_unknown_field(example_chart):
    """The validation can fail: a misspelled field in a Kubernetes object and in a custom resource."""
    import jsonschema
    import kubernetes_validate

    objects = by_kind(render(example_chart))
    deployment = json.loads(json.dumps(objects["Deployment"][0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_all([deployment])
    monitor = json.loads(json.dumps(objects["ServiceMonitor"][0]))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        validate_all([monitor])


def test_the_deployment_serves_with_the_gpu_the_spec_names(example_chart):
    pod = by_kind(render(example_chart, {"gpu": {"name": "H200", "count": 2}}))["Deployment"][0]["spec"]["template"]
    spec = pod["spec"]
    serve = spec["containers"][0]
    assert serve["resources"]["limits"]["nvidia.com/gpu"] == 2 == serve["resources"]["requests"]["nvidia.com/gpu"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0] == {
        "key": "nvidia.com/gpu.product",
        "operator": "In",
        "values": list(facts.GPU_PRODUCT_LABELS["H200"]),
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    shm = [v for v in spec["volumes"] if v["name"] == "shm"][0]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert serve["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert serve["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert [c["name"] for c in spec["initContainers"]] == ["wait-for-build", "model-repository"]


def test_the_grace_period_follows_serves_exit_timeout(example_chart):
    pod = by_kind(render(example_chart, {"serve": {"exitTimeoutSeconds": 90}}))["Deployment"][0]["spec"]["template"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == facts.grace_seconds(90) == 2 * 90 + 10
    assert "--exit-timeout=90" in pod["spec"]["containers"][0]["args"]


def test_the_pods_commands_are_specbuilds_own(example_chart):
    """The Deployment's and the Job's argv parse as `specbuild serve`, `repo` and `up` options, and the Service
    names the ports serve binds."""
    from specbuild.cli import repo_cmd, serve_cmd, up_cmd

    kinds = by_kind(render(example_chart, {"ports": {"http": 9000, "grpc": 9001, "metrics": 9002}}))
    pod = kinds["Deployment"][0]["spec"]["template"]["spec"]
    serve = pod["containers"][0]
    argv = serve["command"] + serve["args"]
    assert argv[:2] == ["specbuild", "serve"]
    params = serve_cmd.command.make_context("serve", argv[2:]).params
    assert (params["http_port"], params["grpc_port"], params["metrics_port"]) == (9000, 9001, 9002)
    assert params["host"] == "0.0.0.0" and str(params["spec_path"]) == str(facts.SPEC_FILE)
    assert {p["name"]: p["containerPort"] for p in serve["ports"]} == {"http": 9000, "grpc": 9001, "metrics": 9002}
    assert {p["name"]: p["port"] for p in kinds["Service"][0]["spec"]["ports"]} == {
        "http": 9000,
        "grpc": 9001,
        "metrics": 9002,
    }
    repo = pod["initContainers"][1]["command"]
    assert repo_cmd.command.make_context("repo", repo[2:]).params["out_dir"].as_posix() == str(facts.REPO_DIR)
    job = kinds["Job"][0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert up_cmd.command.make_context("up", job[2:]).params["until"] == "build"


def test_the_build_key_follows_the_spec_the_image_and_the_gpu(example_chart):
    def key(values):
        return by_kind(render(example_chart, values))["Job"][0]["metadata"]["name"].rpartition("-")[2]

    base = key({})
    assert key({"replicas": 3}) == base
    spec = yaml.safe_load((example_chart / "values.yaml").read_text())["spec"]
    assert (
        len(
            {
                base,
                key({"gpu": {"name": "H200"}}),
                key({"image": {"tag": "v2"}}),
                key({"spec": spec.replace("max_batch_size = 4", "max_batch_size = 8")}),
            }
        )
        == 4
    )
    pod = by_kind(render(example_chart))["Deployment"][0]["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m.get("subPath") for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/work"] == base and mounts["/engines"] == f"{base}/engines"


def test_a_build_key_of_digits_only_stays_a_string(example_chart):
    """The build key is 12 hex digits, so about one key in 280 is digits only: written bare, YAML reads it as a
    number, and a volume mount's subPath must be a string (the API server refuses the pod). CI met one. The tag
    below is found to give such a key (the key worked out here as the chart's sha256sum | trunc 12 does it); a
    release named by digits alone is the same case for the instance label, and claims named so for claimName."""
    values = yaml.safe_load((example_chart / "values.yaml").read_text())

    def key(tag: str) -> str:
        text = f"{values['spec']}\n{values['image']['repository']}:{tag}\n{values['gpu']['name']}\n{values['backend']}"
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    tag = next(f"v{n}" for n in range(100_000) if key(f"v{n}").isdigit())
    objects = render(
        example_chart,
        {"image": {"tag": tag}, "storage": {"existingClaim": "7"}, "models": {"existingClaim": "8"}},
        name="2026",
    )
    kinds = by_kind(objects)
    assert kinds["Job"][0]["metadata"]["name"].endswith(f"-build-{key(tag)}")  # the key the chart made
    mounts = {
        m["mountPath"]: m.get("subPath")
        for m in kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert mounts["/work"] == key(tag) and mounts["/engines"] == f"{key(tag)}/engines"
    assert kinds["Deployment"][0]["metadata"]["labels"]["app.kubernetes.io/instance"] == "2026"
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in kinds["Deployment"][0]["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims == {"engines": "7", "models": "8"}
    validate_all(objects)


def test_openai_enabled_serves_nvidias_frontend_and_exposes_its_port(example_chart):
    """openai.enabled: serve runs NVIDIA's OpenAI frontend (`serve --server openai`) with the options that server
    takes, its port on the pod and the Service, the probes on its /health/ready, the monitor on its /metrics."""
    from specbuild.triton import openai_frontend

    objects = render(example_chart, {"openai": {"enabled": True, "port": 9100}})
    kinds = by_kind(objects)
    container = kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["--server=openai", "--openai-port=9100"]
    assert not any(a.startswith(("--max-restarts", "--canary-interval", "--metrics-port")) for a in container["args"])
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["openai"] == 9100
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": openai_frontend.HEALTH, "port": "openai"}, probe
    service_ports = {p["name"]: p["port"] for p in kinds["Service"][0]["spec"]["ports"]}
    assert service_ports["openai"] == 9100 and "metrics" not in service_ports
    assert kinds["ServiceMonitor"][0]["spec"]["endpoints"][0]["port"] == "openai"
    validate_all(objects)
    assert facts.OPENAI_PORT == openai_frontend.DEFAULT_PORT
    default = by_kind(render(example_chart))["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert "openai" not in {p["name"] for p in default["ports"]}  # off unless asked


@pytest.mark.parametrize(
    "values, named",
    [
        ({"openai": {"enabled": True}, "backend": "llmapi"}, "openai.enabled"),
        ({"gpu": {"count": 0}}, "gpu.count"),
        ({"replicas": 0}, "replicas"),
        ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "autoscaling.minReplicas"),
        ({"gpu": {"name": "X100"}}, "gpu.name"),
        ({"storage": {"size": "lots"}}, "storage.size"),
        ({"nodes": 2}, "nodes"),
    ],
)
def test_bad_values_are_refused_naming_the_value(example_chart, values, named):
    import helm_python as helm

    with pytest.raises(helm.HelmError) as caught:
        render(example_chart, values)
    message = str(caught.value)  # the templates' own checks say gpu.name, Helm's schema check says at '/gpu/name'
    assert named in message or f"'/{named.replace('.', '/')}'" in message, message


def test_a_gpu_count_below_the_specs_parallelism_is_refused(tmp_path):
    spec = write_spec(tmp_path, build={"tp_size": 2}, gpu={"name": "H100-80GB", "count": 2})
    assert deploy("-c", str(spec), "--out-dir", str(tmp_path / "chart")).exit_code == 0
    render(tmp_path / "chart")  # the spec's own figures render
    import helm_python as helm

    with pytest.raises(helm.HelmError, match=r"gpu.count = 1 .* tp_size x pp_size = 2"):
        render(tmp_path / "chart", {"gpu": {"count": 1}})


def test_two_node_llmapi_chart_is_a_leaderworkerset_running_serves_launcher(two_node_chart):
    chart, spec = two_node_chart
    report = lint(chart)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    objects = render(chart)
    kinds = by_kind(objects)
    assert "Deployment" not in kinds and len(kinds["LeaderWorkerSet"]) == 1
    assert "LeaderWorkerSet: CRD schema" in validate_all(objects)
    lws = kinds["LeaderWorkerSet"][0]["spec"]["leaderWorkerTemplate"]
    assert lws["size"] == 2
    leader = lws["leaderTemplate"]["spec"]["containers"][0]
    printed = CliRunner().invoke(
        main,
        [
            "serve",
            "-c",
            str(spec),
            "--backend",
            "llmapi",
            "--server",
            "trtllm-serve",
            "--nodes",
            "2",
            "--launcher",
            "mpirun",
            "--host",
            "0.0.0.0",
            "--dry-run",
            "--json",
        ],
    )
    launch = json.loads(printed.output)["multi_node"]
    # the same command, with the pods' paths where serve printed this machine's
    here = str(spec.parent / "engines")
    expected = [str(facts.HOSTFILE) if a == "<hostfile>" else a.replace(here, str(facts.OUTPUT_DIR)) for a in launch]
    # ... with mpirun reaching the workers through the chart's rsh agent (kubectl exec), as LWS's TensorRT-LLM example
    assert leader["args"] == expected[:1] + ["-mca", "plm_rsh_agent", str(facts.RSH_AGENT)] + expected[1:]
    assert leader["args"][:11] == [
        "mpirun",
        "-mca",
        "plm_rsh_agent",
        str(facts.RSH_AGENT),
        "--allow-run-as-root",
        "-np",
        "4",
        "--npernode",
        "2",
        "--hostfile",
        str(facts.HOSTFILE),
    ]
    assert leader["args"][11:14] == [
        "trtllm-llmapi-launch",
        "trtllm-serve",
        "/work/engines/pair-7b/target/hf_checkpoint",
    ]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "readinessProbe" not in lws["workerTemplate"]["spec"]["containers"][0]
    assert kinds["Service"][0]["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    # the leader's shell writes one host per pod of the group, then execs the launcher with its args
    script = leader["command"][2]
    assert 'exec "$@"' in script and shlex.split(script)  # well-formed for sh


def test_the_group_starts_as_lws_and_nvidias_example_start_one(two_node_chart):
    """kubernetes-sigs/lws docs/examples/tensorrt-llm: no LeaderReady startup policy (the leader's readiness needs the
    workers' ranks, and LWS would create the workers only once the leader is ready: a deadlock); the leader may read
    pods and exec into them, through its own service account; mpirun's rsh agent is the chart's kubectl-exec script,
    mounted where the launch names it; the workers run no sshd and have no probes."""
    chart, _ = two_node_chart
    objects = render(chart)
    kinds = by_kind(objects)
    lws = kinds["LeaderWorkerSet"][0]["spec"]
    assert lws.get("startupPolicy", "LeaderCreated") == "LeaderCreated"
    leader = lws["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    worker = lws["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    account = leader["serviceAccountName"]
    assert [o["metadata"]["name"] for o in kinds["ServiceAccount"]] == [account]
    binding = kinds["RoleBinding"][0]
    assert (
        binding["subjects"][0]["name"] == account and binding["roleRef"]["name"] == kinds["Role"][0]["metadata"]["name"]
    )
    rules = {
        (resource, verb)
        for rule in kinds["Role"][0]["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {("pods", "get"), ("pods/exec", "create")} <= rules
    mounts = {m["name"]: m["mountPath"] for m in leader["containers"][0]["volumeMounts"]}
    volume = next(v for v in leader["volumes"] if v["name"] == "mpi")
    agent = next(o for o in kinds["ConfigMap"] if o["metadata"]["name"] == volume["configMap"]["name"])
    assert f"{mounts['mpi']}/kubessh" == str(facts.RSH_AGENT) and "kubessh" in agent["data"]
    assert volume["configMap"]["defaultMode"] == 0o555
    assert 'kubectl exec "$pod" -c worker' in agent["data"]["kubessh"] and worker["name"] == "worker"
    assert worker["command"] == facts.WORKER_COMMAND and "sshd" not in json.dumps(worker)
    assert "readinessProbe" not in worker and "livenessProbe" not in worker
    checked = validate_all(objects)  # strictly, each against Kubernetes' schemas or its CRD's
    assert len(checked) == len(objects) and {"ServiceAccount", "Role", "RoleBinding"} <= {
        c.split(":")[0] for c in checked
    }


def test_the_leader_starts_mpirun_only_once_its_workers_run(two_node_chart, tmp_path):
    """The leader's rendered shell, run here: a group of one writes the hostfile (the leader first, its GPUs as slots)
    and execs the launch; a group of two whose worker pod is never seen running (no kubectl, no cluster) never
    starts the launch and fails after multiNode.waitSeconds, naming the pod."""
    import subprocess

    chart, _ = two_node_chart
    objects = render(chart, {"multiNode": {"waitSeconds": 1}})
    leader = by_kind(objects)["LeaderWorkerSet"][0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    script = leader["containers"][0]["command"][2].replace("/run/specbuild/hostfile", str(tmp_path / "hostfile"))
    env = {"PATH": "/usr/bin:/bin", "LWS_LEADER_ADDRESS": "pair-0.pair.ns.svc.cluster.local"}
    alone = subprocess.run(
        ["/bin/sh", "-c", script, "launch", "echo", "launched"],
        env={**env, "LWS_GROUP_SIZE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert alone.returncode == 0 and alone.stdout.strip() == "launched", alone.stderr
    assert (tmp_path / "hostfile").read_text() == "pair-0 slots=2\n"
    waiting = subprocess.run(
        ["/bin/sh", "-c", script, "launch", "echo", "launched"],
        env={**env, "LWS_GROUP_SIZE": "2"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert waiting.returncode == 1 and "launched" not in waiting.stdout
    assert "waiting for worker pod pair-0-1" in waiting.stdout
    assert "worker pod pair-0-1 is not running after 1 s" in waiting.stderr


def test_a_worker_idles_until_it_is_told_to_stop():
    """The worker's command, run here: it keeps running until SIGTERM, then exits 0 at once (as PID 1 in a pod a
    process without a handler would ignore the signal and wait for the grace period's SIGKILL)."""
    import signal
    import subprocess
    import time

    worker = subprocess.Popen(facts.WORKER_COMMAND)
    try:
        time.sleep(0.5)
        assert worker.poll() is None
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()


def test_two_node_values_that_do_not_fit_are_refused(two_node_chart):
    import helm_python as helm

    chart, _ = two_node_chart
    with pytest.raises(helm.HelmError, match="nodes = 3 does not divide"):
        render(chart, {"nodes": 3})
    with pytest.raises(helm.HelmError, match="ports.http = 9000 is not the --port"):
        render(chart, {"ports": {"http": 9000}})
    with pytest.raises(helm.HelmError, match="gpu.count = 1 .* tp_size x pp_size = 4"):
        render(chart, {"gpu": {"count": 1}})


@pytest.mark.parametrize("start_timeout", [600, 1800])
def test_liveness_outlasts_the_supervisors_own_restart(example_chart, start_timeout):
    """Kubernetes restarts the pod only when the supervisor could not bring tritonserver back within its start
    timeout (a restart by the supervisor takes up to that long); the startup probe covers the first start."""
    pod = by_kind(render(example_chart, {"serve": {"startTimeoutSeconds": start_timeout}}))["Deployment"][0]
    serve = pod["spec"]["template"]["spec"]["containers"][0]
    live = serve["livenessProbe"]
    assert start_timeout < live["periodSeconds"] * live["failureThreshold"] <= start_timeout + 5 * live["periodSeconds"]
    assert f"--timeout={start_timeout}" in serve["args"]
