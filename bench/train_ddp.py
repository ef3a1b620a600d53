"""DistributedDataParallel training step: eager DDP, inductor DDP and ortlite DDP (dropout's
mask drawn by torch, Options.random="torch", and drawn in ONNX Runtime, "onnxruntime"),
2 processes x 1 thread on gloo (127.0.0.1), plus eager and ortlite in one process alone (no
DDP, rank 0 while rank 1 waits), and both in 2 processes with no DDP (each rank its own
model at once, no all-reduce), and one all-reduce of as many bytes as the model's gradients:
what DDP itself costs on this machine, what two processes computing at once cost before any
communication, and what the communication costs alone, beside what ortlite's DDP costs over
ortlite alone.

    python bench/train_ddp.py [--models mlp,resnet18,gpt2] [--rounds 5] [--steps 4]

Per model, every variant trains its own copy of the same weights on the same batches, the
same seeds per step (dropout's draws for eager, inductor and ortlite's "torch": eager's);
`DDP(torch.compile(model))`, the default optimize_ddp (DDPOptimizer); "ortlite one bucket":
optimize_ddp=False (one forward and one backward graph), bucket_cap_mb=1024 (one all-reduce a
step), gradient_as_bucket_view=True: the fewest collectives and copies DDP allows, the layout
for a machine where communication cannot overlap the backward anyway. Step time: medians over interleaved rounds of `--steps` steps
each (forward, backward with its all-reduce, SGD step), rank 0's clock; the first round of
each variant (compiles) is not timed. Graphs/step: ONNX Runtime session runs per step for
ortlite, Dynamo graphs for inductor. Loss difference: the relative difference of a step's
loss from eager DDP's, at the first step (the same weights: rounding alone) and the largest over
all steps (ONNX Runtime's own draws differ by design). Training a model on random labels
amplifies rounding from step to step: bench/loss_drift.py shows eager itself, started from
weights one rounding apart, as far from eager as any compiler.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import types

import torch
import torch.distributed as dist
import torch.multiprocessing

VARIANTS = [
    "eager", "inductor", "ortlite", "ortlite random=onnxruntime", "ortlite one bucket",
    "eager 1 process", "ortlite 1 process", "eager 2 processes, no DDP", "ortlite 2 processes, no DDP",
]
ALONE = ("eager 1 process", "ortlite 1 process")  # (rank 0 alone)
NO_DDP = ALONE + ("eager 2 processes, no DDP", "ortlite 2 processes, no DDP")  # (each rank its own model, no all-reduce)


class MLP(torch.nn.Module):
    def __init__(self, width=512):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(4))
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return self.head(x)


class Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(torch.nn.Module):
    """torchvision's resnet18 layout (BasicBlock x [2, 2, 2, 2], 64..512 wide)."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
        widths, blocks, cin = [64, 128, 256, 512], [], 64
        for i, w in enumerate(widths):
            blocks += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
            cin = w
        self.blocks = torch.nn.Sequential(*blocks)
        self.fc = torch.nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def _gpt2():
    import transformers

    config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=2048, n_positions=128)  # dropout 0.1
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # (unset, transformers logs a warning in forward: a graph break)
    return model


MODELS = {
    "mlp": (MLP, lambda g: (torch.randn(32, 512, generator=g), torch.randint(0, 10, (32,), generator=g))),
    "resnet18": (ResNet18, lambda g: (torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))),
    "gpt2": (_gpt2, lambda g: (torch.randint(0, 2048, (4, 64), generator=g), None)),
}


def _loss(model, x, y):
    if y is None:
        return model(input_ids=x, labels=x).loss
    return torch.nn.functional.cross_entropy(model(x), y)


