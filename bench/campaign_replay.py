"""Each guarded run of the real campaign (bench/campaign.py), replayed through the decision.

Every guarded run records its guard's checks (`Guard(record=...)`, `GuardCallback(record=...)`,
`cgwatch run --guard --record`): the campaign replays each record with the options it was
recorded with (cgwatch/guardreplay.py, the same code as `cgwatch replay FILE`) and keeps
whether every decision came out as it did live, and the first stop's trigger both ways. The
table counts the runs that agree and names each that does not, with the replay's own words:
issue 33's "every run of the real campaign, replayed through the same decision, agrees with
what it did live; where they differ, say why".
"""

from __future__ import annotations

from typing import Any

from cgwatch.guardrecord import parse_record
from cgwatch.guardreplay import replay

MISMATCHES_KEPT = 3  # of a run that differs: its first few differences, in the replay's words


def replayed(path: str) -> dict[str, Any]:
    """What replaying the record at `path` found: `agree` (every decision as live), `checks`,
    `samples`, `stop` (the replayed first stop's trigger, "" for none), `live_stop` (the
    live record's first stop's trigger), `mismatches`, `cut`; or `absent` with why (no
    record: the job died before its guard began, or wrote none)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = parse_record(f)
    except OSError as e:
        return {"absent": e.strerror or str(e)}
    except ValueError as e:
        return {"absent": f"not a record: {e}"}
    result = replay(record, mismatches_kept=MISMATCHES_KEPT)
    first = result.first_stop
    live_stop = next((fields.get("trigger", "") for _, fields in result.live
                      if fields.get("stop")), "")
    return {"agree": result.exact and not result.mismatches, "exact": result.exact,
            "checks": result.checks, "samples": result.samples,
            "stop": first.trigger if first is not None else "", "live_stop": live_stop,
            "mismatches": result.mismatches, "cut": result.cut}


def summary(records: list[dict[str, Any]]) -> list[str]:
    """The table's lines on the replays: how many agree, and each run that does not."""
    guarded = [r for r in records if r.get("way") != "none"]
    if not guarded:
        return []
    done, missing = [], []  # replayed; left no record (or never replayed)
    for r in guarded:
        found = r.get("replay")
        (done if isinstance(found, dict) and "absent" not in found else missing).append(r)
    agree = [r for r in done if r["replay"]["agree"]]
    checks = sum(r["replay"]["checks"] for r in done)
    lines = [f"Replayed through the decision (cgwatch/guardreplay.py, as `cgwatch replay`): "
             f"{len(agree)} of {len(done)} guarded runs' records agree with every live "
             f"decision ({checks:,} checks); {len(missing)} runs left no record."]
    for r in done:
        if not r["replay"]["agree"]:
            first = "; ".join(r["replay"]["mismatches"][:MISMATCHES_KEPT]) or "not exact"
            lines.append(f"- differs: {_run_name(r)}: {first}")
    for r in missing:
        why = (r.get("replay") or {}).get("absent", "not replayed")
        lines.append(f"- no record: {_run_name(r)}: {why}")
    return lines


def _run_name(r: dict[str, Any]) -> str:
    """A run as the table's lines name it: framework, shape, (way, load)."""
    return f"{r.get('framework', 'plain')} {r['shape']!r} ({r['way']}, {r['load']})"
