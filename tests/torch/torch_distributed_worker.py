"""One rank of test_distributed.py: gloo on 127.0.0.1 (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the
environment). A small net with log1pexp as its activation (the identity form, the decorator, and plain autodiff of
logaddexp(x, 0)), in float64, its batch split over the ranks: the gradient of the weights after
DistributedDataParallel's all-reduce (eagerly and under torch.compile) and after fully_shard's reduce-scatter, each
against plain autodiff of logaddexp(x, 0) on the whole batch in this process. Prints one line per case; exits 1
where any differs."""

import os
import sys

import torch
import torch.distributed as dist

import stopgrad_math.torch as sgm


def _identity(x):
    return sgm.custom_gradient(torch.logaddexp(x, torch.zeros((), dtype=x.dtype)), torch.sigmoid(x), x)


@sgm.custom_gradient
def _decorated(x):
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype)), lambda ct: ct * torch.sigmoid(x)


def _stable(x):  # plain autodiff of the stable formula (softplus's own derivative is 1 past its threshold of 20)
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype))


ACTIVATIONS = {"identity form": _identity, "decorator": _decorated, "plain autodiff": _stable}


class _Net(torch.nn.Module):
    def __init__(self, activation):
        super().__init__()
        torch.manual_seed(0)
        self.hidden, self.out = torch.nn.Linear(3, 16).double(), torch.nn.Linear(16, 1).double()
        self.activation = activation

    def forward(self, x):
        return self.out(self.activation(self.hidden(x) * 20.0))  # * 20: some units far into the tails


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 3, generator=generator, dtype=torch.float64), torch.randn(8, 1, generator=generator,
                                                                                       dtype=torch.float64)


def _gradients(model, inputs, targets):
    model.zero_grad()
    torch.nn.functional.mse_loss(model(inputs), targets, reduction="sum").backward()
    return [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]


def main():
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    inputs, targets = _batch()
    mine = slice(rank * len(inputs) // size, (rank + 1) * len(inputs) // size)
    truth = _gradients(_Net(_stable), inputs, targets)  # the whole batch, in this process alone
    failed = False
    engines = {
        "DDP eager": lambda a: torch.nn.parallel.DistributedDataParallel(_Net(a)),
        "DDP compiled": lambda a: torch.compile(torch.nn.parallel.DistributedDataParallel(_Net(a))),
        "fully_shard": lambda a: torch.distributed.fsdp.fully_shard(_Net(a)),
    }
    for engine, make in engines.items():
        for name in ("plain autodiff", "identity form", "decorator"):  # the engine itself first
            try:
                model = make(ACTIVATIONS[name])
                # DDP and fully_shard average over the ranks, and the loss sums over a rank's part: times size
                got = [g * size for g in _gradients(model, inputs[mine], targets[mine])]
            except Exception as error:
                if name != "plain autodiff":
                    raise
                if rank == 0:  # the engine fails without the library (fully_shard on torch 2.6's CPU)
                    print(f"{engine}: unavailable here ({type(error).__name__}: {error})", flush=True)
                break
            error = max(float((g - t).abs().max()) for g, t in zip(got, truth, strict=True))
            failed = failed or not error <= 1e-12
            if rank == 0:
                print(f"{engine} / {name}: {error:.1e}", flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    # Out without the interpreter's teardown: torch 2.14's, with compiled code and gloo threads left, can abort
    # ("terminate called without an active exception", SIGABRT) after every result above was printed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
