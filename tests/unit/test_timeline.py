"""A request's timeline (jev_common/timeline.py): stages marked back to back leave no time uncounted."""

from __future__ import annotations

from jev_common.timeline import Timeline


def test_marks_are_back_to_back_from_the_start():
    timeline = Timeline(start=10.0)
    timeline.add("parse", 10.0, 10.5)
    end = timeline.mark("prepare")
    assert timeline.stages[1].start == 10.5 and timeline.stages[1].end == end
    assert [s.name for s in timeline.stages] == ["parse", "prepare"]
    assert timeline.last == end


def test_seconds_add_up_by_stage_and_never_go_negative():
    timeline = Timeline(start=0.0)
    timeline.add("device", 1.0, 1.25)
    timeline.add("device", 2.0, 2.5)
    timeline.add("queue", 3.0, 2.0)  # a clock read out of order counts nothing, not minus one second
    assert timeline.seconds() == {"device": 0.75, "queue": 0.0}
