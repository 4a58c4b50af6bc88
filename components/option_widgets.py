"""A Gradio widget for an engine option, drawn from its row of the option table (`safe_engine.options.OPTIONS`):
the label, range, step, choices and help the command line's flag shows, so the form cannot drift from it."""

from __future__ import annotations

import gradio as gr

from safe_engine.options import OPTIONS

from .settings import TOGGLES, form_value


def widget(name: str, *, number: bool = False, **extra) -> gr.components.Component:
    """The option's widget: choices and toggles as radio buttons, a number with both ends as a slider (`number`:
    a box instead, its range in the label), other numbers as a box, the rest as text. A box takes any number:
    one out of range is refused by `settings.decoding` with a message in the page, not by the browser. `extra`
    goes to Gradio (value, elem_id, render, lines, ...)."""
    option = OPTIONS[name]
    shown = {"label": option.label, "info": option.text or None, "value": form_value(option)} | extra
    if option.kind == "toggle":
        return gr.Radio(list(TOGGLES), **shown)
    if option.choices:
        return gr.Radio(list(option.choices), **shown)
    if option.type in (int, float):
        low, high = option.bounds or (None, None)
        if low is not None and high is not None and not number:
            return gr.Slider(low, high, step=option.step, **shown)
        if low is not None and high is not None:
            shown["label"] = f"{shown['label']} ({low:g}–{high:g})"
        precision = 0 if option.type is int else None  # no minimum/maximum: the table's check says it in the page
        return gr.Number(step=option.step, precision=precision, **shown)
    return gr.Textbox(**shown)
