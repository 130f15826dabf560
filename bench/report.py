"""Targets (PASS / MISS / SKIP) and the Markdown tables printed at the end of a run.

A missed target never fails the run: the figures are ratios measured on a noisy machine, so
they are reported, not asserted. Only a crash makes the bench exit non-zero.
"""

from __future__ import annotations

from typing import Any, Optional

# total_memory() vs psutil.virtual_memory(): with the read-your-writes check every default
# (and thread=False) query makes, and without it (fresh=False: the thread-kept cache)
TOTAL_FRESH_RATIO = 1 / 30
TOTAL_TRUSTED_RATIO = 1 / 300
AVAILABLE_RATIO = 0.3  # available_memory() with one limited level vs psutil
AVAILABLE_FLOOR_RATIO = 1.2  # the same vs the kept-fd reads alone (its syscalls, no logic)
ANCESTOR_NOISE = 0.05  # "nothing measurable": within 5% of the same call with fewer levels
LATENCY_P99_MS = 5.0
GUARD_FAR_RATIO = 1.5  # Guard.check() far from thresholds vs available_memory()
GUARD_STEP_SECONDS = 100e-6  # 1% of a 10 ms training step


def _ns(seconds_ns: float) -> str:
    if seconds_ns < 1000:
        return f"{seconds_ns:.0f} ns"
    return f"{seconds_ns / 1000:.1f} µs"


def _best(row: dict[str, Any], name: str) -> float:
    return float(row["timings"][name]["best_ns"])


def _cell(row: dict[str, Any], name: str) -> str:
    t = row["timings"][name]
    return f"{_ns(t['best_ns'])} ({_ns(t['median_ns'])})"


def ratio(value: float, reference: float) -> str:
    r = value / reference
    return f"1/{1 / r:.0f}" if r < 0.1 else f"{r:.2f}x"


