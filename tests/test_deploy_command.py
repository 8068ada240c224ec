"""`specbuild deploy` as a command: --dry-run writes nothing, --json is one document, and it never replaces a folder
it did not write (nor its own chart once edited); --force replaces its own chart written from other inputs."""

from __future__ import annotations

import json

from deploy_support import deploy, write_spec


def test_dry_run_lists_the_files_and_writes_nothing(tmp_path):
    spec = write_spec(tmp_path)
    result = deploy("-c", str(spec), "--out-dir", str(tmp_path / "chart"), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "Chart.yaml" in result.output and "templates/deployment.yaml" in result.output
    assert not (tmp_path / "chart").exists()
    document = json.loads(deploy("-c", str(spec), "--out-dir", str(tmp_path / "chart"), "--dry-run", "--json").output)
    assert document["dry_run"] is True and "values.yaml" in document["files"]
    assert document["facts"]["serve_command"][:2] == ["specbuild", "serve"]
    assert not (tmp_path / "chart").exists()


def test_default_folder_json_and_up_to_date(tmp_path, monkeypatch):
    spec = write_spec(tmp_path)
    monkeypatch.chdir(tmp_path)
    first = json.loads(deploy("-c", str(spec), "--json").output)
    assert first["skipped"] is False and first["out_dir"] == str((tmp_path / "chart" / "pair-7b").resolve())
    assert (tmp_path / "chart" / "pair-7b" / "values.schema.json").is_file()
    again = deploy("-c", str(spec))
    assert again.exit_code == 0 and "up to date" in again.output


def test_a_folder_it_did_not_write_is_never_replaced(tmp_path):
    spec = write_spec(tmp_path)
    theirs = tmp_path / "chart"
    theirs.mkdir()
    (theirs / "Chart.yaml").write_text("name: theirs\n")
    for extra in ([], ["--force"]):
        result = deploy("-c", str(spec), "--out-dir", str(theirs), *extra)
        assert result.exit_code == 1 and "was not written by specbuild" in result.output
    assert (theirs / "Chart.yaml").read_text() == "name: theirs\n"


def test_its_own_chart_is_replaced_only_with_force_and_never_once_edited(tmp_path):
    spec = write_spec(tmp_path)
    out = tmp_path / "chart"
    assert deploy("-c", str(spec), "--out-dir", str(out)).exit_code == 0
    changed = write_spec(tmp_path, build={"max_batch_size": 8})
    refused = deploy("-c", str(changed), "--out-dir", str(out))
    assert refused.exit_code == 1 and "--force" in refused.output
    assert deploy("-c", str(changed), "--out-dir", str(out), "--force").exit_code == 0
    assert "max_batch_size = 8" in (out / "values.yaml").read_text()
    (out / "values.yaml").write_text((out / "values.yaml").read_text().replace("replicas: 1", "replicas: 3"))
    edited = deploy("-c", str(spec), "--out-dir", str(out), "--force")
    assert edited.exit_code == 1 and "values.yaml changed since" in edited.output
    assert "replicas: 3" in (out / "values.yaml").read_text()


def test_nodes_above_one_need_the_llm_api_path(tmp_path):
    spec = write_spec(tmp_path, build={"tp_size": 2}, gpu={"count": 2})
    result = deploy("-c", str(spec), "--nodes", "2", "--json")
    assert result.exit_code == 1 and "only the LLM API path (--backend llmapi) spans nodes" in result.output


def test_the_signal_benchmark_reads_a_metric_of_one_model_from_triton_text():
    from specbuild.deploy.signal import _value

    text = "\n".join(
        [
            "# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds",
            'nv_inference_queue_duration_us{model="tensorrt_llm_bls",version="1"} 1500',
            'nv_inference_queue_duration_us{model="tensorrt_llm",version="1"} 900',
            'specbuild_bls_queue_depth{model="tensorrt_llm_bls",version="1"} 3',
            'specbuild_bls_queue_depth_other{model="tensorrt_llm_bls",version="1"} 7',
        ]
    )
    assert _value(text, "nv_inference_queue_duration_us", "tensorrt_llm_bls") == 1500
    assert _value(text, "nv_inference_queue_duration_us") == 2400
    assert _value(text, "specbuild_bls_queue_depth") == 3  # not the metric whose name it begins
    assert _value(text, "absent_metric") == 0
