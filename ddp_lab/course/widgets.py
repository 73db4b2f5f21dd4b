"""A small ipywidgets panel for the "try it yourself" part of a lesson: choose world size and
variant, run the scenario on real ranks, read every rank's outcome."""
from __future__ import annotations

from functools import lru_cache

from .registry import Scenario
from ..launching.results import LaunchInterrupted

TEXT_LIMIT = 110  # ipywidgets cuts a widget's text/plain form here


def panel_text(scenario: Scenario) -> str:
    """What a notebook shows for the panel where no widget can be drawn (a committed notebook
    opened before its cell runs, a static page): which scenario, and how to use it."""
    text = f"[try-it-yourself panel: {scenario.key}; run this cell in Jupyter to use it]"
    return text if len(text) <= TEXT_LIMIT else f"[panel: {scenario.key}; run this cell to use it]"


@lru_cache(maxsize=None)
def _panel_class():
    import ipywidgets as w

    class ScenarioPanel(w.VBox):
        """A VBox whose text form names its scenario instead of listing its children."""

        text = ""

        def __repr__(self) -> str:
            return self.text

    return ScenarioPanel


def scenario_panel(scenario: Scenario, max_world_size: int = 4):
    """World size, broken/fixed, a run button and a per-rank output area for `scenario`."""
    import ipywidgets as w
    from IPython.display import display

    size = w.IntSlider(value=scenario.broken.world_size, min=1, max=max_world_size,
                       description="world size")
    which = w.ToggleButtons(options=["broken", "fixed"], value="broken", description="variant")
    button = w.Button(description="run on real ranks", button_style="primary", icon="play")
    out = w.Output()

    def run(_=None):
        out.clear_output()
        with out:
            button.disabled = True
            try:
                try:
                    result = scenario.run(which.value, world_size=size.value)
                except LaunchInterrupted as stop:
                    print("\n".join(stop._render_traceback_()))
                    return
                display(result)
                problems = scenario.differences(which.value, result)
                verdict = "as declared" if not problems else "NOT as declared: " + "; ".join(problems)
                print(f"{scenario.key} {which.value}: {result.status} ({verdict})")
                result.print_output()
            finally:
                button.disabled = False

    button.on_click(run)
    title = w.HTML(f"<b>{scenario.key}</b>: {scenario.title}")
    panel = _panel_class()([title, w.HBox([size, which, button]), out])
    panel.text = panel_text(scenario)
    panel.run = run  # so a cell (or a test) can press the button
    return panel
