"""Built-in benchmarks of the device primitives, registered like any plugin's.

* ``primitives`` – one-peer ``load``/``get`` (pull) and ``store``/``put`` (push) bandwidth,
  every rank with its right neighbour at once, against the copy engine's peer copy and a
  local device copy measured in the same run. The kernel configuration (block, warps,
  programs per SM) is tuned at the largest size first.
* ``all_peers`` – every rank pushes to (and pulls from) every other rank at once; aggregate
  per-rank bandwidth against NCCL all-to-all and all-gather bus bandwidth.
* ``atomics`` – ``atomic_add``/``atomic_xchg``/``atomic_cas`` rates, local and remote.
* ``latency`` – ``signal`` → ``wait_until`` round trip between ranks 0 and 1.
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from .. import device as dv
from .. import devinfo
from ..hookspecs import hookimpl
from .harness import Rotation, fmt_bytes, measure_us

# Candidate kernel configurations (elements per block, warps, programs per SM, cache modifier
# of the remote access: "" default, ".cg" L2 only for loads / ".cs" streaming for stores).
_BLOCKS = (4096, 8192, 16384, 32768)
_WARPS = (4, 8)
_PROGRAMS_PER_SM = (1, 2, 4)
_CACHE = {"load": ("", ".cg"), "store": ("", ".cs")}
_DTYPE = torch.int32  # 4-byte elements: 16-byte vectors need 4 per thread


@triton.jit
def _one_peer_kernel(src, dst, n, rank, peer, heap_bases, OP: tl.constexpr, BLOCK: tl.constexpr,
                     CACHE: tl.constexpr):
    """Persistent copy of ``n`` elements between this rank and ``peer`` with one primitive;
    CACHE is the cache modifier of the remote access."""
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        if OP == "load":
            tl.store(dst + offs, dv.load(src + offs, rank, peer, heap_bases, mask=mask, cache_modifier=CACHE), mask=mask)
        elif OP == "get":
            dv.get(src + offs, dst + offs, rank, peer, heap_bases, mask=mask)
        elif OP == "store":
            dv.store(dst + offs, tl.load(src + offs, mask=mask), rank, peer, heap_bases, mask=mask, cache_modifier=CACHE)
        else:
            dv.put(src + offs, dst + offs, rank, peer, heap_bases, mask=mask)


@triton.jit
def _all_peers_kernel(src, dst, chunk, rank, world_size, heap_bases, PUSH: tl.constexpr, BLOCK: tl.constexpr):
    """Every rank moves ``chunk`` elements to (PUSH) or from every other rank: row ``rank`` of
    each peer's ``dst [world_size, chunk]`` (push) or the peer's ``src`` into local rows (pull).
    Consecutive blocks go to different peers, so every link is busy at once. ``chunk`` is a
    multiple of BLOCK."""
    peers = world_size - 1
    for t in range(tl.program_id(0), peers * (chunk // BLOCK), tl.num_programs(0)):
        j = t % peers
        peer = (rank + 1 + j) % world_size
        offs = (t // peers) * BLOCK + tl.arange(0, BLOCK)
        if PUSH:
            dv.store(dst + rank * chunk + offs, tl.load(src + offs), rank, peer, heap_bases)
        else:
            tl.store(dst + peer * chunk + offs, dv.load(src + offs, rank, peer, heap_bases))


@triton.jit
def _atomic_rate_kernel(buf, n, iters, rank, peer, heap_bases, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)) % n
    one = tl.full([BLOCK], 1, tl.int32)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(0, iters):
        if OP == "add":
            acc += dv.atomic_add(buf + offs, one, rank, peer, heap_bases)
        elif OP == "xchg":
            acc += dv.atomic_xchg(buf + offs, one * i, rank, peer, heap_bases)
        else:
            acc += dv.atomic_cas(buf + offs, one * i, one * (i + 1), rank, peer, heap_bases)
    tl.store(buf + n + offs, acc)  # keep the results live


@triton.jit
def _ping_pong_kernel(flag, base, rounds, rank, peer, heap_bases, SERVE: tl.constexpr):
    for i in range(base + 1, base + rounds + 1):
        if SERVE:
            dv.signal(flag, i, rank, peer, heap_bases)
            dv.wait_until(flag, ">=", i, rank, rank, heap_bases)
        else:
            dv.wait_until(flag, ">=", i, rank, rank, heap_bases)
            dv.signal(flag, i, rank, peer, heap_bases)


def _sms(ctx) -> int:
    if ctx.device.type == "cuda":
        return devinfo.num_sms(ctx.device)
    return 2


class PrimitiveBandwidth:
    name = "primitives"
    description = "one-peer load/get/store/put bandwidth vs the copy engine and a local copy"
    plot = {"x": "size_bytes", "y": "GBps", "series": "op", "xlabel": "bytes", "ylabel": "GB/s per rank", "logy": True}

    def _configs(self, ctx, opts, op):
        if ctx.device.type != "cuda" or opts.quick:
            return [(64, 4, 1, "") if ctx.device.type != "cuda" else (8192, 4, 2, "")]
        return list(itertools.product(_BLOCKS, _WARPS, _PROGRAMS_PER_SM, _CACHE[op]))

    def run(self, ctx, opts):
        me, world = ctx.rank, ctx.world_size
        peer = (me + 1) % world
        rows, sms = [], _sms(ctx)
        largest = max(opts.sizes)

        def launcher(op, config, src_rot, dst_rot, n):
            block, warps, per_sm, cache = config
            grid = (min(sms * per_sm, triton.cdiv(n, block)),)
            cache = cache if op in ("load", "store") else ""
            return lambda i: _one_peer_kernel[grid](src_rot[i], dst_rot[i], n, me, peer, ctx.heap_bases,
                                                    OP=op, BLOCK=block, CACHE=cache, num_warps=warps)

        def describe(config):
            return f"BLOCK={config[0]} warps={config[1]} programs/SM={config[2]} cache='{config[3]}'"

        # tune at the largest size: best config per family (pull: load/get, push: store/put)
        src = Rotation(ctx, largest, opts.rotate_bytes, _DTYPE)
        dst = Rotation(ctx, largest, opts.rotate_bytes, _DTYPE)
        src.pool.random_(-1000, 1000)
        best = {}
        for op in ("load", "store"):
            timed = []
            for config in self._configs(ctx, opts, op):
                us = measure_us(ctx, launcher(op, config, src, dst, src.n), max(5, opts.iters // 3), 2)
                timed.append((us, config))
                rows.append({"op": f"tune:{op}", "size_bytes": largest, "time_us": us,
                             "GBps": largest / us / 1e3, "config": describe(config)})
            best[op] = min(timed)[1]
            opts.log(f"  best {op} config at {fmt_bytes(largest)}: {describe(best[op])} "
                     f"({largest / min(timed)[0] / 1e3:.1f} GB/s)")
        del src, dst
        ctx.barrier()
        for k, size in enumerate(opts.sizes, 1):
            src = Rotation(ctx, size, opts.rotate_bytes, _DTYPE)
            dst = Rotation(ctx, size, opts.rotate_bytes, _DTYPE)
            src.pool.random_(-1000, 1000)
            ctx.barrier()
            for op in ("load", "get", "store", "put"):
                config = best["load" if op in ("load", "get") else "store"]
                us = measure_us(ctx, launcher(op, config, src, dst, src.n), opts.iters, opts.warmup)
                rows.append({"op": op, "size_bytes": size, "time_us": us, "GBps": size / us / 1e3,
                             "config": describe(config)})
            # ceilings in the same run: the copy engine across the link, and a local copy
            peer_src, peer_dst = ctx.peer_view(src.pool, peer), ctx.peer_view(dst.pool, peer)
            for op, fn in (
                ("copy_engine_pull", lambda i: dst[i].copy_(peer_src[i % src.slots])),
                ("copy_engine_push", lambda i: peer_dst[i % dst.slots].copy_(src[i])),
                ("local_copy", lambda i: dst[i].copy_(src[i])),
            ):
                us = measure_us(ctx, fn, opts.iters, opts.warmup)
                rows.append({"op": op, "size_bytes": size, "time_us": us, "GBps": size / us / 1e3, "config": "torch copy_"})
            del peer_src, peer_dst
            ctx.barrier()
            # correctness of the last pull: every element arrived
            _one_peer_kernel[(4,)](src[0], dst[0], src.n, me, peer, ctx.heap_bases, OP="load", BLOCK=1024, CACHE="")
            ctx.barrier()
            assert torch.equal(dst[0], ctx.peer_view(src[0], peer)), "pull benchmark moved wrong data"
            opts.log(f"  [{k}/{len(opts.sizes)}] {fmt_bytes(size)}: " + ", ".join(
                f"{r['op']} {r['GBps']:.1f}" for r in rows[-7:]) + " GB/s")
            del src, dst
            ctx.barrier()
        return rows


class AllPeers:
    name = "all_peers"
    description = "every rank with every other at once (push and pull) vs NCCL all-to-all / all-gather"
    plot = {"x": "size_bytes", "y": "busbw_GBps", "series": "op", "xlabel": "bytes per rank", "ylabel": "bus bandwidth GB/s", "logy": True}

    def run(self, ctx, opts):
        import torch.distributed as dist

        me, world = ctx.rank, ctx.world_size
        rows, sms = [], _sms(ctx)
        block, warps, per_sm = (8192, 4, 2) if ctx.device.type == "cuda" else (64, 4, 1)
        nccl = ctx.device.type == "cuda" and dist.is_initialized()
        for size in opts.sizes:
            chunk = size // 4 // world // block * block  # elements per peer
            if world < 2 or chunk == 0:
                continue
            moved = (world - 1) * chunk * 4  # bytes each rank sends (or receives)
            src = ctx.empty(chunk, dtype=_DTYPE).random_(-1000, 1000)
            dst = ctx.empty(world, chunk, dtype=_DTYPE)
            grid = (min(sms * per_sm, (world - 1) * chunk // block),)
            ctx.barrier()
            for op, push in (("push", True), ("pull", False)):
                fn = lambda i, push=push: _all_peers_kernel[grid](src, dst, chunk, me, world, ctx.heap_bases,
                                                                  PUSH=push, BLOCK=block, num_warps=warps)
                us = measure_us(ctx, fn, opts.iters, opts.warmup)
                rows.append({"op": f"iris_fw_{op}", "size_bytes": world * chunk * 4, "time_us": us,
                             "busbw_GBps": moved / us / 1e3})
                ctx.barrier()
                for r in range(world):  # row r holds rank r's data, pushed or pulled
                    if r != me:
                        assert torch.equal(dst[r], ctx.peer_view(src, r)), f"all-peers {op}: row {r} on rank {me} is wrong"
                dst.fill_(-1)
            ctx.barrier()
            if nccl:
                flat_in = torch.empty(world * chunk, dtype=_DTYPE, device=ctx.device).random_(-1000, 1000)
                flat_out = torch.empty_like(flat_in)
                us = measure_us(ctx, lambda i: dist.all_to_all_single(flat_out, flat_in), opts.iters, opts.warmup)
                rows.append({"op": "nccl_all_to_all", "size_bytes": world * chunk * 4, "time_us": us,
                             "busbw_GBps": moved / us / 1e3})
                part = flat_in[:chunk]
                us = measure_us(ctx, lambda i: dist.all_gather_into_tensor(flat_out, part), opts.iters, opts.warmup)
                rows.append({"op": "nccl_all_gather", "size_bytes": world * chunk * 4, "time_us": us,
                             "busbw_GBps": moved / us / 1e3})
                del flat_in, flat_out, part
            opts.log(f"  {fmt_bytes(world * chunk * 4)}: " + ", ".join(
                f"{r['op']} {r['busbw_GBps']:.1f}" for r in rows if r["size_bytes"] == world * chunk * 4) + " GB/s")
            del src, dst
            ctx.barrier()
        return rows


class AtomicRates:
    name = "atomics"
    description = "atomic_add / atomic_xchg / atomic_cas rates (acq_rel, sys), local and remote"

    def run(self, ctx, opts):
        me, world = ctx.rank, ctx.world_size
        sms = _sms(ctx)
        block = 256 if ctx.device.type == "cuda" else 16
        programs = sms * 4 if ctx.device.type == "cuda" else 2
        iters = 64 if ctx.device.type == "cuda" else 2
        n = programs * block
        buf = ctx.zeros(2 * n, dtype=torch.int32)
        rows = []
        for op in ("add", "xchg", "cas"):
            for where, peer in (("local", me), ("remote", (me + 1) % world)):
                fn = lambda i, op=op, peer=peer: _atomic_rate_kernel[(programs,)](buf, n, iters, me, peer, ctx.heap_bases,
                                                                                  OP=op, BLOCK=block)
                us = measure_us(ctx, fn, opts.iters, opts.warmup)
                rows.append({"op": f"atomic_{op}", "target": where, "ops_per_rank": n * iters, "time_us": us,
                             "Gops": n * iters / us / 1e3})
                opts.log(f"  atomic_{op} {where}: {rows[-1]['Gops']:.3f} Gop/s per rank")
        return rows


class SignalLatency:
    name = "latency"
    description = "signal -> wait_until round trip between ranks 0 and 1"

    def run(self, ctx, opts):
        if ctx.world_size < 2:
            return []
        me = ctx.rank
        flag = ctx.zeros(1, dtype=torch.int64)
        rounds = 2000 if ctx.device.type == "cuda" else 5
        state = {"base": 0}

        def fn(i):
            if me < 2:
                _ping_pong_kernel[(1,)](flag, state["base"], rounds, me, 1 - me, ctx.heap_bases, SERVE=(me == 0))
            state["base"] += rounds

        ctx.barrier()
        us = measure_us(ctx, fn, opts.iters, opts.warmup)
        row = {"op": "signal_wait_round_trip", "rounds": rounds, "time_us": us, "round_trip_us": us / rounds}
        opts.log(f"  round trip: {row['round_trip_us']:.3f} us")
        return [row]


@hookimpl
def iris_fw_register_benchmarks(registry):
    for bench in (PrimitiveBandwidth(), AllPeers(), AtomicRates(), SignalLatency()):
        registry.register(bench)
