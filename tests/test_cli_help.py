"""`genvi run NAME --help` shows each experiment's whole description and help for every
option; long runs say what they are doing; the demo names its model before fitting.
All in-process and cheap: parsers are built, not run, and training is stubbed out."""

import argparse
import importlib

import numpy as np
import pytest

import genvi as gv
from genvi import cli, demo


class _Parsed(Exception):
    """Raised instead of parsing, carrying the experiment's parser."""

    def __init__(self, parser):
        super().__init__()
        self.parser = parser


def _parser_of(module, monkeypatch) -> argparse.ArgumentParser:
    """The argument parser `module.main` builds, captured at its parse_args call."""
    def capture(self, args=None, namespace=None):
        raise _Parsed(self)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(_Parsed) as parsed:
        module.main([])
    return parsed.value.parser


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("name", list(cli.experiments()))
def test_help_shows_the_whole_description_and_every_option(name, monkeypatch):
    module = importlib.import_module(cli.experiments()[name].module)
    parser = _parser_of(module, monkeypatch)
    shown = _words(parser.format_help())
    # the description was once the docstring's first line, cut mid-sentence: now the
    # first paragraph is there whole, and it is a full sentence
    first_paragraph = _words(module.__doc__.split("\n\n")[0])
    assert first_paragraph.endswith("."), (name, first_paragraph)
    assert first_paragraph in shown, (name, shown)
    assert _words(parser.description) in shown
    undocumented = [a.option_strings for a in parser._actions
                    if a.option_strings and not (a.help or "").strip()]
    assert not undocumented, (name, undocumented)


def test_genvi_run_name_help_in_process(monkeypatch, capsys):
    monkeypatch.setenv("GENVI_CACHE", "off")  # leave this process's JAX configuration alone
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "logreg", "--help"])
    assert exit_.value.code == 0
    out = _words(capsys.readouterr().out)
    # the sentence the issue found cut after "an automatic guide: a `gv.plate`"
    assert "a `gv.plate` of N datapoints of which each step sees a minibatch" in out
    assert "genvi run logreg [--points 100000] [--steps 3000]" in out
    assert "--lr LR Adam's initial learning rate" in out and "(default: 0.01)" in out


def test_show_defaults_keeps_paragraphs_bullets_and_command_lines():
    text = ("First paragraph, long enough to be filled again by argparse when it is "
            "shown in a narrow terminal window.\n\n"
            "Options:\n* one item that is\n  continued on a second line;\n* another.\n\n"
            "    genvi run x --steps 5\n")
    parser = argparse.ArgumentParser(prog="x", description=text, formatter_class=cli.ShowDefaults)
    shown = parser.format_help()
    assert "\n\nOptions:\n* one item that is continued on a second line;\n* another.\n" in shown
    assert "\n    genvi run x --steps 5\n" in shown
    assert _words(text) in _words(shown)


def test_noisy_cone_says_what_each_phase_does_before_it_runs(monkeypatch, capsys, tmp_path):
    from genvi_experiments import noisy_cone
    events = []

    def ascend(objective, init, *data, steps, estimates_per_step, **options):
        events.append(("train", capsys.readouterr().err))
        return init

    monkeypatch.setattr(noisy_cone, "ascend", ascend)
    monkeypatch.setattr(noisy_cone, "mean_estimate", lambda *a, **k: (-8.0, 0.01))
    monkeypatch.setattr(noisy_cone, "guide_samples", lambda *a: np.zeros((2, 2)))
    monkeypatch.setattr(noisy_cone, "plot", lambda *a: None)
    noisy_cone.main(["--eval", "7", "--out", str(tmp_path)])
    assert len(events) == len(noisy_cone.PROTOCOL)
    # before each compiled training loop: what it is and that it compiles first
    for (_, said), name in zip(events, noisy_cone.PROTOCOL):
        assert f"{name}, seed 0: compiling, then" in said and "7 estimates to evaluate" in said
    assert "20000 SGD steps (each the mean of 64 gradient estimates)" in events[0][1]


def test_demo_names_its_model_and_sites_before_fitting(monkeypatch, capsys):
    class Stop(Exception):
        pass

    def fit(*args, **kwargs):
        raise Stop
    monkeypatch.setattr(gv, "fit", fit)
    with pytest.raises(Stop):
        demo.main(["--steps", "3"])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("genvi demo:") and "The model (genvi.demo.model)" in lines[1]
    assert "mu ~ Normal(0, 1)" in out and "loaded ~ Flip(0.5)" in out
    assert '"mu" (float32, continuous) and "loaded" (bool, discrete)' in out
    assert "fitting: compiling, then 3 Adam steps" in err
