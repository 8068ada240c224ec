"""The demo shows text. Every demo prompt of `specbuild up`, run on the committed example pair with the
demo spec's K, gives visible, varied output (its most frequent token under 40 % of it: the bench's
degeneracy measure), with speculation at work; and the commands `up` prints at the end of the demo
run from the folder `make demo` runs in."""

from __future__ import annotations

import shlex
import sys

import pytest
from click.testing import CliRunner
from runtime_models import single_thread  # noqa: F401 (autouse fixture: one torch thread)

from specbuild.bench.stats import top_token_share
from specbuild.cli import main
from specbuild.example.demo import DEMO_MAX_TOKENS, DEMO_PROMPTS, MAX_TOP_TOKEN_SHARE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory, example_cache_dir):
    """A folder laid out like the repository root after `make demo`'s init step."""
    root = tmp_path_factory.mktemp("repo")
    result = CliRunner().invoke(main, ["init", "--example", "--out", str(root / ".demo" / "specbuild.toml")])
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def demo_outputs(demo_root):
    from specbuild.config import load_spec
    from specbuild.decode.generation import Options
    from specbuild.session.local import LocalSession

    session = LocalSession.from_spec(load_spec(demo_root / ".demo" / "specbuild.toml"), threads=1)
    return {
        kind: session.generate(prompt, Options(max_tokens=DEMO_MAX_TOKENS)).to_dict() for kind, prompt in DEMO_PROMPTS
    }


def test_the_demo_has_one_prompt_per_workload():
    assert [kind for kind, _ in DEMO_PROMPTS] == ["code", "json", "prose"]


@pytest.mark.parametrize("kind", ["code", "json", "prose"])
def test_each_demo_prompt_gives_varied_visible_text(demo_outputs, kind):
    doc = demo_outputs[kind]
    share = top_token_share(doc["output_ids"])
    assert doc["num_output_tokens"] >= DEMO_MAX_TOKENS // 2, doc["text"]
    assert share < MAX_TOP_TOKEN_SHARE, f"{kind}: one token is {share:.0%} of {doc['text']!r}"
    visible = "".join(doc["text"].split())
    assert len(visible) >= 40 and len(set(visible)) >= 10, doc["text"]
    assert doc["num_draft_tokens"] > 0 and doc["drafted"] > 0 and doc["accepted"] > 0  # speculation at work


def test_the_next_commands_work_from_the_repository_root(demo_root, monkeypatch):
    from specbuild.cli.up_cmd import next_steps
    from specbuild.config import load_spec
    from specbuild.session.served import server_url

    bin_dir = demo_root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "activate").write_text("")
    monkeypatch.chdir(demo_root)
    monkeypatch.setattr(sys, "argv", [".venv/bin/specbuild", "up"])
    spec = load_spec(".demo/specbuild.toml")
    lines = next_steps(spec, server_url(spec, "grpc"), serving=False)
    assert lines[1] == "next (from this folder):"
    commands = [shlex.split(line.split("  #")[0]) for line in lines[2:]]
    assert commands[0] == ["source", ".venv/bin/activate"]
    assert all(c[0] == ".venv/bin/specbuild" and c[2:4] == ["-c", ".demo/specbuild.toml"] for c in commands[1:])
    by_name = {c[1]: c[1:] for c in commands[1:] if "--local" in c or c[1] == "check"}
    assert sorted(by_name) == ["bench", "check", "generate"]
    for name in ("generate", "check"):  # bench takes minutes; its -c/--local parse like the others
        result = CliRunner().invoke(main, [*by_name[name], *(["--max-tokens", "8"] if name == "generate" else [])])
        assert result.exit_code == 0, (name, result.output)
