"""The benchmarks declare each option once, as an ``Opt``: their parsers' flags, defaults and help come from those
declarations, and the checks run from the same ones."""
import argparse

import pytest

from simattn.bench import attention, data, paper
from simattn.bench.model import cli as model
from simattn.bench.cli import _bench_options

BENCHES = {"attention": attention, "data": data, "model": model, "paper": paper}
#: KEY=VALUE items, kept as text for parse_assignments (an Opt list flag would read each item as YAML)
TEXT_ITEMS = {"model": {"attn_kwargs", "model_kwargs"}, "data": {"model_kwargs"}}


@pytest.mark.parametrize("name", BENCHES)
def test_every_flag_comes_from_one_opt(name):
    module = BENCHES[name]
    options = module._options()
    flags = {a.dest: a for a in module.build_parser()._actions if not isinstance(a, argparse._HelpAction)}
    assert set(flags) == set(options) | TEXT_ITEMS.get(name, set())
    for dest, spec in options.items():
        assert flags[dest].default == spec.default, dest
        if spec.help != argparse.SUPPRESS:
            assert flags[dest].help.startswith(spec.help), dest


@pytest.mark.parametrize("name", BENCHES)
def test_shared_options_keep_their_one_range(name):
    shared = _bench_options()
    for dest, spec in BENCHES[name]._options().items():
        if dest in shared:
            assert (spec.low, spec.high, spec.low_open, spec.check) == \
                   (shared[dest].low, shared[dest].high, shared[dest].low_open, shared[dest].check), dest


@pytest.mark.parametrize("name", BENCHES)
def test_every_bench_writes_to_output_with_out_as_its_alias(name):
    parser = BENCHES[name].build_parser()
    assert parser.parse_args(["--output", "a"]).output == "a"
    assert parser.parse_args(["--out", "b"]).output == "b"
    assert not hasattr(parser.parse_args([]), "out")
