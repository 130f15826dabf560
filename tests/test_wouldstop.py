"""The judge of observe mode's would-be stops (cgwatch/wouldstop.py) as a table: a stop, what
followed (the kills, the end, the time of judging) -> false, needed (with the lead it had) or
open; and the episodes a guard's verdicts make."""

from __future__ import annotations

from typing import NamedTuple, Optional

import pytest

from cgwatch.policy import OK, RESERVE, Verdict
from cgwatch.wouldstop import (
    FALSE,
    NEEDED,
    OPEN,
    Episodes,
    WouldStop,
    counts,
    describe,
    judge,
    summary_line,
)


class Row(NamedTuple):
    stop: WouldStop
    kills: list[float]
    ended: Optional[float]
    now: float
    judged: str
    lead_had: Optional[float] = None


# Every stop is at t=100 s with a lead of 6 s (a 4 s save x 1.5).
def at100(cleared: Optional[float] = None) -> WouldStop:
    return WouldStop(100.0, 6.0, RESERVE, "/job", 40, cleared)


ROWS = [
    # A leak met by the forecast: the stop stands, the kill 5 s later: within the lead.
    pytest.param(Row(at100(), [105.0], 105.0, 105.0, NEEDED, 5.0), id="leak-killed-in-lead"),
    # A slow leak met by the reserve: the stop stands 2 h until the kill: needed, 7200 s.
    pytest.param(Row(at100(), [7300.0], 7300.0, 7300.0, NEEDED, 7200.0),
                 id="stood-until-a-late-kill"),
    # A sawtooth's peak: the stop clears 0.5 s later, the job finishes an hour later.
    pytest.param(Row(at100(100.5), [], 3700.0, 3700.0, FALSE), id="peak-then-finished"),
    # The stop stands until the job finishes (near its limit, never reaching it): false.
    pytest.param(Row(at100(), [], 400.0, 400.0, FALSE), id="stood-then-finished"),
    # Cleared at 101, killed at 104: within the lead of 6 s, so the stop was needed.
    pytest.param(Row(at100(101.0), [104.0], 104.0, 104.0, NEEDED, 4.0),
                 id="cleared-but-killed-in-lead"),
    # Cleared at 101, killed at 300: it stayed under its limit 200 s > 6 s: false (the kill
    # is the next episode's to judge).
    pytest.param(Row(at100(101.0), [300.0], 300.0, 300.0, FALSE), id="cleared-late-kill"),
    # A kill before the stop (the one that made the OOM_KILL trigger fire) is not after it.
    pytest.param(Row(at100(), [99.0], 500.0, 500.0, FALSE), id="kill-before-the-stop"),
    # The job runs on: the stop stands -> open; cleared 2 s after it, now 103 < 106 -> open.
    pytest.param(Row(at100(), [], None, 150.0, OPEN), id="running-standing"),
    pytest.param(Row(at100(102.0), [], None, 103.0, OPEN), id="running-cleared-in-lead"),
    # Cleared, now 107 > 100 + 6 with no kill: false already while the job runs.
    pytest.param(Row(at100(102.0), [], None, 107.0, FALSE), id="running-cleared-past-lead"),
    # A kill exactly at the lead's end counts as within it (<=).
    pytest.param(Row(at100(100.2), [106.0], None, 106.0, NEEDED, 6.0), id="kill-at-lead-end"),
    # Two kills after: the first decides.
    pytest.param(Row(at100(), [120.0, 110.0], 120.0, 120.0, NEEDED, 10.0),
                 id="first-kill-decides"),
]


@pytest.mark.parametrize("row", ROWS)
def test_judge(row: Row) -> None:
    judged = judge(row.stop, row.kills, row.ended, row.now)
    assert (judged.judged, judged.lead_had) == (row.judged, row.lead_had)
    assert judged.stop is row.stop


def stop(at: float) -> Verdict:
    return Verdict(True, RESERVE, "/job", lead=6.0, step=int(at))


def go(at: float) -> Verdict:
    return Verdict(False, OK, lead=6.0, step=int(at))


def test_episodes_one_per_stretch_of_stops() -> None:
    """go, stop, stop, go, stop: two episodes, the first cleared at the go at t=3."""
    episodes = Episodes()
    started = [episodes.add(t, v) for t, v in
               [(1.0, go(1)), (2.0, stop(2)), (2.5, stop(2)), (3.0, go(3)), (4.0, stop(4))]]
    assert started == [False, True, False, False, True]
    assert episodes.stops == [WouldStop(2.0, 6.0, RESERVE, "/job", 2, 3.0),
                              WouldStop(4.0, 6.0, RESERVE, "/job", 4, None)]
    assert episodes.current == WouldStop(4.0, 6.0, RESERVE, "/job", 4, None)


def test_episodes_bounded() -> None:
    """Past `kept`, an episode is counted, not kept; the one going on is still known."""
    episodes = Episodes(kept=2)
    for t in range(5):
        episodes.add(2.0 * t, stop(2 * t))
        episodes.add(2.0 * t + 1, go(2 * t + 1))
    episodes.add(10.0, stop(10))
    assert [s.at for s in episodes.stops] == [0.0, 2.0]
    assert (episodes.dropped, episodes.current is not None) == (4, True)


def test_counts_and_summary() -> None:
    judged = [judge(at100(100.5), [], 3700.0, 3700.0),
              judge(at100(), [105.0], 105.0, 105.0),
              judge(at100(), [], None, 101.0)]
    assert counts(judged) == {FALSE: 1, NEEDED: 1, OPEN: 1}
    assert summary_line(judged) == ("cgwatch guard (observe): 3 would-be stop(s): 1 false, "
                                    "1 needed, 1 open; the needed had 5.0 s before the kill")
    assert summary_line([]) == "cgwatch guard (observe): no would-be stop"
    assert [describe(j) for j in judged] == ["false", "needed, 5.0 s before the kill", "open"]
