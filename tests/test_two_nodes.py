"""Two nodes on one machine: the Accelerate config ``asrfit plan --nodes 2 --export accelerate``
writes, read with accelerate's own loader, launches two torchrun nodes (static rendezvous on
localhost, gloo) that train two steps; the gradients show the plan's effective batch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _frames import FrameModel
from _two_node_worker import LR, STEPS, data, mean_loss
from click.testing import CliRunner

from asrfit.cli.main import cli
from asrfit.testing import write_manifest

WORKER = Path(__file__).resolve().parent / "_two_node_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, dict]:
    """The plan (JSON) and the Accelerate config asrfit writes for 2 nodes x 1 GPU."""
    import json

    root = tmp_path_factory.mktemp("two-nodes")
    manifest = root / "train.jsonl"
    rows = [{"audio_filepath": f"a{i}.wav", "duration": 1.0 + (i % 7) * 0.4, "text": "hello world"}
            for i in range(40)]  # fmt: skip
    write_manifest(manifest, rows)
    args = ["plan", "--model", "conformer-ctc-tiny", "--data", str(manifest), "--gpu", "L4",
            "--nodes", "2", "--gpus-per-node", "1", "--target-batch", "8",
            "--out", str(root / "plan.json"), "--export", "accelerate"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (root / "accelerate.yaml").write_text(result.stdout)
    return root, json.loads((root / "plan.json").read_text())


@pytest.mark.slow
def test_two_torchrun_nodes_from_the_exported_accelerate_config(exported) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    from asrfit.plan.plan import Plan

    root, _ = exported
    config = load_config_from_file(str(root / "accelerate.yaml"))
    plan = Plan.load(root / "plan.json")
    assert (config.num_machines, config.num_processes, config.rdzv_backend) == (2, 2, "static")
    per_node = config.num_processes // config.num_machines
    batch = plan.min_batch_size  # the export's fixed batch per process (its header says so)
    accumulation = plan.fixed_batch_accumulation_steps(batch)
    out = root / "run"
    out.mkdir()
    # the config's main_process_ip is empty (each user fills it in) and its port fixed: on one
    # shared machine, localhost and a free port
    port = str(_free_port())
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(config.num_machines),
                "--nproc-per-node",
                str(per_node),
                "--node-rank",
                str(rank),
                "--rdzv-backend",
                config.rdzv_backend,
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                str(WORKER),
                str(out),
                str(batch),
                str(accumulation),
            ],  # fmt: skip
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(config.num_machines)
    ]
    try:
        logs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(logs)
    # one process on each node, two nodes: ranks 0 and 1 of a world of 2
    infos = sorted((out / f"rank{r}.txt").read_text().split() for r in range(2))
    assert infos == [["0", "2", "1", "0"], ["1", "2", "1", "1"]]

    # the effective batch: what one optimizer step averages over, in the plan's numbers
    effective = batch * accumulation * config.num_processes
    assert effective == round(plan.effective_batch_utterances) == 8
    # reference, in this process: rank 0's initial weights, each step on the mean loss of the
    # step's `effective` utterances at once
    x, y = data(effective * STEPS)
    torch.manual_seed(0)
    reference = FrameModel()
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    grads = [torch.load(out / f"grads{r}.pt", weights_only=True) for r in range(2)]
    for step in range(STEPS):
        part = slice(step * effective, (step + 1) * effective)
        mean_loss(reference, x[part], y[part]).backward()
        if step == 0:
            for name, p in reference.named_parameters():
                for rank_grads in grads:  # both nodes hold the all-reduced mean
                    torch.testing.assert_close(rank_grads[name], p.grad, rtol=1e-5, atol=1e-7)
            first = {n: p.grad.clone() for n, p in reference.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    weights = [torch.load(out / f"weights{r}.pt", weights_only=True) for r in range(2)]
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(weights[0][name], value, rtol=1e-5, atol=1e-7)
        assert torch.equal(weights[0][name], weights[1][name])
    # negative control: one node's batch alone gives other gradients
    torch.manual_seed(0)
    alone = FrameModel()
    mean_loss(alone, x[:batch], y[:batch]).backward()
    assert not torch.allclose(alone.head.weight.grad, first["head.weight"], rtol=1e-3)
