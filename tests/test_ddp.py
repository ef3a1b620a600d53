"""DistributedDataParallel (and FSDP2) training with ortlite: 2 real processes on gloo (127.0.0.1), each
model trained by eager DDP and by ortlite DDP from the same weights, data and seeds; the
losses must agree step by step and ortlite's sessions must have run the forward and the
backward. The wrap orders are docs/training.md's recipes; the processes are started,
bounded in time and stopped here."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
import torch.multiprocessing

from conftest import free_port

STEPS = 3
WIDTH = 512  # the MLPs' 1 MiB middle layer fills DDP's first gradient bucket: DDPOptimizer
# splits their graphs there (and compiles each part with fake example inputs)
DEADLINE_S = 240  # the whole spawn, both processes (about 60 s on an idle 2-core machine)

# one worker runs this file's tests (pytest-xdist, --dist loadgroup): they share its module fixtures
pytestmark = pytest.mark.xdist_group("ddp")


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.mid, self.down = torch.nn.Linear(16, WIDTH), torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, 4)

    def forward(self, x):
        return self.down(torch.relu(self.mid(torch.nn.functional.gelu(self.up(x)))))


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3), torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def _gpt2():
    import transformers

    # dropout on (0.1 everywhere): the masks are torch's draws, as in eager (Options.random)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64))
    model.loss_type = "ForCausalLM"  # (unset, transformers logs a warning in forward: a graph break)
    return model


# name -> (model factory, wrap order, batch of a step)
CASES = {
    "mlp": (MLP, "compile(DDP)", lambda g: torch.randn(8, 16, generator=g)),
    "sequential": (
        lambda: torch.nn.Sequential(torch.nn.Linear(16, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 4)),
        "DDP(compile)",
        lambda g: torch.randn(8, 16, generator=g),
    ),
    "batchnorm_cnn": (CNN, "compile(DDP)", lambda g: torch.randn(4, 3, 12, 12, generator=g)),
    "gpt2": (_gpt2, "compile(DDP)", lambda g: torch.randint(0, 256, (2, 24), generator=g)),
    # FSDP2: each block sharded and compiled (block.compile: its forward is the test's code)
    "fsdp2_blocks": (MLP, "fully_shard", lambda g: torch.randn(8, 16, generator=g)),
    # last: DDP built under optimize_ddp="python_reducer" changes Dynamo's trace rules for good
    "sequential_python_reducer": (
        lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)),
        "compile(DDP)",
        lambda g: torch.randn(8, 16, generator=g),
    ),
}


def _loss(model, batch):
    if batch.dtype == torch.long:
        return model(input_ids=batch, labels=batch).loss
    return model(batch).square().mean()


def _train(name, rank, backend):
    import ortlite  # noqa: F401  (registers the backend)

    DDP = torch.nn.parallel.DistributedDataParallel
    make, order, batch_of = CASES[name]
    torch.manual_seed(0)
    model = make().train()
    if order == "fully_shard":
        from torch.distributed.fsdp import fully_shard

        model = torch.nn.Sequential(*(Residual() for _ in range(2)), MLP())
        for block in model:
            fully_shard(block)
            if backend is not None:
                block.compile(backend=backend)
        wrapped = fully_shard(model)
    elif backend is None:
        wrapped = DDP(model)
    elif order == "DDP(compile)":
        wrapped = DDP(torch.compile(model, backend=backend))
    else:
        wrapped = torch.compile(DDP(model), backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for step in range(STEPS):
        batch = batch_of(data)
        torch.manual_seed(10 * step + rank)  # dropout's draws: the same for eager and ortlite
        loss = _loss(wrapped, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    state = [getattr(t, "full_tensor", t.detach)().detach().clone() for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    return losses, state


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    import torch.distributed as dist

    import ortlite

    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = {}
    try:
        for name in CASES:
            torch._dynamo.reset()
            if name.endswith("python_reducer"):
                torch._dynamo.config.optimize_ddp = "python_reducer"
            eager_losses, eager_state = _train(name, rank, None)
            backend = ortlite.Backend()
            losses, state = _train(name, rank, backend)
            reports = backend.graph_reports
            results[name] = {
                "eager": eager_losses,
                "ortlite": losses,
                "state_difference": max((a - b).abs().max().item() for a, b in zip(state, eager_state)),
                "ran": sorted({r.name.split("_")[0] for r in reports if r.sessions}),
                "runs": backend.stats.runs,
                "graphs": backend.stats.graphs,
            }
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("ddp"))
    context = torch.multiprocessing.start_processes(_worker, args=(free_port(), out_dir), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the 2 DDP processes did not finish in {DEADLINE_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(5)
    return [json.load(open(os.path.join(out_dir, f"rank{rank}.json"))) for rank in range(2)]


@pytest.mark.parametrize("name", list(CASES))
def test_ddp_training_matches_eager_ddp(ddp_results, name):
    for rank, results in enumerate(ddp_results):
        result = results[name]
        torch.testing.assert_close(result["ortlite"], result["eager"], rtol=1e-4, atol=1e-5, msg=lambda m: f"rank {rank} losses: {m}")
        # the same weights (and BatchNorm statistics) after the steps: gradients were averaged as eager's
        assert result["state_difference"] < 1e-4, (rank, result["state_difference"])
        assert result["ran"] == ["backward", "forward"], (rank, result)
        assert result["runs"] >= 2 * STEPS, (rank, result)
        if name in ("mlp", "sequential"):  # split at the bucket: two forward and two backward graphs
            assert result["graphs"] == 4, (rank, result)
        if name == "fsdp2_blocks":  # each of the 3 blocks compiled: a forward and a backward graph
            assert result["graphs"] == 6, (rank, result)
    # different data per rank, one model: DDP's averaging makes the weights equal
    assert ddp_results[0][name]["eager"] != ddp_results[1][name]["eager"]
