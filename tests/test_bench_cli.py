"""`specbuild bench` command line: usage errors, bad inputs, --dry-run (no model is loaded)."""

import json

import pytest
from click.testing import CliRunner

from specbuild.cli import main

SPEC = """
name = "cli-pair"
[target]
checkpoint = "target"
[draft]
checkpoint = "draft"
[speculative]
max_draft_len = 4
num_draft_tokens = 2
"""


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "specbuild.toml"
    path.write_text(SPEC)
    return path


def bench(*args):
    return CliRunner().invoke(main, ["bench", *map(str, args)])


def test_url_and_local_together_is_a_usage_error(spec_file):
    r = bench("-c", spec_file, "--local", "--url", "http://x:8000")
    assert r.exit_code == 2 and "pass either --url or --local, not both" in r.output


def test_vs_hf_needs_local(spec_file):
    r = bench("-c", spec_file, "--vs-hf")
    assert r.exit_code == 2 and "--vs-hf runs Hugging Face in-process" in r.output
    r = bench("-c", spec_file, "--local", "--vs-hf", "--temperature", "0.7")
    assert r.exit_code == 2 and "--vs-hf compares greedy decoding" in r.output


def test_overlap_shows_in_the_plan_local_or_served(spec_file):
    r = bench("-c", spec_file, "--overlap", "compare", "--dry-run", "--json")
    assert (
        r.exit_code == 0 and json.loads(r.stdout)["overlap"] == "compare" and json.loads(r.stdout)["mode"] == "triton"
    )
    r = bench("-c", spec_file, "--local", "--overlap", "compare", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["overlap"] == "compare"
    assert bench("-c", spec_file, "--local", "--overlap", "sometimes", "--dry-run").exit_code == 2


def test_bad_k_list_is_a_usage_error(spec_file):
    r = bench("-c", spec_file, "--local", "--num-draft-tokens", "0,two", "--dry-run")
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        "Error: --num-draft-tokens: 'two' in '0,two' is not an integer "
        ">= 0. Pass a comma-separated list such as 0,1,2,4."
    )
    r = bench("-c", spec_file, "--local", "--concurrency", "0", "--dry-run")
    assert r.exit_code == 2 and "--concurrency: '0' in '0' is not an integer >= 1" in r.output


def test_missing_spec_is_an_error(tmp_path):
    r = bench("-c", tmp_path / "nope.toml", "--local")
    assert r.exit_code == 1 and "Error: spec file" in r.output


def test_dry_run_prints_the_plan_as_json(spec_file, tmp_path):
    r = bench(
        "-c",
        spec_file,
        "--num-draft-tokens",
        "auto",
        "--concurrency",
        "1,4",
        "--plot",
        tmp_path / "p",
        "--dry-run",
        "--json",
    )
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["mode"] == "triton" and plan["url"] == "127.0.0.1:8000" and plan["num_draft_tokens"] == "auto"
    assert plan["concurrency"] == [1, 4]
    assert [p.rsplit("/", 1)[1] for p in plan["files"]] == [
        "speedup_vs_k.png",
        "acceptance_by_position.png",
        "throughput_vs_concurrency.png",
    ]
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "has no prompts"),
        ("not json\n", ":1: not valid JSON"),
        ('{"prompt": "ok"}\n{"text": "x"}\n', ':2: expected an object with a non-empty "prompt" string'),
        ('{"prompt": "ok", "max_tokens": 0}\n', ":1: max_tokens = 0 must be a positive integer"),
    ],
)
def test_bad_workload_file_is_an_error(spec_file, tmp_path, content, message):
    path = tmp_path / "w.jsonl"
    path.write_text(content)
    r = bench("-c", spec_file, "--local", "--workload", path)
    assert r.exit_code == 1 and message in r.output and r.output.startswith("Error: ")
    assert "Traceback" not in r.output


def test_missing_workload_file_and_unknown_name(spec_file, tmp_path):
    r = bench("-c", spec_file, "--local", "--workload", tmp_path / "gone.jsonl")
    assert r.exit_code == 1 and "workload file" in r.output and "not found" in r.output
    r = bench("-c", spec_file, "--local", "--workload", "poetry")
    assert r.exit_code == 1 and "unknown workload 'poetry'" in r.output


def test_workload_file_prompts_are_cycled(tmp_path):
    from specbuild.bench import workloads

    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b", "max_tokens": 5}\n')
    w = workloads.load(str(path), 3)
    assert w.name == "w.jsonl"
    assert [(p.text, p.max_tokens) for p in w.prompts] == [("a", None), ("b", 5), ("a", None)]


def test_builtin_workloads_differ():
    from specbuild.bench import workloads

    sets = {kind: workloads.load(kind, 2).prompts for kind in ("code", "prose", "json")}
    assert all(len(p) == 2 and all(x.text.strip() for x in p) for p in sets.values())
    assert sets["json"][0].text.lstrip().startswith("{")
    assert len({p[0].text for p in sets.values()}) == 3


def test_timed_and_predict_are_checked_before_anything_loads(spec_file, monkeypatch):
    from specbuild.reference.timing import TIMING_ENV

    monkeypatch.setenv(TIMING_ENV, "")
    r = bench("-c", spec_file, "--local", "--timed", "gpu=H9000")
    assert r.exit_code == 2 and "unknown GPU 'H9000': known GPUs are H100-80GB" in r.output
    r = bench("-c", spec_file, "--local", "--predict", "fast")
    assert r.exit_code == 2 and "timed stand-in 'fast': give the time per step" in r.output
    r = bench("-c", spec_file, "--local", "--dry-run", "--json", "--timed", "5ms", "--predict", "gpu=L4")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["timed"] == "5ms" and json.loads(r.stdout)["predict"] == "gpu=L4"