def own_forward(model, tag):
    """model with a forward whose code object is its own: Dynamo keeps compiled code per
    code object, and the variants, interleaved, must not find each other's (a DDP variant
    otherwise ran code another backend compiled)."""
    cls, f = type(model), type(model).forward
    forward = types.FunctionType(f.__code__.replace(co_name=f"{f.__name__}_{tag}"), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    forward.__kwdefaults__ = f.__kwdefaults__
    model.__class__ = type(cls.__name__, (cls,), {"forward": forward})
    return model


class Trainer:
    def __init__(self, name, variant, rank):
        import ortlite

        make, self.batch_of = MODELS[name]
        torch.manual_seed(0)
        self.model = own_forward(make().train(), VARIANTS.index(variant))
        self.rank, self.variant, self.step_index, self.losses = rank, variant, 0, []
        self.backend = None
        if variant.startswith("ortlite"):
            self.backend = ortlite.Backend({"random": "onnxruntime"} if "onnxruntime" in variant else None)
        if variant in NO_DDP:
            self.fn = torch.compile(self.model, backend=self.backend) if self.backend else self.model
        elif variant == "eager":
            self.fn = torch.nn.parallel.DistributedDataParallel(self.model)
        elif variant == "ortlite one bucket":  # one graph each way, one all-reduce a step, no copies into buckets
            self.fn = torch.nn.parallel.DistributedDataParallel(torch.compile(self.model, backend=self.backend), bucket_cap_mb=1024, gradient_as_bucket_view=True)
        else:
            self.fn = torch.nn.parallel.DistributedDataParallel(torch.compile(self.model, backend=self.backend or "inductor"))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def steps(self, n):
        with torch._dynamo.config.patch(optimize_ddp=self.variant != "ortlite one bucket"):
            self._steps(n)

    def _steps(self, n):
        for _ in range(n):
            x, y = self.batch_of(torch.Generator().manual_seed(1000 * self.step_index + self.rank))
            torch.manual_seed(self.step_index)
            loss = _loss(self.fn, x, y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.losses.append(loss.item())
            self.step_index += 1

    def graphs_per_step(self):
        if self.backend is not None:
            return self.backend.stats.runs / max(self.step_index, 1)
        return None


def _worker(rank, port, args, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rows = []
    for name in args.models.split(","):
        torch._dynamo.reset()
        trainers, times = {}, {v: [] for v in VARIANTS}
        for variant in VARIANTS:
            graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            if variant not in ALONE or rank == 0:
                trainers[variant] = Trainer(name, variant, rank)
                trainers[variant].steps(args.steps)  # compiles; not timed
            if variant in trainers:
                trainers[variant].dynamo_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before
            dist.barrier()
        for _ in range(args.rounds):
            for variant in VARIANTS:
                dist.barrier()
                start = time.perf_counter()
                if variant in trainers:
                    trainers[variant].steps(args.steps)
                times[variant].append((time.perf_counter() - start) / args.steps)
                dist.barrier()
        gradients = torch.zeros(sum(p.numel() for p in trainers["eager"].model.parameters()))
        all_reduce = []
        for _ in range(args.rounds):  # the communication alone: one all-reduce of as many bytes as the gradients
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(gradients)
            all_reduce.append(time.perf_counter() - start)
        if rank == 0:
            eager = trainers["eager"].losses
            for variant in VARIANTS:
                t = trainers[variant]
                relative = [abs(a - b) / abs(b) for a, b in zip(t.losses, eager)]
                difference = (relative[0], max(relative)) if variant not in NO_DDP else None
                graphs = t.graphs_per_step() if t.backend is not None else (t.dynamo_graphs * 2 if variant == "inductor" else None)
                rows.append((name, variant, statistics.median(times[variant]), graphs, difference))
            rows.append((name, "all-reduce of the gradients alone", statistics.median(all_reduce), None, None))
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,resnet18,gpt2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = f"/tmp/train_ddp_{os.getpid()}.txt"
    torch.multiprocessing.start_processes(_worker, args=(port, args, out), nprocs=2, start_method="spawn")
    with open(out) as f:
        rows = json.load(f)
    os.unlink(out)
    print(f"torch {torch.__version__}, 2 processes x 1 thread, gloo; medians of {args.rounds} rounds x {args.steps} steps")
    print("| model | variant | step ms | vs eager DDP | graphs/step | loss difference vs eager DDP: first step, largest |")
    print("|---|---|---|---|---|---|")
    eager = {name: ms for name, variant, ms, _, _ in rows if variant == "eager"}
    for name, variant, seconds, graphs, difference in rows:
        graphs = "" if graphs is None else f"{graphs:.0f}"
        difference = "" if difference is None else f"{difference[0]:.1e}, {difference[1]:.1e}"
        print(f"| {name} | {variant} | {seconds * 1e3:.1f} | {seconds / eager[name]:.2f}x | {graphs} | {difference} |")
    for name in dict.fromkeys(row[0] for row in rows):
        ms = {variant: seconds for n, variant, seconds, _, _ in rows if n == name}
        print(
            f"{name}: ortlite DDP / ortlite 1 process {ms['ortlite'] / ms['ortlite 1 process']:.2f}x (one bucket "
            f"{ms['ortlite one bucket'] / ms['ortlite 1 process']:.2f}x), / ortlite 2 processes no DDP "
            f"{ms['ortlite'] / ms['ortlite 2 processes, no DDP']:.2f}x; eager DDP / eager 1 process {ms['eager'] / ms['eager 1 process']:.2f}x, "
            f"/ eager 2 processes no DDP {ms['eager'] / ms['eager 2 processes, no DDP']:.2f}x; ortlite DDP - ortlite 2 processes no DDP "
            f"{(ms['ortlite'] - ms['ortlite 2 processes, no DDP']) * 1e3:.1f} ms, the all-reduce alone {ms['all-reduce of the gradients alone'] * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    sys.exit(main())
