"""`bench --workload json-schema` (bench.guided): its prompts are held-out records followed by the schema of the
record the held-out text goes on with; validity is judged by jsonschema; a run reports the four cells' figures,
with the guided outputs at K equal to those at K = 0 (read from the runs, not assumed). Speeds are printed by the
bench, never compared here."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specbuild.bench import guided
from specbuild.cli import main


def test_each_prompt_is_whole_records_then_the_schema_of_the_next():
    from specbuild.corpus import heldout_prompts

    def whole(line):
        try:
            return json.loads(line).get("type") in guided.SCHEMAS
        except ValueError:
            return False

    records = [line for text in heldout_prompts("json", 100) for line in text.splitlines() if whole(line)]
    for prompt in guided.prompts(6):
        lines = prompt.text.splitlines()
        assert len(lines) == 2 and all(json.loads(line)["type"] in guided.SCHEMAS for line in lines)
        assert all(guided.validates(line, guided.SCHEMAS[json.loads(line)["type"]]) for line in lines)
        at = records.index(lines[1])
        assert records[at - 1] == lines[0]
        assert json.loads(records[at + 1])["type"] == prompt.kind  # the guide: the held-out record that comes next


def test_validity_is_the_schemas_judgement():
    schema = guided.SCHEMAS["log"]
    record = {"id": 1, "type": "log", "level": "INFO", "logger": "a", "message": "m", "line": 3}
    assert guided.validates(" " + json.dumps(record) + "\n", schema)
    assert not guided.validates(json.dumps({**record, "line": "3"}), schema)
    assert not guided.validates(json.dumps(record)[:-1], schema)  # cut before it closes
    assert not guided.validates(json.dumps({**record, "type": "user"}), schema)


def test_a_run_reports_every_cell_and_the_guided_text_equals_k0(tiny_spec_path):
    from specbuild.config import load_spec
    from specbuild.session.local import LocalSession

    with LocalSession.from_spec(load_spec(tiny_spec_path), device="cpu", threads=1) as session:
        doc = guided.run(session, [0, 2], n_prompts=2, rounds=1, max_tokens=16)
    assert set(doc["tokens_per_s"]) == {"unguided_k0", "unguided_k2", "guided_k0", "guided_k2"}
    assert all(rate > 0 for rate in doc["tokens_per_s"].values())
    assert doc["guided_outputs"] == 4 and 0 <= doc["guided_valid"] <= 4
    (row,) = doc["per_k"]
    assert row["k"] == 2 and row["guided_same_tokens_as_k0"] is True
    assert row["speedup_ratio"] == pytest.approx(row["guided_speedup"] / row["unguided_speedup"], rel=1e-3)
    assert "guided outputs valid against their schema" in guided.table(doc)


def test_the_cli_runs_it_and_wants_a_k_above_zero(tiny_spec_path):
    args = ["bench", "--local", "-c", str(tiny_spec_path), "--workload", "json-schema", "--requests", "1"]
    result = CliRunner().invoke(main, [*args, "--num-draft-tokens", "0,2", "--max-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["workload"] == "json-schema" and document["mode"] == "local" and document["prompts"] == 1
    result = CliRunner().invoke(main, [*args, "--num-draft-tokens", "0"])
    assert result.exit_code == 1 and "give a K > 0" in result.output
