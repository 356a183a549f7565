"""The limits of one solve: the work its layout programs may do (the default, and per second
of a time limit the user sets), and the wall clock, with whether it fired.

A solve's answer is bounded by work, not by seconds (solver.search.program_memo.WorkBudget:
CP-SAT's deterministic time, the same count on a busy machine and an idle one), so that one
problem gives the same bytes on any machine. The wall clock is only
- the user's `--time-limit`, which may cut a solve short; or, without one,
- a safety net (SAFETY_LIMIT_S) far past what the work budget takes, there so that a solve
  cannot run unbounded on a machine that has stalled.
Either is reported where it fires (OptimizeResult.stopped_by): an answer it cut short depends
on the machine, and says so.
"""

from __future__ import annotations

import time

# The work all the layout programs of one solve may do, in CP-SAT's deterministic seconds,
# where the user sets no time limit: 3.5, what the default 10 s limit gave before the wall
# clock became a safety net (issue 40). On this project's 2-core machine the hardest programs
# take 1.5-1.8 s of wall time per deterministic second (Nemotron-H 56B on 8 H100s: 5.5 of them
# in 9.8 s; a program overshoots its own limit by up to a third), so 3.5 is about 6 s of
# programs. A solve whose programs spend it stops there (status "feasible", stopped by the
# work limit) with the same answer on a busy machine and an idle one: no wall clock binds
# before it (SAFETY_LIMIT_S below).
DEFAULT_WORK_S = 3.5

# With a time limit the user sets, the work per second of it: 0.35, so that the work fits in
# the limit on this project's 2-core machine (and the default's 3.5 is 10 s of it); the limit
# may still cut a solve short on a slower or busier machine, and the answer says so.
WORK_PER_SECOND = 0.35


# The safety net's seconds where the user sets no time limit. The default work budget (3.5
# deterministic seconds of layout programs) took at most about 6 s of programs on this
# project's 2-core machine, and the largest numpy phases of the zoo a few seconds more
# (Nemotron 3 Ultra on 1,024 H100s: 4.8 s): about 11 s in all, so the net fires only on a
# machine more than 25 times slower than that one.
SAFETY_LIMIT_S = 300.0  # STOPPED_BY_WORDS names it

# What OptimizeResult.stopped_by names, by which limit stopped the solve.
STOPPED_BY_TIME_LIMIT = "time_limit"          # the user's --time-limit (wall clock)
STOPPED_BY_SAFETY_LIMIT = "safety_time_limit"  # the default wall-clock safety net
STOPPED_BY_WORK_LIMIT = "work_limit"          # the deterministic work budget
STOPPED_BY_WORDS = {STOPPED_BY_TIME_LIMIT: "the time limit (depends on the machine)",
                    STOPPED_BY_SAFETY_LIMIT: "the 300 s safety limit (depends on the machine)",
                    STOPPED_BY_WORK_LIMIT: "the work limit"}


class Deadline:
    """A wall-clock limit `seconds` from now (time.perf_counter), `user` whether it is the
    user's time limit (else the safety net); `fired` turns True the first time a search finds
    it passed, and stays."""

    def __init__(self, seconds: float, user: bool = True) -> None:
        self.seconds, self.user = seconds, user
        self.at = time.perf_counter() + seconds
        self.fired = False

    @classmethod
    def for_time_limit(cls, time_limit_s: float | None) -> Deadline:
        """The user's limit, or the safety net where there is none (None)."""
        if time_limit_s is None:
            return cls(SAFETY_LIMIT_S, user=False)
        return cls(time_limit_s)

    def passed(self) -> bool:
        """Whether the limit has passed (and, if so, it fired)."""
        if time.perf_counter() >= self.at:
            self.fired = True
        return self.fired

    def remaining_s(self) -> float:
        """The seconds left (0 once passed): a CP-SAT program's own wall limit."""
        return max(self.at - time.perf_counter(), 0.0)

    def stopped_by(self) -> str:
        """What OptimizeResult.stopped_by names where this limit fired."""
        return STOPPED_BY_TIME_LIMIT if self.user else STOPPED_BY_SAFETY_LIMIT


def never() -> Deadline:
    """A limit that never passes (the even engine, and searches run without one)."""
    return Deadline(float("inf"))
