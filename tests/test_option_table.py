"""The option table (`safe_engine.options.OPTIONS`) reaches every front door, option by option: a flag of the
command line's generate, compare and serve commands; a key of lm-eval's model args, written as lm-eval passes them
(strings, `|` between list items); a field of a server request's `safe` object, or refused there as the server's
own (a launch flag); and in the app, a widget of the Live form labelled and explained from its row, or a launch
flag of `python app.py`, or named in `settings.NOT_IN_THE_FORM` with where the app takes it instead."""

from __future__ import annotations

import pytest

from components import settings, studio
from safe_engine import cli
from safe_engine.options import OPTIONS, Option, options_from_mapping
from safe_engine.server.app import FIXED_OPTIONS

NAMES = sorted(OPTIONS)


def _one(option: Option) -> object:
    if option.choices:
        return option.choices[-1]
    return {int: 3, float: 0.25}.get(option.type, f"x-{option.name}")


def _sample(option: Option) -> tuple[list[str], object]:
    """(the option on a command line, the value it parses to)."""
    if option.kind in ("flag", "toggle"):
        return [option.flag], True
    one = _one(option)
    if option.kind == "values":
        return [option.flag, str(one), str(one)], [one, one]
    if option.kind == "append":
        return [option.flag, str(one)], [one]
    return [option.flag, str(one)], one


@pytest.mark.parametrize(
    "command, name",
    [(c, n) for c in ("generate", "compare", "serve") for n in NAMES if (c, n) != ("compare", "strategy")],
)  # compare runs every strategy
def test_each_option_is_a_flag_of_the_command_line(command, name):
    words, value = _sample(OPTIONS[name])
    prompt = ["--prompt", "x"] if command != "serve" else []
    assert getattr(cli.build_parser().parse_args([command, *prompt, *words]), name) == value


@pytest.mark.parametrize("name", NAMES)
def test_each_option_is_a_key_of_lm_evals_model_args(name):
    option = OPTIONS[name]
    _, value = _sample(option)
    if isinstance(value, list):
        as_lm_eval_writes_it = "|".join(map(str, value))
    else:
        as_lm_eval_writes_it = "true" if value is True else str(value)
    assert getattr(options_from_mapping({name.replace("_", "-"): as_lm_eval_writes_it}), name) == value


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tiny_pair import tiny_pair_folders

    from safe_engine.models.cache import load_models
    from safe_engine.options import decoding_values
    from safe_engine.server.app import Engine, Settings

    specs = tiny_pair_folders(tmp_path_factory.mktemp("pair"))
    args = cli.build_parser().parse_args(["serve", "--models", *specs])
    return Engine(load_models(specs), Settings(decoding_values(args), "safe", None, 1, 4))


@pytest.mark.parametrize("name", sorted(set(NAMES) - {"strategy"}))
def test_each_option_is_a_request_field_of_the_server_or_its_own(engine, name):
    from safe_engine.server.app import ApiError
    from safe_engine.server.schemas import CompletionRequest

    option = OPTIONS[name]
    _, value = _sample(option)
    value = {"models": None, "drafter": None}.get(name, value)  # the loaded pair's own, else the sample
    body = CompletionRequest(model=engine.pair_id, prompt="x", safe={name: value})
    if name in FIXED_OPTIONS:
        with pytest.raises(ApiError, match="belong to the server"):
            engine.config(body, 4)
        return
    try:
        engine.config(body, 4)
    except ApiError as error:  # a value the engine's checks refuse is still the option, read and checked
        assert error.status == 400 and "unknown" not in str(error), str(error)


def test_every_option_has_its_place_in_the_app():
    in_form, elsewhere = set(settings.FIELDS), set(settings.NOT_IN_THE_FORM)
    assert not in_form & elsewhere and in_form | elsewhere == set(OPTIONS), set(OPTIONS) ^ (in_form | elsewhere)
    assert all(OPTIONS[name].label for name in in_form)  # a form shows the row's label


@pytest.mark.parametrize("name", sorted(n for n, where in settings.NOT_IN_THE_FORM.items() if "launch flag" in where))
def test_the_apps_launch_flags_take_the_options_the_form_leaves_out(monkeypatch, name):
    words, _ = _sample(OPTIONS[name])
    if name in ("devices", "dtype"):
        words = [OPTIONS[name].flag, "cpu" if name == "devices" else "float32"]
    started = []
    monkeypatch.setattr(studio, "launch", lambda demo, *args: started.append(demo))
    monkeypatch.setattr(studio, "build_demo", lambda specs, pool, traces: pool)
    assert studio.main(words) == 0 and started


def test_the_live_form_draws_each_widget_from_its_row():
    demo = studio.build_demo()
    shown = [block for block in demo.blocks.values() if getattr(block, "label", None)]
    for name in settings.FIELDS:
        option = OPTIONS[name]
        widgets = [b for b in shown if b.label.startswith(option.label)]
        assert widgets, f"no widget labelled {option.label!r} for {name}"
        if option.help:
            assert any(getattr(b, "info", None) == option.text for b in widgets), f"{name}: the row's help"
