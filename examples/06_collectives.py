"""06 · every collective of ``iris_fw.ccl``, checked against a torch reference.

``from iris_fw import ccl as dist`` gives torch.distributed's calls (same names, arguments and
in-place behaviour) run by Triton kernels writing into the peers' heaps: all_reduce (SUM, MAX),
all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single with ragged splits,
broadcast, reduce, gather, scatter, barrier, an ``async_op`` Work, a sub-group from
``new_group``, and the fused ``all_reduce_rmsnorm``. Every rank draws every rank's inputs from
one shared seed, so each can compute the reference locally.

    iris-fw launch -n 3 examples/06_collectives.py
"""

import sys

import iris_fw  # first: switches Triton's interpreter on when there is no GPU

import torch

from iris_fw import ccl as dist


def main() -> int:
    with iris_fw.init(heap_size=1 << 26) as ctx:
        w, r, dev = ctx.world_size, ctx.rank, ctx.device
        n = w * (32 if dev.type == "cpu" else 1 << 18)  # elements per rank: a multiple of the world size (and 32)
        seed = ctx.broadcast(int(torch.randint(1 << 30, ())))

        def inputs(shape, tag):  # every rank's tensor for one call, drawn from the shared seed
            return [torch.randn(shape, generator=torch.Generator().manual_seed(seed + 101 * tag + p)) for p in range(w)]

        failures, checked = [], []

        def check(name, got, want, exact=False):
            checked.append(name)
            got, want = got.cpu().double(), want.double()
            if not (torch.equal(got, want) if exact else torch.allclose(got, want, rtol=1e-5, atol=1e-5)):
                failures.append(name)

        xs = inputs(n, 1)
        t = xs[r].to(dev, copy=True)  # a copy: on a CPU .to(dev) is xs[r] itself, which all_reduce overwrites
        dist.all_reduce(t)                                                    # in place, SUM
        check("all_reduce sum", t, torch.stack(xs).sum(0))
        t = xs[r].to(dev, copy=True)
        dist.all_reduce(t, op=torch.distributed.ReduceOp.MAX)                 # torch's ReduceOp, or "max"
        check("all_reduce max", t, torch.stack(xs).max(0).values, exact=True)

        out = torch.empty(w * n, device=dev)
        dist.all_gather_into_tensor(out, xs[r].to(dev, copy=True))
        check("all_gather_into_tensor", out, torch.cat(xs), exact=True)

        part = torch.empty(n // w, device=dev)
        dist.reduce_scatter_tensor(part, xs[r].to(dev, copy=True))
        check("reduce_scatter_tensor", part, torch.stack(xs).sum(0)[r * (n // w):(r + 1) * (n // w)])

        # all_to_all_single: rank p sends (p + q + 1) rows of 4 to rank q
        splits = [[p + q + 1 for q in range(w)] for p in range(w)]
        rows = inputs((sum(splits[0]) + w * w, 4), 2)  # long enough for every rank's sends
        send = [rows[p][:sum(splits[p])] for p in range(w)]
        recv = torch.empty(sum(splits[p][r] for p in range(w)), 4, device=dev)
        dist.all_to_all_single(recv, send[r].to(dev), output_split_sizes=[splits[p][r] for p in range(w)],
                               input_split_sizes=splits[r])
        want = torch.cat([send[p][sum(splits[p][:r]):sum(splits[p][:r + 1])] for p in range(w)])
        check("all_to_all_single", recv, want, exact=True)

        t = xs[r].to(dev, copy=True)
        dist.broadcast(t, src=w - 1)
        check("broadcast", t, xs[w - 1], exact=True)

        t = xs[r].to(dev, copy=True)
        dist.reduce(t, dst=0)                                                 # only the root's changes
        check("reduce", t, torch.stack(xs).sum(0) if r == 0 else xs[r])

        gathered = [torch.empty(n, device=dev) for _ in range(w)] if r == 0 else None
        dist.gather(xs[r].to(dev, copy=True), gathered, dst=0)
        if r == 0:
            check("gather", torch.stack(gathered), torch.stack(xs), exact=True)

        t = torch.empty(n, device=dev)
        dist.scatter(t, [x.to(dev, copy=True) for x in xs] if r == 0 else None, src=0)
        check("scatter", t, xs[r], exact=True)

        work = dist.all_reduce(t, async_op=True)                              # a Work, as in torch
        work.wait()
        ctx.synchronize()
        check("all_reduce async_op", t, torch.stack(xs).sum(0))

        evens = list(range(0, w, 2))
        group = dist.new_group(evens)                                         # collective over every rank
        if r in evens:
            t = xs[r].to(dev, copy=True)
            dist.all_reduce(t, group=group)
            check("all_reduce on new_group", t, torch.stack([xs[p] for p in evens]).sum(0))

        hidden = 32
        x, res = inputs((n // hidden, hidden), 3), inputs((n // hidden, hidden), 4)[0]  # residual: one for all
        weight = 1 + 0.1 * inputs(hidden, 5)[0]
        residual = res.to(dev, copy=True)
        out, h = dist.all_reduce_rmsnorm(x[r].to(dev, copy=True), residual, weight.to(dev), eps=1e-6)
        want_out, want_h = dist.all_reduce_rmsnorm_reference(x[r], res, weight, 1e-6, xs=x)
        check("all_reduce_rmsnorm out", out, want_out)
        check("all_reduce_rmsnorm residual", h, want_h)

        dist.barrier()                                                        # host waits, as torch's
        bad = ctx.bootstrap.all_gather(failures)
        if r == 0:
            wrong = {p: f for p, f in enumerate(bad) if f}
            print(f"collectives on {w} ranks ({dev.type}), {n} elements per rank: "
                  + (f"{len(checked)} checks correct on every rank" if not wrong else f"WRONG: {wrong}"))
        return 0 if not any(bad) else 1


if __name__ == "__main__":
    sys.exit(main())
