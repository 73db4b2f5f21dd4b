"""Lesson 13's collective-timeline figure reads at its size: point labels of at least 9 pt, and
the dashed "ranks part" line between two collectives, so it never runs through a label."""
from ddp_lab.course.registry import lessons

LESSON = lessons()["13"]


def test_timeline_labels_are_readable_and_the_parting_line_misses_them(runs, tmp_path):
    results = {s.name: {w: runs(s.name, w) for w in ("broken", "fixed")} for s in LESSON.scenarios}
    fig = LESSON.figures(results)["collective_timelines"]
    fig.savefig(tmp_path / "timeline.png", dpi=110)  # lays the texts out
    renderer = fig._get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.texts if t.get_text()]
        assert labels and all(t.get_fontsize() >= 9 for t in labels), ax.get_title()
        for line in (l for l in ax.lines if l.get_linestyle() == "--"):
            x = line.get_xdata()[0]
            assert x % 1 == 0.5, ax.get_title()  # between collective x - 0.5 and x + 0.5
            left, right = ax.get_xlim()
            assert left < x < right, ax.get_title()  # inside the panel, visible
            px = ax.transData.transform((x, 0))[0]
            for t in labels:
                if t.get_text().startswith(" the ranks part"):
                    continue  # the line's own note, which starts at it
                box = t.get_window_extent(renderer)
                assert not box.x0 < px < box.x1, (ax.get_title(), t.get_text())
