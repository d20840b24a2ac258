"""The docs cannot rot: every command the README and the getting-started page show runs, in order, on the example
checkpoint shipped in `examples/` (the Hub push against the local stand-in of the Hub), and the README stays short.
(The site itself is built by .ci/run: `mkdocs build --strict`.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from hub_standin import Hub
from test_verl_and_hub import hub_env
from unshard_forks import run_unshard

PAGES = ["README.md", "docs/getting-started.md"]
# What a shown command may be besides unshard's own: setting the venv up and running the tests, which CI does itself
# (.ci/run runs the same steps on a fresh clone)
SETUP = (
    "python3 -m venv ",
    ".venv/bin/pip install ",
    "DS_BUILD_OPS=0 .venv/bin/pip install ",
    ".venv/bin/python -m pytest",
)


def shown_commands(page: Path) -> list[str]:
    """The commands of the page's bash blocks, one a line, split at `&&`, comments and blank lines left out."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)
    return [
        part.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
        for part in line.split("&&")
    ]


@pytest.mark.parametrize("page", PAGES)
def test_every_command_shown_runs(page, tmp_path):
    commands = shown_commands(ROOT / page)
    ours = [c.removeprefix(".venv/bin/") for c in commands if c.removeprefix(".venv/bin/").startswith("unshard ")]
    assert len(ours) >= 5, ours
    assert all(c.startswith(SETUP) for c in commands if c.removeprefix(".venv/bin/") not in ours), commands
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "tmp").mkdir()
    with Hub() as hub:
        # (run elsewhere than the checkout: a PYTHONPATH relative to it is made absolute)
        path = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**hub_env(hub, tmp_path), "PYTHONPATH": os.pathsep.join(path)}
        for command in ours:
            # (nothing written outside the test's folder)
            words = [w.replace("/tmp/", f"{tmp_path / 'tmp'}/") for w in shlex.split(command)]
            done = run_unshard(*words[1:], cwd=tmp_path, env=env)
            assert done.returncode == 0, (command, done.stderr[-2000:])
        pushed = [c for c in ours if "--push-to-hub" in c]
        for command in pushed:
            repo = shlex.split(command)[shlex.split(command).index("--push-to-hub") + 1]
            assert "model.safetensors" in hub.files(repo), repo


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
