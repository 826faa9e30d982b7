"""Reading iris-fw trace files (:mod:`iris_fw.trace_session` writes them): ``iris-fw trace summarize``
(busy time per role, idle gaps, waits by flag, lost events) and ``iris-fw trace plot`` (timeline
PNGs: one row per SM or program, compute and communication coloured, waits hatched; several
traces on one time axis with ``--compare``). Works on a merged file or on one rank's file.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field

#: Colours of the roles in plots (waits are also hatched).
COLOURS = {"compute": "#4C72B0", "communicate": "#DD8452", "wait": "#BBBBBB"}
#: Gaps shorter than this share of a row's span are not reported as idle gaps.
GAP_SHARE = 0.01


@dataclass
class Event:
    """One complete event of a trace, times in microseconds."""

    rank: int
    row: int
    name: str
    role: str
    ts: float
    dur: float
    args: dict

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class Trace:
    """A trace file: its events, row names per ``(rank, row)`` and ``otherData``."""

    path: str
    events: list
    rows: dict
    info: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.info.get("label") or os.path.splitext(os.path.basename(self.path))[0]

    @property
    def ranks(self) -> list:
        return sorted({e.rank for e in self.events} | {r for r, _ in self.rows})


def load(path: str) -> Trace:
    """Read a trace file written by :mod:`iris_fw.trace_session` (or any Chrome-trace JSON with complete
    events)."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or "traceEvents" not in data:
        raise ValueError(f"{path}: not a Chrome-trace JSON file (no traceEvents)")
    events, rows = [], {}
    for e in data["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            rows[(int(e["pid"]), int(e["tid"]))] = e.get("args", {}).get("name", str(e["tid"]))
        elif e.get("ph") == "X":
            events.append(Event(int(e.get("pid", 0)), int(e.get("tid", 0)), e.get("name", "?"),
                                e.get("cat", "compute"), float(e["ts"]), float(e.get("dur", 0.0)), e.get("args", {})))
    for e in events:
        rows.setdefault((e.rank, e.row), f"row {e.row}")
    events.sort(key=lambda e: (e.rank, e.row, e.ts))
    return Trace(path, events, rows, data.get("otherData", {}) or {})


def select(trace: Trace, window: tuple | None = None, call: int | None = None, ranks=None) -> list:
    """The trace's events within ``window`` (``(start, end)`` µs, overlapping), of call ``call``
    and of ``ranks``. A call is an epoch: a program whose span has that item contributes the
    events inside its span; other programs those overlapping the window of those spans (-1: the
    last call)."""
    events = [e for e in trace.events if ranks is None or e.rank in ranks]
    rows = {}
    if call is not None:
        spans = [e for e in events if e.role == "program"]
        if not spans:
            raise ValueError(f"{trace.path}: --call needs program spans (the engine's kernels record them)")
        epoch = max(e.args.get("item", 0) for e in spans) if call == -1 else call
        chosen = [e for e in spans if e.args.get("item") == epoch]
        if not chosen:
            raise ValueError(f"{trace.path}: no call {epoch} (calls: {sorted({e.args.get('item') for e in spans})})")
        window = (min(e.ts for e in chosen), max(e.end for e in chosen))
        rows = {_program(e): (e.ts, e.end) for e in chosen}
    if window is not None:
        events = [e for e in events if _overlaps(e, rows.get(_program(e), window))]
    return events


def _program(e) -> tuple:
    return e.rank, e.args.get("kernel"), e.args.get("program")


def _overlaps(e, window: tuple) -> bool:
    return e.end >= window[0] and e.ts <= window[1]


# ---- summaries -------------------------------------------------------------------------------------


def _union(intervals: list) -> float:
    """Total length of the union of ``(start, end)`` intervals."""
    total, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted(intervals):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def _gaps(spans: list, busy: list) -> list:
    """``(start, length)`` of the stretches of ``spans`` (intervals) covered by no ``busy`` one."""
    gaps = []
    merged = []
    for lo, hi in sorted(busy):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    for s_lo, s_hi in spans:
        cur = s_lo
        for lo, hi in merged:
            if hi <= cur or lo >= s_hi:
                continue
            if lo > cur:
                gaps.append((cur, lo - cur))
            cur = max(cur, hi)
        if cur < s_hi:
            gaps.append((cur, s_hi - cur))
    return gaps


def summarize(trace: Trace, events: list | None = None) -> dict:
    """Per rank: its time window, busy time per role (per row the union of that role's events,
    summed over rows), program time (the union of the rows' spans), idle time and gaps inside
    the spans, waits by kind and by flag, events per kernel and kind."""
    events = trace.events if events is None else events
    per_rank = defaultdict(list)
    for e in events:
        per_rank[e.rank].append(e)
    out = {}
    for rank, evs in sorted(per_rank.items()):
        rows = defaultdict(list)
        for e in evs:
            rows[e.row].append(e)
        busy = defaultdict(float)
        span_total = idle_total = 0.0
        gaps = []
        for row, rev in rows.items():
            spans = [(e.ts, e.end) for e in rev if e.role == "program"]
            work = [e for e in rev if e.role != "program"]
            if not spans and work:
                spans = [(min(e.ts for e in work), max(e.end for e in work))]
            for role in ("compute", "communicate", "wait"):
                busy[role] += _union([(e.ts, e.end) for e in work if e.role == role])
            span = _union(spans)
            span_total += span
            row_gaps = _gaps(spans, [(e.ts, e.end) for e in work])
            idle_total += sum(g for _, g in row_gaps)
            threshold = GAP_SHARE * span
            gaps.extend((length, start, trace.rows.get((rank, row), f"row {row}")) for start, length in row_gaps
                        if length > threshold)
        waits_by_flag = defaultdict(lambda: [0, 0.0, 0.0])
        waits_by_kind = defaultdict(lambda: [0, 0.0, 0.0])
        kernels = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
        moved = 0
        for e in evs:
            if e.role == "wait":
                for table, key in ((waits_by_flag, e.args.get("flag") or "?"), (waits_by_kind, e.name)):
                    entry = table[key]
                    entry[0] += 1
                    entry[1] += e.dur
                    entry[2] = max(entry[2], e.dur)
            if e.role != "program":
                k = kernels[e.args.get("kernel", "?")][e.name]
                k[0] += 1
                k[1] += e.dur
            if e.role == "communicate" and e.args.get("bytes", -1) > 0:
                moved += e.args["bytes"]
        gaps.sort(reverse=True)
        out[rank] = {
            "window": (min(e.ts for e in evs), max(e.end for e in evs)),
            "rows": len(rows), "events": len(evs), "busy": dict(busy), "program_time": span_total,
            "idle": idle_total, "gaps": gaps, "waits_by_flag": dict(waits_by_flag),
            "waits_by_kind": dict(waits_by_kind), "kernels": {k: dict(v) for k, v in kernels.items()},
            "bytes_moved": moved,
        }
    return out


def _us(x: float) -> str:
    return f"{x:,.1f} us" if x < 1e5 else f"{x / 1e3:,.2f} ms"


def format_summary(trace: Trace, summary: dict, top: int = 8) -> str:
    """The text ``iris-fw trace summarize`` prints."""
    info = trace.info
    lines = [f"trace {trace.path}: {trace.label}; {len(summary)} rank(s), "
             f"{sum(s['events'] for s in summary.values())} events, clock {info.get('clock', '?')}"
             + (f" on {info['device']}" if info.get("device") else "")]
    align = info.get("clock_alignment") or {}
    if align.get("aligned") and len(align.get("bounds_ns", [])) > 1:
        lines.append(f"  clocks aligned to rank 0 within +-{max(align['bounds_ns']) / 1e3:.2f} us "
                     f"({align.get('method', '')})")
    elif align:
        lines.append("  clocks not aligned across ranks (a rank's own file written after an error)")
    if info.get("clock") == "host":
        lines.append("  CPU interpreter: a launch's programs run one after another here; times show the "
                     "format, not GPU behaviour")
    lost = {r: n for r, n in (info.get("lost_events") or {}).items() if n}
    lines.append("  lost events: " + (", ".join(f"rank {r}: {n}" for r, n in lost.items()) if lost else "none"))
    for rank, s in summary.items():
        lo, hi = s["window"]
        prog = s["program_time"] or 1e-9
        lines.append(f"rank {rank}: {_us(hi - lo)} window, {s['rows']} rows (programs), program time {_us(prog)}"
                     f", {s['bytes_moved'] / 1e6:,.3f} MB sent/fetched")
        lines.append(f"  {'role':<12} {'busy':>14} {'share':>7}")
        for role in ("compute", "communicate", "wait"):
            busy = s["busy"].get(role, 0.0)
            lines.append(f"  {role:<12} {_us(busy):>14} {100 * busy / prog:>6.1f}%")
        lines.append(f"  {'idle':<12} {_us(s['idle']):>14} {100 * s['idle'] / prog:>6.1f}%  "
                     f"({len(s['gaps'])} gaps over {100 * GAP_SHARE:g}% of a row's span)")
        for length, start, row in s["gaps"][:min(top, 3)]:
            lines.append(f"    gap of {_us(length)} at {_us(start)} in {row}")
        if s["waits_by_kind"]:
            lines.append("  waits by kind:")
            for kind, (n, total, worst) in sorted(s["waits_by_kind"].items(), key=lambda kv: -kv[1][1]):
                lines.append(f"    {kind:<16} {n:>6} x  total {_us(total):>12}  longest {_us(worst)}")
            lines.append("  waits by flag:")
            for flag, (n, total, worst) in sorted(s["waits_by_flag"].items(), key=lambda kv: -kv[1][1])[:top]:
                lines.append(f"    {_us(total):>12} in {n:>5} waits (longest {_us(worst)}): {flag}")
        lines.append("  kernels:")
        for kernel, kinds in s["kernels"].items():
            parts = ", ".join(f"{kind} {n} x {_us(t / max(n, 1))}" for kind, (n, t) in kinds.items())
            lines.append(f"    {kernel}: {parts}")
    return "\n".join(lines)


# ---- plots ---------------------------------------------------------------------------------------------


def _rows_of(trace: Trace, events: list, by: str) -> tuple[list, dict]:
    """Row keys in order and each event's row: ``by`` = ``"sm"`` (one row per rank and SM; events
    without an SM keep their program row), ``"program"`` (per kernel program), or ``"auto"`` (SM
    rows when the trace has SM ids)."""
    if by == "auto":
        by = "sm" if any(e.args.get("sm", -1) >= 0 for e in events) else "program"
    keys = {}
    for e in events:
        sm = e.args.get("sm", -1)
        if by == "sm" and sm >= 0:
            keys[id(e)] = (e.rank, 0, sm, f"r{e.rank} SM {sm}")
        else:
            keys[id(e)] = (e.rank, 1, e.row, f"r{e.rank} {trace.rows.get((e.rank, e.row), e.row)}")
    order = sorted(set(keys.values()))
    return order, keys


def plot(traces: list, out: str, *, rows: str = "auto", window=None, call=None, ranks=None, width: float = 14.0,
         title: str | None = None) -> str:
    """Draw the timelines of ``traces`` into the PNG ``out``: one panel each, on one time axis
    (each panel from its own first event, so schedules recorded one after another line up)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = []
    for t in traces:
        events = select(t, window, call, ranks)
        order, keys = _rows_of(t, events, rows)
        panels.append((t, events, order, keys))
    heights = [max(1.2, 0.16 * len(order) + 0.6) for _, _, order, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, sum(heights) + 0.8), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    # each panel from its own first event: schedules recorded one after another compare on one axis
    starts = [min((e.ts for e in evs), default=0.0) for _, evs, _, _ in panels]
    length = max((e.end - s for s, (_, evs, _, _) in zip(starts, panels) for e in evs), default=1.0)
    unit, scale = ("us", 1.0) if length < 2e4 else ("ms", 1e-3) if length < 2e7 else ("s", 1e-6)
    for ax, start, (t, events, order, keys) in zip(axes[:, 0], starts, panels):
        index = {k: i for i, k in enumerate(order)}
        bars = defaultdict(list)
        for e in events:
            bars[(index[keys[id(e)]], e.role)].append(((e.ts - start) * scale, max(e.dur * scale, 1e-6)))
        for (y, role), xs in bars.items():
            if role == "program":
                ax.broken_barh(xs, (y - 0.45, 0.9), facecolors="#F2F2F2", edgecolors="none", zorder=0)
            elif role == "wait":
                ax.broken_barh(xs, (y - 0.35, 0.7), facecolors="#E6E6E6", edgecolors="#888888", hatch="////",
                               linewidth=0.2, zorder=2)
            else:
                ax.broken_barh(xs, (y - 0.35, 0.7), facecolors=COLOURS.get(role, "#55A868"), edgecolors="none",
                               zorder=1)
        ax.set_ylim(len(order) - 0.5, -0.5)
        step = max(1, len(order) // 40)
        ax.set_yticks(range(0, len(order), step))
        ax.set_yticklabels([order[i][3] for i in range(0, len(order), step)], fontsize=6)
        for i in range(1, len(order)):
            if order[i][0] != order[i - 1][0]:
                ax.axhline(i - 0.5, color="black", linewidth=0.6)
        note = ""
        if t.info.get("clock") == "host":
            note = "  [CPU interpreter run: shows the format, not GPU timing]"
        align = t.info.get("clock_alignment") or {}
        if align.get("aligned") and len(align.get("bounds_ns", [])) > 1:
            note += f"  clocks aligned +-{max(align['bounds_ns']) / 1e3:.2f} us"
        ax.set_title(f"{t.label}{note}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(f"time ({unit})")
    handles = [Patch(facecolor=COLOURS["compute"], label="compute"),
               Patch(facecolor=COLOURS["communicate"], label="communicate"),
               Patch(facecolor="#E6E6E6", edgecolor="#888888", hatch="////", label="wait"),
               Patch(facecolor="#F2F2F2", label="program (span)")]
    fig.legend(handles=handles, loc="upper right", ncol=4, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    longest = max((len(k[3]) for _, _, order, _ in panels for k in order), default=10)
    fig.subplots_adjust(left=min(0.5, max(fig.subplotpars.left, (longest * 6 * 0.62 / 72 + 0.15) / width)))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=150)
    plt.close(fig)
    return out


# ---- command line ---------------------------------------------------------------------------------------


def add_parser(sub) -> None:
    """The ``iris-fw trace`` subcommands."""
    p = sub.add_parser("trace", help="read trace files written by ctx.trace / IRIS_FW_TRACE (summarize, plot)")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    s = tsub.add_parser("summarize", help="busy time per role, idle gaps, waits by flag, per rank")
    s.add_argument("files", nargs="+", help="trace JSON files (merged or per rank)")
    s.add_argument("--call", type=int, default=None, help="only this call (epoch; -1: the last)")
    s.add_argument("--window", type=float, nargs=2, metavar=("START", "END"), help="only this time window (us)")
    s.add_argument("--top", type=int, default=8, help="flags and gaps listed (default 8)")
    s.set_defaults(func=_cmd_summarize)
    q = tsub.add_parser("plot", help="timeline PNG: one row per SM (or program), compute/communication coloured, "
                                     "waits hatched")
    q.add_argument("files", nargs="+", help="trace JSON files")
    q.add_argument("-o", "--out", default=None, help="output PNG (default: FILE.png; with --compare: compare.png)")
    q.add_argument("--compare", action="store_true", help="all files in one figure, one panel each, one time axis")
    q.add_argument("--rows", choices=("auto", "sm", "program"), default="auto",
                   help="one row per SM (GPU traces), per kernel program, or auto (SM when known)")
    q.add_argument("--call", type=int, default=None, help="only this call (epoch; -1: the last)")
    q.add_argument("--window", type=float, nargs=2, metavar=("START", "END"), help="only this time window (us)")
    q.add_argument("--ranks", type=int, nargs="+", default=None, help="only these ranks")
    q.add_argument("--width", type=float, default=14.0, help="figure width in inches")
    q.add_argument("--title", default=None)
    q.set_defaults(func=_cmd_plot)


def _cmd_summarize(args) -> int:
    for path in args.files:
        trace = load(path)
        events = select(trace, tuple(args.window) if args.window else None, args.call)
        print(format_summary(trace, summarize(trace, events), top=args.top))
    return 0


def _cmd_plot(args) -> int:
    traces = [load(p) for p in args.files]
    window = tuple(args.window) if args.window else None
    opts = dict(rows=args.rows, window=window, call=args.call, ranks=args.ranks, width=args.width, title=args.title)
    if args.compare or len(traces) == 1:
        out = args.out or (os.path.splitext(args.files[0])[0] + ".png" if len(traces) == 1 else "compare.png")
        print(plot(traces, out, **opts))
        return 0
    if args.out:
        raise SystemExit("iris-fw trace plot: -o names one file; with several traces use --compare, or no -o")
    for t in traces:
        print(plot([t], os.path.splitext(t.path)[0] + ".png", **opts))
    return 0


__all__ = ["Event", "Trace", "load", "select", "summarize", "format_summary", "plot", "add_parser"]
