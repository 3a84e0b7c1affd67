"""dtlab.waiting.wait_until: the one bounded poll. Real clocks, short timeouts."""

from __future__ import annotations

import itertools
import os
import time

import pytest

from dtlab.errors import DtlabError
from dtlab.waiting import wait_until


def test_returns_the_first_good_answer_without_sleeping():
    calls = itertools.count(1)
    started = time.monotonic()
    assert wait_until(lambda: next(calls), timeout_s=30, every_s=10) == 1
    assert time.monotonic() - started < 1  # no sleep before or after a good first answer


def test_polls_until_the_answer_is_good_and_returns_it():
    answers = iter(["", "", "ready", "later"])
    assert wait_until(lambda: next(answers), timeout_s=5, every_s=0.01) == "ready"
    assert next(answers) == "later"  # asked no more than needed


def test_until_judges_the_answer_and_the_answer_is_returned():
    counts = itertools.count(0)
    assert wait_until(lambda: next(counts), until=lambda alive: alive >= 3, timeout_s=5, every_s=0.01) == 3


def test_a_timeout_without_what_returns_the_last_answer_after_the_full_bound():
    answers = itertools.count(0)
    started = time.monotonic()
    last = wait_until(lambda: next(answers), until=lambda n: n < 0, timeout_s=0.3, every_s=0.05)
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 1.0  # waited the whole bound, and not much past it
    assert last >= 2  # asked several times, and the answer returned is the last one asked
    assert next(answers) == last + 1


def test_a_timeout_with_what_raises_one_line_naming_it_and_the_bound():
    started = time.monotonic()
    with pytest.raises(DtlabError) as raised:
        wait_until(lambda: False, timeout_s=0.2, every_s=0.05, what="node1 to answer SSH")
    assert 0.2 <= time.monotonic() - started < 1.0
    assert str(raised.value) == "timed out after 0.2 s waiting for node1 to answer SSH"


def test_never_sleeps_past_the_deadline_when_the_interval_is_longer():
    asked_at = []
    started = time.monotonic()
    wait_until(lambda: asked_at.append(time.monotonic()), timeout_s=0.3, every_s=60)
    assert len(asked_at) == 2  # at once, then once more at the deadline
    assert 0.3 <= asked_at[1] - started < 0.8


def test_a_zero_timeout_asks_exactly_once():
    asked = []
    assert wait_until(lambda: asked.append(1), timeout_s=0, every_s=1) is None
    assert asked == [1]


def test_an_exception_from_the_check_ends_the_wait_unchanged():
    calls = itertools.count(1)

    def check():
        if next(calls) == 2:
            raise DtlabError("node1 stopped while booting")
        return False

    started = time.monotonic()
    with pytest.raises(DtlabError, match="^node1 stopped while booting$"):
        wait_until(check, timeout_s=30, every_s=0.01, what="node1")
    assert time.monotonic() - started < 1
    assert next(calls) == 3  # not asked again after it raised


def test_stop_process_group_ends_a_process_and_its_children_and_leaves_an_ended_one():
    import subprocess
    import time

    from dtlab.waiting import stop_process_group

    # A shell whose child sleeps: TERM to the group ends both, not only the shell.
    started = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    child = int(started.stdout.readline())
    began = time.monotonic()
    stop_process_group(started, grace_s=10)
    assert started.returncode is not None and time.monotonic() - began < 10
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # the child is reaped by init a moment after the group's TERM
            os.kill(child, 0)
            time.sleep(0.1)
    stop_process_group(started)  # already ended: nothing to do, no error
