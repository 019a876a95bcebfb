"""Several machines, on loopback: the command docs/training.md gives for each machine ("Train on several machines"),
run as two torchrun agents of one node each on 127.0.0.1, trains as the standalone job of two processes does."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.train.test_distributed import ARGS, TORCHRUN, check_same_curves, torchrun

DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def documented_command() -> str:
    """The per-machine command of the docs' section, its line continuations joined."""
    section = DOC.read_text().split("## Train on several machines", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    command = re.sub(r"\\\n\s*", "", block).splitlines()
    return next(line for line in command if line.startswith("torchrun --nnodes"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_documented_command_for_each_machine_names_a_rendezvous_and_a_shared_run_folder():
    command = documented_command()
    for part in ("--nnodes 2", "--rdzv-backend c10d", "--rdzv-endpoint HOST:29400", "--rdzv-id", "--max-restarts",
                 "-m vitlab train", "--data /shared/", "--out /shared/runs/", "--resume auto"):
        assert part in command, part


@pytest.mark.slow
def test_two_machines_on_loopback_train_as_one_standalone_job(tmp_path):
    port = free_port()
    words = shlex.split(documented_command().replace("HOST:29400", f"127.0.0.1:{port}"))
    words[0] = TORCHRUN
    words[words.index("--nproc-per-node") + 1] = "1"  # one process per "machine": two in all, as standalone
    words[words.index("--out") + 1] = str(tmp_path / "nodes")
    data = words.index("--data")
    del words[data:data + 2]  # the embedded digits, as the standalone job trains on
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [subprocess.Popen([*words, *ARGS], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    try:
        ended = [agent.communicate(timeout=600) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    for agent, (_, stderr) in zip(agents, ended, strict=True):
        assert agent.returncode == 0, stderr[-3000:]
    torchrun(tmp_path / "standalone")
    check_same_curves(tmp_path / "nodes", tmp_path / "standalone")
    nodes, standalone = load_file(tmp_path / "nodes" / "model.safetensors"), load_file(
        tmp_path / "standalone" / "model.safetensors")
    for name, tensor in standalone.items():
        torch.testing.assert_close(nodes[name], tensor, rtol=1e-5, atol=1.5e-5)
