"""A target-only deployment (no [draft], drafter "lookup"), end to end on the tiny example's target.

The commands as a user runs them: convert, build and repo for the target alone (no draft checkpoint, engine or
Triton model is written), `generate --local`, the BLS drafting by prompt lookup on a real CPU tritonserver, and the
LLM API path (its NGram config, the stand-in); on every path the greedy text is K = 0's on held-out and
input-grounded prompts, and a drafter that needs a draft model is refused by name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from triton_helpers import serving

from specbuild.cli import main
from specbuild.config import load_spec
from specbuild.errors import ClientError

pytestmark = pytest.mark.slow


def _prompts() -> list[str]:
    """Held-out prompts (code, prose, JSON) and input-grounded ones, where the lookup finds its matches (their ends,
    within the example's max_input_len)."""
    from specbuild.bench.workloads import grounded
    from specbuild.corpus import heldout_prompts

    texts = [t for kind in ("code", "prose", "json") for t in heldout_prompts(kind, 1, chars=120)]
    return texts + [t[-360:] for t in grounded("edit", 1) + grounded("quote", 1)]


@pytest.fixture(scope="module")
def target_alone(tmp_path_factory, example_tiny) -> Path:
    """`init --target` on the example's target, with the example's small limits (its models know short windows)."""
    from specbuild.example import specfile

    root = tmp_path_factory.mktemp("target-only")
    overrides = specfile.example_overrides(example_tiny, "tiny")
    overrides.update(draft=None, name="alone")
    overrides["speculative"] = {**overrides["speculative"], "drafter": "lookup"}
    # the pool on, and two BLS instances: both share it (speculative.shared_pool)
    overrides.update(lookup={"is_public_pool": True}, serve={"bls_instance_count": 2})
    text = specfile.render_spec(overrides, header="a target alone")
    return specfile.write_spec(root / "specbuild.toml", text)


def _run(*args: str) -> dict:
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_engine_path_builds_and_serves_the_target_alone_and_drafts_by_lookup(target_alone):
    spec = load_spec(target_alone)
    assert spec.draft is None and spec.roles == ("target",)
    converted = _run("convert", "-c", str(target_alone))
    assert [r["role"] for r in converted["roles"]] == ["target"]
    built = _run("build", "-c", str(target_alone), "--backend", "reference")
    assert [e["role"] for e in built["engines"]] == ["target"]
    assert not (spec.pair_dir / "draft").exists()  # nothing written for a model the spec does not have
    repo = target_alone.parent / "triton_repo"
    written = _run("repo", "-c", str(target_alone), "--backend", "reference", "--out-dir", str(repo))
    assert "tensorrt_llm_draft" not in written["models"] and not (repo / "tensorrt_llm_draft").exists()
    bls_config = (repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    assert re.search(r'key: "tensorrt_llm_draft_model_name"\s+value \{\s+\}', bls_config)  # "" (protobuf omits it)
    assert (repo / "manifest.json").is_file() and json.loads((repo / "manifest.json").read_text())["settings"][
        "draft"
    ] is None

    # in-process: lookup (the deployment's drafter) gives K = 0's text; a draft model's drafters are refused
    from specbuild.decode.generation import Options
    from specbuild.errors import RequestError
    from specbuild.session.local import LocalSession

    with LocalSession.from_spec(spec, device="cpu", threads=1) as local:
        assert local.drafting.available == ("lookup",) and local.describe()["draft_engine_source"] is None
        prompts = _prompts()
        expected = {}
        proposals = 0
        for prompt in prompts:
            plain = local.generate(prompt, Options(max_tokens=24, num_draft_tokens=0, adaptive=False), text=False)
            expected[prompt] = plain.output_ids
            got = local.generate(prompt, Options(max_tokens=24, num_draft_tokens=4), text=False)
            assert got.output_ids == plain.output_ids and got.drafter == "lookup"
            proposals += got.stats.by_drafter.get("lookup", {}).get("proposals", 0)
        assert proposals > 0  # the grounded prompts give the lookup matches
        for name in ("model", "hybrid"):
            with pytest.raises(RequestError, match=f"drafter = '{name}'.*Use one of: lookup"):
                local.generate(prompts[0], Options(max_tokens=4, drafter=name))

    # served: the BLS proposes from lookup as draft_input_ids; the text is K = 0's
    from specbuild.speculative.shared_pool import SharedLookupPool, pool_path
    from specbuild.triton.client import SpecbuildClient

    with serving(repo, target_alone.parent / "server.log", clean=True) as server:
        with SpecbuildClient(server.grpc_url) as client:
            served_proposals = 0
            for prompt in prompts:
                final = list(client.generate(prompt, max_tokens=24, num_draft_tokens=4))[-1].stats
                assert final["output_ids"] == expected[prompt]
                figures = final["speculation_stats"]
                assert figures["drafter"] == "lookup"
                served_proposals += figures["by_drafter"].get("lookup", {}).get("proposals", 0)
            assert served_proposals > 0
            with pytest.raises(ClientError, match=re.escape("drafter = 'model'")):
                client.complete(prompts[0], max_tokens=4, drafter="model")
            assert client.is_ready()
        # one pool for both BLS instances, named after the server: every request's text is in it, whichever
        # instance served it
        path = pool_path("tensorrt_llm_bls", server.process.pid)
        assert path.exists(), sorted(p.name for p in path.parent.glob("specbuild-lookup-pool-*"))
        pool = SharedLookupPool(path, spec.lookup.pool_max_tokens)
        try:
            assert pool.figures()["added"] == len(prompts)
        finally:
            pool.close()
    assert not path.exists()  # the last instance to unload removed it


def test_the_llm_api_path_writes_an_ngram_config_and_no_draft_checkpoint(target_alone):
    spec = load_spec(target_alone)
    converted = _run("convert", "-c", str(target_alone), "--backend", "llmapi")
    assert [r["role"] for r in converted["roles"]] == ["target"]
    built = _run("build", "-c", str(target_alone), "--backend", "llmapi")
    config = built["llm_args"]["speculative_config"] if "llm_args" in built else None
    manifest = json.loads((spec.pair_dir / "llmapi" / "manifest.json").read_text())
    config = config or manifest["llm_args"]["speculative_config"]
    assert config["decoding_type"] == "NGram" and "speculative_model_dir" not in json.dumps(config)
    assert list(manifest["checkpoints"]) == ["target"]

    from specbuild import paths
    from specbuild.decode.generation import Options

    with paths.for_backend("llmapi").local_session(spec) as local:
        for prompt in _prompts()[3:]:
            plain = local.generate(prompt, Options(max_tokens=16, num_draft_tokens=0), text=False)
            got = local.generate(prompt, Options(max_tokens=16), text=False)
            assert got.output_ids == plain.output_ids and got.drafter == "lookup"


def test_the_chart_carries_a_target_only_spec_that_the_pods_load_as_such(target_alone, tmp_path):
    """`deploy`'s chart holds the spec the pods read: still without [draft] (no placeholder draft to load), with the
    drafter and the [lookup] table."""
    import tomllib
    import yaml

    from specbuild.config import spec_from_dict
    from specbuild.deploy.chart import plan_chart, write_chart

    write_chart(plan_chart(load_spec(target_alone), tmp_path / "chart", backend="reference"))
    values = yaml.safe_load((tmp_path / "chart" / "values.yaml").read_text())
    raw = tomllib.loads(values["spec"])
    assert "draft" not in raw and raw["speculative"]["drafter"] == "lookup" and "lookup" in raw
    spec = spec_from_dict(raw, base_dir=Path("/work"))
    assert spec.draft is None and str(spec.target.checkpoint).startswith("/models/")