def call_tables(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for fn, title in (("total", "total_memory()"), ("available", "available_memory()")):
        floor = fn == "available"
        out += [f"**{title}** — per call, best of the interleaved rounds (median)", "",
                "| where the process is | levels (limited) | cgwatch | psutil.virtual_memory() "
                "| uncached walk | cgwatch / psutil | uncached / psutil |"
                + (" kept-fd reads alone / psutil |" if floor else ""),
                "|---|---|---|---|---|---|---|" + ("---|" if floor else "")]
        for row in rows:
            ps = _best(row, "psutil")
            out.append(
                f"| {row['name']} | {row['levels']} ({row['limited_levels']}) "
                f"| {_cell(row, f'cgwatch.{fn}')} | {_cell(row, 'psutil')} "
                f"| {_cell(row, f'uncached.{fn}')} "
                f"| {ratio(_best(row, f'cgwatch.{fn}'), ps)} "
                f"| {ratio(_best(row, f'uncached.{fn}'), ps)} |"
                + (f" {_ns(_best(row, 'floor.available'))}: "
                   f"{ratio(_best(row, 'floor.available'), ps)} |" if floor else ""))
            module = f"cgwatch.{fn} (module function)"
            if module in row["timings"]:
                out.append(f"| ↳ `cgwatch.{title}` (module function) | | {_cell(row, module)} "
                           f"| | | {ratio(_best(row, module), ps)} | |" + (" |" if floor else ""))
        out.append("")
    return out


# freshness columns: (title, candidate); a candidate missing from a row shows as "—"
FRESHNESS = (("default (read-your-writes)", "cgwatch.total"),
             ("fresh=False", "cgwatch.total (fresh=False)"),
             ("thread=False", "cgwatch.total (thread=False)"),
             ("confirm on every call (confirm_interval=0)", "cgwatch.total (confirm every call)"),
             ("floor: epoll_wait(0)", "floor.pending"),
             ("floor: pread /proc/self/cgroup", "floor.confirm"))


def _vs(row: dict[str, Any], name: str, reference: str) -> str:
    if name not in row["timings"]:
        return "—"
    return f"{_ns(_best(row, name))}: {ratio(_best(row, name), _best(row, reference))}"


def freshness_tables(rows: list[dict[str, Any]]) -> list[str]:
    """total_memory() in each freshness mode, and available_memory() against its floor."""
    if not any("floor.pending" in row["timings"] for row in rows):
        return []
    out = ["**total_memory() by freshness mode** — best per call: time, and ratio to "
           "psutil.virtual_memory() in the same rounds", "",
           "| where the process is | psutil.virtual_memory() | "
           + " | ".join(title for title, _ in FRESHNESS) + " |",
           "|---|---|" + "---|" * len(FRESHNESS)]
    for row in rows:
        out.append(f"| {row['name']} | {_ns(_best(row, 'psutil'))} | "
                   + " | ".join(_vs(row, name, "psutil") for _, name in FRESHNESS) + " |")
    out += ["", "**available_memory() against the kept-fd reads alone** — best per call: "
            "time, and ratio to the floor", "",
            "| where the process is | levels (limited) | kept-fd reads alone | default "
            "| fresh=False |", "|---|---|---|---|---|"]
    for row in rows:
        out.append(f"| {row['name']} | {row['levels']} ({row['limited_levels']}) "
                   f"| {_ns(_best(row, 'floor.available'))} "
                   f"| {_vs(row, 'cgwatch.available', 'floor.available')} "
                   f"| {_vs(row, 'cgwatch.available (fresh=False)', 'floor.available')} |")
    return out + [""]


def latency_table(latency: dict[str, Any]) -> list[str]:
    out = ["**limit write → total_memory() returns it**", "",
           "| poller | trials | p50 | p99 | max | > 5 ms | timeouts (1 s) |",
           "|---|---|---|---|---|---|---|"]
    for poller, s in latency.items():
        out.append(f"| {poller} | {s['trials']} | {s['p50_ms']:.2f} ms | {s['p99_ms']:.2f} ms "
                   f"| {s['max_ms']:.2f} ms | {s['over_5ms']} | {s['timeouts']} |")
    return out + [""]


def events_table(ev: dict[str, Any]) -> list[str]:
    if "skipped" in ev:
        return [f"OOM kill → Events callback: skipped ({ev['skipped']})", ""]
    out = ["**OOM kill in our cgroup → Events callback** (from the child's last allocation: "
           "includes the kernel's reclaim and kill)", "",
           f"mechanism: {ev['mechanism']}; trials without an event: {ev['missed']}; "
           f"events of an earlier trial arriving in the next (ignored): "
           f"{ev.get('stale_events', 0)}", "",
           "| what | trials | p50 | p99 | max |", "|---|---|---|---|---|"]
    for key, label in (("first_event", "first event delivered"),
                       ("oom_kill_event", "`oom_kill` event delivered"),
                       ("floor", "floor: bare thread on the kernel's notification, no cgwatch")):
        s = ev.get(key)
        if s:
            out.append(f"| {label} | {s['trials']} | {s['p50_ms']:.2f} ms | {s['p99_ms']:.2f} ms "
                       f"| {s['max_ms']:.2f} ms |")
    return out + [""]


def guard_table(row: dict[str, Any]) -> list[str]:
    out = [f"**Guard.check() per step** ({row['name']}, {row['levels']} levels) — per call, "
           "best of the interleaved rounds (median)", "",
           "| candidate | time | / available_memory() | / psutil.virtual_memory() |",
           "|---|---|---|---|"]
    for name in ("guard.check (far)", "guard.check (near, between samples)",
                 "guard.check (a sampling check)", "guard.check (near, per 10 ms step)",
                 "cgwatch.available", "psutil"):
        out.append(f"| {name} | {_cell(row, name)} | "
                   f"{ratio(_best(row, name), _best(row, 'cgwatch.available'))} | "
                   f"{ratio(_best(row, name), _best(row, 'psutil'))} |")
    return out + [""]


def misc_lines(results: dict[str, Any]) -> list[str]:
    out = []
    idle = results.get("idle")
    if idle:
        out.append(
            f"- idle {idle['seconds']:.0f} s: {idle['wakeups']} wake-ups of the cgwatch thread "
            f"(migration timer: {idle['timer_ticks_expected']}), "
            f"{idle['involuntary_switches']} preemptions, CPU {idle['cpu_ms']:.2f} ms "
            f"({idle['cpu_us_per_wakeup']:.0f} µs per wake-up)")
    for where, s in results.get("startup", {}).items():
        skipped = s.get("skipped", 0)
        out.append(f"- Monitor() start-up ({where}): best {s['best_ms']:.2f} ms, "
                   f"median {s['median_ms']:.2f} ms over {s['repeat']}"
                   + (f" ({skipped} skipped: a closed monitor's thread still running)"
                      if skipped else ""))
    rss = results.get("rss")
    if rss:
        out.append(
            f"- fresh interpreter (median of {rss['repeat']}): `import cgwatch` "
            f"{rss['import_ms']:.1f} ms, +{rss['rss_import_kib']:.0f} KiB RSS "
            f"(`import psutil` alone: {rss['psutil_import_ms']:.1f} ms, "
            f"+{rss['psutil_rss_import_kib']:.0f} KiB; cgwatch's own modules, its dependencies "
            f"already imported: {rss['own_import_ms']:.1f} ms, "
            f"+{rss['own_rss_import_kib']:.0f} KiB); first total+available call (starts "
            f"the monitor) {rss['first_call_ms']:.2f} ms, +{rss['rss_start_kib']:.0f} KiB RSS")
    return out + [""] if out else out


def _target(name: str, measured: Optional[float], limit: float, shown: str,
            why_skipped: str = "") -> dict[str, Any]:
    if measured is None:
        return {"target": name, "measured": why_skipped or "not measured", "result": "SKIP"}
    return {"target": name, "measured": shown, "value": measured, "limit": limit,
            "result": "PASS" if measured <= limit else "MISS"}


# The queries that keep the read-your-writes guarantee: the default monitor, the module
# function (the default monitor behind a global), and the thread-free monitor.
FRESH_TOTALS = ("cgwatch.total", "cgwatch.total (module function)",
                "cgwatch.total (thread=False)")


def _worst_total(rows: dict[str, dict[str, Any]], names: tuple[str, ...], limit: float,
                 title: str) -> dict[str, Any]:
    """The worst total_memory() / psutil ratio over the rows and candidates `names`."""
    ratios = [(_best(r, name) / _best(r, "psutil"), f"{r['name']}, {name}")
              for r in rows.values() for name in names if name in r["timings"]]
    if not ratios:
        return _target(title, None, limit, "", "this cgwatch has no such mode")
    worst, where = max(ratios)
    return _target(title, worst, limit, f"1/{1 / worst:.0f} ({where})")


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = {r["name"]: r for r in results["calls"]}
    out = []
    out.append(_worst_total(rows, FRESH_TOTALS, TOTAL_FRESH_RATIO,
                            "total_memory() <= 1/30 of psutil, read-your-writes (worst row)"))
    out.append(_worst_total(rows, ("cgwatch.total (fresh=False)",), TOTAL_TRUSTED_RATIO,
                            "total_memory() <= 1/300 of psutil, fresh=False (worst row)"))
    one = rows.get("depth 1, leaf limited")
    r = None if one is None else _best(one, "cgwatch.available") / _best(one, "psutil")
    out.append(_target("available_memory(), one limited level <= 0.3x psutil", r,
                       AVAILABLE_RATIO, f"{r:.3f}x" if r is not None else "",
                       "no cgroups made"))
    r = None if one is None else _best(one, "cgwatch.available") / _best(one, "floor.available")
    out.append(_target("available_memory(), one limited level <= 1.2x kept-fd reads alone", r,
                       AVAILABLE_FLOOR_RATIO, f"{r:.3f}x" if r is not None else "",
                       "no cgroups made"))
    ten = rows.get("depth 10, leaf limited")
    grow = None
    if one is not None and ten is not None:
        grow = _best(ten, "cgwatch.available") / _best(one, "cgwatch.available") - 1
    out.append(_target("unlimited ancestors add nothing measurable (9 more, <= +5%)", grow,
                       ANCESTOR_NOISE, f"{grow * 100:+.1f}%" if grow is not None else "",
                       "no cgroups made"))
    spin = results.get("latency", {}).get("spin")
    p99 = None if spin is None else spin["p99_ms"]
    out.append(_target("limit write -> new value, p99 <= 5 ms (spin poller)", p99,
                       LATENCY_P99_MS, f"{p99:.2f} ms" if p99 is not None else "",
                       "no cgroups made"))
    calm = results.get("latency", {}).get("yield")
    p99 = None if calm is None else calm["p99_ms"]
    out.append(_target("(for reference) the same with the yield poller", p99, LATENCY_P99_MS,
                       f"{p99:.2f} ms" if p99 is not None else "", "no cgroups made"))
    idle = results.get("idle")
    extra = None if idle is None else float(idle["wakeups_beyond_timer"])
    out.append(_target("idle: 0 wake-ups beyond the migration timer", extra, 0.0,
                       f"{extra:.0f} extra" if extra is not None else "", "skipped (--quick)"))
    g = results.get("guard")
    far = None if g is None else _best(g, "guard.check (far)") / _best(g, "cgwatch.available")
    out.append(_target("Guard.check() far from thresholds <= 1.5x available_memory()", far,
                       GUARD_FAR_RATIO, f"{far:.2f}x" if far is not None else "",
                       "no cgroups made"))
    near = None if g is None else _best(g, "guard.check (near, per 10 ms step)") / 1e9
    out.append(_target("Guard.check() near thresholds <= 1% of a 10 ms step (100 µs)", near,
                       GUARD_STEP_SECONDS, f"{near * 1e6:.1f} µs" if near is not None else "",
                       "no cgroups made"))
    checks = all(r["check"]["total_equal"] and r["check"]["available_close"]
                 for r in results["calls"])
    out.append({"target": "answers agree with the uncached walk",
                "measured": "all rows" if checks else "MISMATCH (see JSON: calls[].check)",
                "result": "PASS" if checks else "MISS"})
    return out


def target_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| target | measured | result |", "|---|---|---|"]
    out += [f"| {t['target']} | {t['measured']} | {t['result']} |" for t in rows]
    return out + [""]


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [f"`{meta['command']}` — {meta['when']}, {meta['machine']}", ""]
    lines += call_tables(results["calls"])
    lines += freshness_tables(results["calls"])
    if results.get("latency"):
        lines += latency_table(results["latency"])
    if results.get("events_latency"):
        lines += events_table(results["events_latency"])
    if results.get("guard"):
        lines += guard_table(results["guard"])
    lines += misc_lines(results)
    lines += target_table(results["targets"])
    return "\n".join(lines)
