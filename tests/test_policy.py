"""The guard's policy (cgwatch/policy.py) as tables: which readings make it stop, which trigger
it names and in what order; the PSI stall share (the PSI file's parser is
values.parse_pressure, tested in tests/test_values.py); the throttling clock. The levels are
a Slurm-like job (/job 4 GiB) inside a node's slice (/ 16 GiB)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import pytest

from cgwatch.forecast import Trend
from cgwatch.policy import (
    EXIT_STATUS,
    FORECAST,
    OK,
    OOM_KILL,
    RESERVE,
    THROTTLE,
    LargestRise,
    Reading,
    Throttling,
    Verdict,
    decide,
    save_seconds,
    stall_share,
)

MiB = 1 << 20
GiB = 1 << 30
FLAT = Trend(0.0, 1 * GiB, 12)


def job(headroom: int, trend: Trend = FLAT, high: Optional[int] = None,
        throttled_for: float = 0.0) -> Reading:
    return Reading("/job", 4 * GiB, headroom, trend, high, throttled_for)


def node(headroom: int, trend: Trend = FLAT) -> Reading:
    return Reading("/", 16 * GiB, headroom, trend)


class Row(NamedTuple):
    readings: list[Reading]
    trigger: str
    level: str
    share: Optional[float] = 0.05  # reserve: 5% of each limit (/job: 204.8 MiB; /: 819.2 MiB)
    killed: int = 0


ROWS = [
    pytest.param(Row([job(2 * GiB), node(10 * GiB)], OK, ""), id="far-from-everything"),
    # 200 MiB < 204.8 MiB (5% of 4 GiB).
    pytest.param(Row([job(200 * MiB), node(10 * GiB)], RESERVE, "/job"), id="reserve-job"),
    pytest.param(Row([job(210 * MiB), node(10 * GiB)], OK, ""), id="just-above-reserve"),
    # The node's 5% is 819.2 MiB: its 800 MiB is below, though the job has 1 GiB.
    pytest.param(Row([job(1 * GiB), node(800 * MiB)], RESERVE, "/"), id="reserve-parent"),
    # 250 MiB < the 256 MiB given in bytes (the share would be 204.8 MiB: not below it).
    pytest.param(Row([job(250 * MiB)], RESERVE, "/job", share=None), id="reserve-bytes"),
    # Growing 10 MiB/s with its peak at 3 GiB: 1 GiB left -> 102.4 s, under the 90 s lead?
    # No: over it, so no stop; at 20 MiB/s, 51.2 s < 90 s: stop.
    pytest.param(Row([job(1 * GiB, Trend(10.0 * MiB, 3 * GiB, 12))], OK, ""),
                 id="leak-slower-than-a-save"),
    pytest.param(Row([job(1 * GiB, Trend(20.0 * MiB, 3 * GiB, 12))], FORECAST, "/job"),
                 id="leak-faster-than-a-save"),
    # Both levels forecast: the sooner one is named (/: 2 GiB left at 40 MiB/s = 51 s).
    pytest.param(Row([job(1 * GiB, Trend(12.0 * MiB, 3 * GiB, 12)),
                      node(2 * GiB, Trend(40.0 * MiB, 14 * GiB, 12))], FORECAST, "/"),
                 id="sooner-level-named"),
    pytest.param(Row([job(2 * GiB)], OOM_KILL, "/job", killed=1), id="worker-killed"),
    # Order: the reserve before the kill before the forecast.
    pytest.param(Row([job(100 * MiB, Trend(20.0 * MiB, 3 * GiB, 12))], RESERVE, "/job",
                     killed=1), id="reserve-first"),
    pytest.param(Row([job(1 * GiB, Trend(20.0 * MiB, 3 * GiB, 12))], OOM_KILL, "/job",
                     killed=2), id="kill-before-forecast"),
    # Throttled 30 s of the 30 s asked: stop; 29 s: not yet; a level without high: never.
    pytest.param(Row([job(2 * GiB, high=3 * GiB, throttled_for=30.0)], THROTTLE, "/job"),
                 id="throttled-long-enough"),
    pytest.param(Row([job(2 * GiB, high=3 * GiB, throttled_for=29.0)], OK, ""),
                 id="throttled-not-long-enough"),
    pytest.param(Row([job(2 * GiB, throttled_for=60.0)], OK, ""), id="no-high-no-throttle"),
    pytest.param(Row([], OK, ""), id="no-limited-level"),
]


@pytest.mark.parametrize("row", ROWS)
def test_decide(row: Row) -> None:
    verdict = decide(row.readings, reserve=256 * MiB, share=row.share, lead=90.0,
                     throttle_seconds=30.0, killed=row.killed, step=7)
    assert (verdict.trigger, verdict.level) == (row.trigger, row.level)
    assert verdict.stop is (row.trigger != OK)
    assert bool(verdict) is verdict.stop
    assert verdict.step == 7 and verdict.lead == 90.0


def test_no_forecast_at_a_depth_the_job_came_back_from() -> None:
    """The leak-faster-than-a-save row (20 MiB/s, 1 GiB left: 51.2 s < 90 s) at a depth the
    job came back from (`trusted`): no forecast; the reserve still stops it (100 MiB left
    of a 256 MiB reserve), and a kill still does."""
    fast = [job(1 * GiB, Trend(20.0 * MiB, 3 * GiB, 12))]
    low = [job(100 * MiB, Trend(20.0 * MiB, 3 * GiB, 12))]
    def trigger(readings: list[Reading], trusted: bool, killed: int = 0) -> str:
        return decide(readings, reserve=256 * MiB, lead=90.0, throttle_seconds=30.0,
                      killed=killed, trusted=trusted).trigger

    assert trigger(fast, False) == FORECAST
    assert trigger(fast, True) == OK
    assert trigger(low, True) == RESERVE
    assert trigger(fast, True, killed=1) == OOM_KILL


def test_came_back_is_no_deeper_than_a_turn() -> None:
    """A sawtooth in MiB of available: 500 -> 300 (a climb of 200) -> back to 420 (120 back,
    over half of 200: a turn at 300). At 300 or above it came back from there; at 299 it
    is deeper; before any turn, never."""
    rise = LargestRise()
    assert not rise.came_back(300 * MiB)
    for i, available in enumerate((500, 400, 300, 420)):
        rise.update(available * MiB, 512 * MiB, float(i))
    assert rise.turns == [(300 * MiB, 120 * MiB)]
    assert rise.came_back(300 * MiB) and rise.came_back(450 * MiB)
    assert not rise.came_back(299 * MiB) and not rise.came_back(None)


def test_forecast_verdict_carries_the_figures() -> None:
    """20 MiB/s, peak 3 GiB of 4 GiB: 1024 / 20 = 51.2 s left."""
    verdict = decide([job(1 * GiB, Trend(20.0 * MiB, 3 * GiB, 12))], lead=90.0,
                     throttle_seconds=30.0, step=1200)
    assert verdict.seconds_left == pytest.approx(51.2)
    assert (verdict.limit, verdict.headroom, verdict.growth) == (4 * GiB, 1 * GiB, 20.0 * MiB)
    assert verdict.message() == (
        "cgwatch guard: save and stop at step 1200: cgroup /job: predicted to reach its "
        "limit in ~51 s (working set growing 20.0 MiB/s, headroom 1.0 GiB of 4.0 GiB), "
        "within the guard's lead of ~90 s")


def test_the_largest_rise_widens_the_reserve() -> None:
    """5% of 4 GiB (204.8 MiB) + 300 MiB kept for the job's largest piece: 400 MiB left is
    under the 504.8 MiB; 600 MiB is not."""
    tight = decide([job(400 * MiB)], share=0.05, lead=3.0, throttle_seconds=30.0,
                   rise=300 * MiB)
    assert (tight.trigger, tight.reserve, tight.rise) == (
        RESERVE, int(4 * GiB * 0.05) + 300 * MiB, 300 * MiB)
    assert not decide([job(600 * MiB)], share=0.05, lead=3.0, throttle_seconds=30.0,
                      rise=300 * MiB).stop


RISES = [
    # available_memory() at each check (MiB) -> the largest piece taken twice (MiB). A piece
    # is one climb: the fall over checks that each fell by more than 1 MiB, known once a
    # check does not fall; twice: the same size again, within 1/8.
    pytest.param([1000, 1000, 1000], 0, id="flat"),
    pytest.param([1000, 800, 800, 800], 0, id="one-step-is-no-pattern"),
    pytest.param([1000, 780, 780, 560, 560, 340, 340], 220, id="stairs"),
    # the same stairs with no check between them are one climb, still going: the forecast's
    pytest.param([1000, 780, 560, 340], 0, id="a-climb-still-going-is-no-piece"),
    # the campaign's false stop: a start-up allocation at ~1 GB/s read by `run --guard`'s
    # 0.1 s checks as three falls of 100 MiB, then flat: one piece, taken once
    pytest.param([500, 400, 300, 200, 200, 200], 0, id="a-fast-start-up-is-one-piece"),
    # a start-up allocation (200), then an evaluation's buffers (120) and their free: two
    # pieces taken once each (the second largest made 120 the piece: the spike stopped)
    pytest.param([500, 400, 300, 300, 240, 180, 180, 300], 0,
                 id="a-start-up-and-an-evaluation-are-two-pieces"),
    pytest.param([500, 400, 300, 300, 240, 180, 180, 300, 300, 240, 180, 180], 120,
                 id="the-evaluation-again-is-a-pattern"),
    # the imports (60 MiB once) and a model load (240): no pattern
    pytest.param([1000, 940, 940, 700, 700], 0, id="two-pieces-taken-once-each"),
    # the imports once, then pieces of 20 MiB with a check between each
    pytest.param([1000, 940, 940, 920, 920, 900, 900], 20, id="start-up-then-pieces"),
    # a sawtooth's piece is its ramp, known at its drop
    pytest.param([1000, 940, 880, 820, 1000, 940, 880], 0, id="sawtooth-one-ramp-seen"),
    pytest.param([1000, 940, 880, 820, 1000, 940, 880, 820, 1000], 180,
                 id="sawtooth-ramps-are-the-pieces"),
    pytest.param([1000, 1200, 1100, 1100, 1000, 1000], 100, id="a-free-then-two-rises"),
    pytest.param([1000, 900, 900, 812, 812], 88, id="the-same-within-an-eighth"),
    pytest.param([1000, 900, 900, 815, 815], 0, id="not-the-same-beyond-an-eighth"),
    # the price: a climb paused for one check (the job descheduled under load) is two
    # pieces, the same piece twice if it paused halfway
    pytest.param([1000, 900, 900, 800, 800], 100, id="a-climb-paused-halfway"),
    # falls of 1 MiB or less are noise: they neither make nor end a piece
    pytest.param([1000, 999.5, 1000, 999.5, 1000], 0, id="noise"),
    pytest.param([1000, 900, 899.5, 899.5, 800, 799.5, 799.5], 99.5,
                 id="a-piece-ends-at-a-check-within-the-noise"),
]


@pytest.mark.parametrize(("available", "want"), RISES)
def test_largest_rise(available: list[float], want: float) -> None:
    rise = LargestRise()
    for i, a in enumerate(available):  # one check a second: each pause is a second long
        rise.update(int(a * MiB), 2 * GiB, float(i))
    assert rise.largest == int(want * MiB)


def _held(seconds: float, *parts: tuple[float, int]) -> list[tuple[float, float]]:
    """(time, MiB) checks `seconds` apart: each part is (MiB, how many checks at it)."""
    out: list[tuple[float, float]] = []
    for mib, count in parts:
        out += [((len(out) + k) * seconds, mib) for k in range(count)]
    return out


def _climb(start: float, per_check: float, checks: int) -> list[tuple[float, int]]:
    """`_held`'s parts of a climb from `start` MiB: `checks` checks each `per_check` MiB
    lower (the first of them the first fall)."""
    return [(start - per_check * k, 1) for k in range(1, checks + 1)]


HELD = [
    # checks closer than the 0.3 s hold: a check that does not fall inside an allocation is a
    # pause, not its end; a give-back or a pause of 0.3 s is
    pytest.param(_held(0.1, (1000, 1), (900, 2), (800, 4)), 0,
                 id="a-climb-paused-for-one-check-is-one-piece"),
    pytest.param(_held(0.1, (1000, 1), (900, 4), (800, 4), (700, 4)), 100,
                 id="stairs-paused-longer-than-the-hold"),
    # the campaign's eval spike under the CPU hog (a check a 10 ms step): the loop caught up
    # after a stall, and two checks in a row allocated nothing halfway up the 0.5 s climb:
    # two halves of ~120 MiB, the same piece "twice", stopped the first spike at its top
    pytest.param(_held(0.01, (500, 1), (476, 1), (452, 1), (428, 1), (404, 1), (380, 3),
                       (356, 1), (332, 1), (308, 1), (284, 1), (260, 150)), 0,
                 id="an-evaluation-s-climb-with-a-pause-is-one-piece"),
    pytest.param(_held(0.01, (500, 1), (440, 50), (380, 50), (320, 50)), 60,
                 id="stairs-a-check-a-10-ms-step"),
    pytest.param(_held(0.1, (1000, 1), (940, 1), (880, 1), (820, 1), (1000, 1), (940, 1),
                       (880, 1), (820, 1), (1000, 1)), 180,
                 id="a-give-back-ends-a-climb-at-once"),
    # issue 32's 8 GiB sawtooth under `run --guard`: a 2 s climb of 10 MiB a check, the job
    # descheduled 0.8 s twice on the way (a fixed 0.3 s hold cut it into three pieces of
    # 200 MiB, "taken twice"): a pause under half the climb's time does not end it; the
    # flat after it (4 s) does: one piece of 600 MiB, taken once
    pytest.param(_held(0.1, (1000, 1), *_climb(1000, 10, 20), (800, 8), *_climb(800, 10, 20),
                       (600, 8), *_climb(600, 10, 20), (400, 40)), 0,
                 id="a-long-climb-paused-by-a-descheduled-job-is-one-piece"),
    # stairs taken over a second each (10 MiB a check), 2 s flats: each flat is long against
    # its stair (a 0.9 s climb waits 0.45 s) and ends it
    pytest.param(_held(0.1, (1000, 1), *_climb(1000, 10, 10), (900, 20), *_climb(900, 10, 10),
                       (800, 20), *_climb(800, 10, 10), (700, 20)), 100,
                 id="stairs-taken-over-a-second-each-end-at-their-flats"),
    # the price: a pause of 0.6 s in a 0.9 s climb is over half of it, two pieces
    pytest.param(_held(0.1, (1000, 1), *_climb(1000, 10, 10), (900, 6), *_climb(900, 10, 10),
                       (800, 20)), 100,
                 id="a-pause-over-half-the-climb-ends-it"),
]


@pytest.mark.parametrize(("checks", "want"), HELD)
def test_largest_rise_holds_a_climb_through_a_short_pause(
        checks: list[tuple[float, float]], want: float) -> None:
    rise = LargestRise()
    for now, a in checks:
        rise.update(int(a * MiB), 2 * GiB, now)
    assert rise.largest == int(want * MiB)


def test_largest_rise_remembers_a_bounded_number_of_pieces() -> None:
    """A piece of 500 MiB, then 32 of 20 MiB (the pattern: 20 MiB): the 500 MiB piece again
    is no longer matched (32 pieces kept, whatever the run time)."""
    rise = LargestRise()
    available = 2000 * MiB
    now = 0.0
    rise.update(available, 2 * GiB, now)
    for piece in [500] + [20] * 32 + [500]:
        available -= piece * MiB
        rise.update(available, 2 * GiB, now + 1)
        rise.update(available, 2 * GiB, now + 2)  # the plateau ends the piece
        available += piece * MiB
        rise.update(available, 2 * GiB, now + 3)  # and it is freed
        now += 3
    assert rise.largest == 20 * MiB


# available_memory() at each check (MiB, None: a check whose figure was no guarded level's,
# e.g. the job not yet in its limited cgroup, or the host's MemAvailable lower), the limit of
# the level that bounded it (MiB) -> the largest piece, and the room the next piece needs at
# the last check (MiB)
BOUND_RISES = [
    # the host's figure swings by another job's 300 MiB sawtooth, then the job enters its
    # 512 MiB cgroup: nothing of that is the job's (the campaign's false stop); its own
    # pieces of 10 MiB, a check apart, are
    pytest.param([(20000, None), (19700, None), (20000, None), (19700, None), (500, 512),
                  (490, 512), (490, 512), (480, 512), (480, 512)], (10, 10),
                 id="host-swings-then-the-cgroup"),
    # a host figure above the limit cannot be the level's headroom
    pytest.param([(900, 512), (600, 512), (600, 512), (300, 512), (300, 512)], (0, 0),
                 id="above-the-limit"),
    # a sawtooth whose ramp is 240 MiB: once it has come back from 260 MiB, its peaks are no
    # new depth: no room beyond the reserve there; stairs never come back: the whole piece
    pytest.param([(500, 512), (440, 512), (380, 512), (320, 512), (260, 512), (500, 512),
                  (440, 512), (380, 512), (320, 512), (260, 512), (500, 512), (440, 512),
                  (380, 512), (320, 512), (260, 512)], (240, 0),
                 id="sawtooth-peak-is-a-known-depth"),
    pytest.param([(500, 512), (440, 512), (380, 512), (320, 512), (260, 512), (500, 512),
                  (440, 512), (380, 512), (320, 512), (260, 512), (500, 512), (440, 512),
                  (380, 512), (320, 512), (260, 512), (140, 512), (15, 512)], (240, 240),
                 id="sawtooth-then-beyond-its-depth-by-a-piece"),
    pytest.param([(500, 512), (440, 512), (440, 512), (380, 512), (380, 512), (320, 512),
                  (320, 512)], (60, 60), id="stairs"),
    # a drift within the noise and a jitter of 1 MiB on a stair are no coming back: a depth
    # is one the job came back from when it gave back half the climb that reached it
    pytest.param([(500, 512), (440, 512), (440, 512), (439.5, 512), (440.5, 512), (380, 512),
                  (380, 512), (320, 512), (320, 512)], (60, 60), id="stairs-with-noise"),
    # a model load (300 MiB), then an evaluation's 60 MiB twice: the evaluation's depth is
    # one the job came back from (it gave back the 60 MiB that reached it), so its second
    # top needs no room (half the largest climb, 150 MiB, was never given back)
    pytest.param([(500, 512), (350, 512), (200, 512), (200, 512), (140, 512), (140, 512),
                  (200, 512), (200, 512), (140, 512), (140, 512)], (60, 0),
                 id="a-model-then-an-evaluation-twice"),
    # the campaign's Lightning "ramp, then 2 s sawtooth" under `run --guard` (1.5 GiB,
    # checks 0.1 s apart): the start-up and the first ramp are one climb of 746 MiB to its
    # deepest peak, which gives back 346 MiB (not half of 746); every later ramp of 336 MiB
    # stops 10 MiB short of that peak and gives back all of it: those peaks are depths the
    # job came back from, and a peak needs no room (it was stopped there, 2 of 8 runs)
    pytest.param([(1271, 1536)] + [(1271 - 30 * i, 1536) for i in range(1, 25)]
                 + [(525, 1536), (525, 1536), (871, 1536)]
                 + [(871 - 48 * i, 1536) for i in range(1, 8)]
                 + [(535, 1536), (871, 1536)]
                 + [(871 - 48 * i, 1536) for i in range(1, 8)]
                 + [(535, 1536), (871, 1536)]
                 + [(871 - 48 * i, 1536) for i in range(1, 8)] + [(535, 1536)],
                 (336, 0), id="a-start-up-into-the-first-ramp-then-shallower-peaks"),
    # the guard's sample at a sawtooth's top can find no level bounding the figure (the job
    # freed between the sample's two reads): such figures are skipped, and the drop after
    # the top is still the job coming back from it
    pytest.param([(500, 512), (440, 512), (380, 512), (320, 512), (260, 512), (260, 512),
                  (260, None), (500, None), (500, 512), (440, 512), (380, 512), (320, 512),
                  (260, 512), (260, 512), (260, None), (500, None), (500, 512), (440, 512),
                  (380, 512), (320, 512), (260, 512), (260, 512)], (240, 0),
                 id="a-free-between-the-samples-reads"),
    # stairs of 100 MiB with a jitter on each (4 MiB back, a climb of 3 MiB that stops
    # short of the stair, given back): a jitter is no coming back from a depth (less than
    # half a stair): the whole piece
    pytest.param([(500, 512), (400, 512), (400, 512), (404, 512), (401, 512), (404, 512),
                  (300, 512), (300, 512), (304, 512), (301, 512), (304, 512), (200, 512),
                  (200, 512), (204, 512), (201, 512), (204, 512)], (104, 104),
                 id="stairs-with-a-jitter"),
    # a new limit (the job moved, or resized): the depths known are of the old one
    pytest.param([(500, 512), (440, 512), (440, 512), (380, 512), (380, 512), (500, 512),
                  (440, 512), (440, 512), (380, 512), (380, 512), (900, 1024), (840, 1024),
                  (840, 1024)], (60, 60), id="a-new-limit"),
]


@pytest.mark.parametrize(("checks", "want"), BOUND_RISES)
def test_largest_rise_learns_only_a_guarded_levels_figure(
        checks: list[tuple[float, Optional[int]]], want: tuple[int, int]) -> None:
    rise = LargestRise()
    for i, (available, limit) in enumerate(checks):  # one check a second
        rise.update(int(available * MiB), None if limit is None else limit * MiB, float(i))
    assert (rise.largest, rise.room(int(checks[-1][0] * MiB))) == (want[0] * MiB,
                                                                    want[1] * MiB)


def test_a_known_depth_without_the_new_limit() -> None:
    """The control of "a-new-limit": the same sawtooth of stairs, no new limit: at 380 MiB
    the job came back from that depth, so no room beyond the reserve."""
    rise = LargestRise()
    for i, available in enumerate((500, 440, 440, 380, 380, 500, 440, 440, 380, 380)):
        rise.update(available * MiB, 512 * MiB, float(i))
    assert (rise.largest, rise.room(380 * MiB)) == (60 * MiB, 0)


SAVES = [
    # (timed saves, configured, checkpoint bytes, write rate) -> seconds
    pytest.param(([3.0, 7.0], 60.0, None, 100 * MiB), 7.0, id="timed-saves-first"),
    pytest.param(([], 60.0, None, 100 * MiB), 60.0, id="the-users-figure"),
    # No size known: the 1 s floor (was the working set, 1 GiB at 100 MiB/s = 10.24 s; the
    # working set is no checkpoint's size: issue 32, design section 15)
    pytest.param(([], None, None, 100 * MiB), 1.0, id="no-size-the-floor"),
    pytest.param(([], None, 2 * GiB, 100 * MiB), 20.48, id="checkpoint-size-over-rate"),
    pytest.param(([], None, 20 * MiB, 100 * MiB), 1.0, id="at-least-1-s"),
]


@pytest.mark.parametrize(("args", "want"), SAVES)
def test_save_seconds(args: tuple, want: float) -> None:  # type: ignore[type-arg]
    assert save_seconds(*args) == pytest.approx(want)


MESSAGES = [
    pytest.param(Verdict(True, RESERVE, "/job", 4 * GiB, 200 * MiB, 256 * MiB, step=3),
                 "cgwatch guard: save and stop at step 3: cgroup /job: headroom 200.0 MiB of "
                 "4.0 GiB, below the reserve of 256.0 MiB", id="reserve"),
    pytest.param(Verdict(True, RESERVE, "/job", 4 * GiB, 400 * MiB, 504 * MiB, rise=300 * MiB),
                 "cgwatch guard: save and stop: cgroup /job: headroom 400.0 MiB of 4.0 GiB, "
                 "below the reserve of 504.0 MiB (204.0 MiB, plus room for the job's largest "
                 "rise, 300.0 MiB)", id="reserve-with-rise"),
    pytest.param(Verdict(True, OOM_KILL, "/job", 4 * GiB, 2 * GiB, killed=1),
                 "cgwatch guard: save and stop: cgroup /job: the OOM killer killed 1 "
                 "process(es) on the path", id="kill"),
    pytest.param(Verdict(True, THROTTLE, "/job", 4 * GiB, 2 * GiB, pressure=0.42,
                         throttled_for=31.0),
                 "cgwatch guard: save and stop: cgroup /job: throttled above memory.high for "
                 "31 s (42% stalled)", id="throttle-psi"),
    pytest.param(Verdict(True, THROTTLE, "/job", 4 * GiB, 2 * GiB, throttled_for=5.5),
                 "cgwatch guard: save and stop: cgroup /job: throttled above memory.high for "
                 "5.5 s (memory.high exceeded)", id="throttle-counter"),
    pytest.param(Verdict(False, OK, step=9), "cgwatch guard: memory is fine at step 9",
                 id="ok"),
]


@pytest.mark.parametrize(("verdict", "text"), MESSAGES)
def test_message(verdict: Verdict, text: str) -> None:
    assert verdict.message() == text


def test_exit_status_is_ex_tempfail() -> None:
    assert EXIT_STATUS == 75


STALLS = [
    # 250 ms stalled in 0.5 s: 50%.
    pytest.param((10.0, 1_000_000), (10.5, 1_250_000), 0.5, id="half"),
    pytest.param(None, (10.5, 1_250_000), None, id="first-reading"),
    pytest.param((10.0, 1_000_000), (10.0, 1_250_000), None, id="clock-did-not-move"),
    pytest.param((10.0, 1_000_000), (10.5, 10), None, id="new-cgroup-same-path"),
    pytest.param((10.0, 0), (10.5, 900_000), 1.0, id="clamped"),
]


@pytest.mark.parametrize(("before", "after", "want"), STALLS)
def test_stall_share(before: Optional[tuple[float, int]], after: tuple[float, int],
                     want: Optional[float]) -> None:
    assert stall_share(before, after) == want


def test_throttling_counts_unbroken_time() -> None:
    t = Throttling(0.10)
    assert t.update(0.0, "/job", 0.2, False) == 0.0
    assert t.update(10.0, "/job", 0.3, False) == 10.0
    assert t.update(20.0, "/job", 0.05, True) == 0.0  # below the threshold: PSI decides
    assert t.update(30.0, "/job", None, True) == 0.0  # no PSI: the `high` rise decides
    assert t.update(40.0, "/job", None, True) == 10.0
    assert t.update(50.0, "/job", None, False) == 0.0
    t.update(60.0, "/job", 0.5, False)
    t.keep_only(set())
    assert t.update(70.0, "/job", 0.5, False) == 0.0  # forgotten: starts again
