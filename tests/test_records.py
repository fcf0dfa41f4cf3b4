"""The checks every reader and writer of a small record shares (gpt2/records.py), and the
range every command-line number has (gpt2/config/argparser.py Bounded): fast, in
process, and what `make test-mutation MUTATION_ARGS="--only records"` runs."""

from __future__ import annotations

import argparse

import pytest

from gpt2 import records
from gpt2.config.argparser import Bounded, StrictArgumentParser
from gpt2.records import Field


def test_a_field_takes_its_type_within_its_range_and_nothing_else():
    field = Field(int, 0, 10)
    ok = [v for v in (0, 10, None, 11, -1, True, 1.5, "3", 10**400) if field.problem(v) is None]
    assert ok == [0, 10, None]
    number = Field(float, 0.5, 2)
    assert [number.problem(v) is None for v in (0.5, 2, 1, 0.49, 2.01, float("nan"),
                                                float("inf"), False)] == \
        [True, True, True, False, False, False, False, False]
    assert Field(float, 0).problem(10**400).endswith("... is past any number kgpt writes")
    assert Field(int).problem(2**63) is None and Field(int).problem(-2**63 - 1) is not None
    assert Field(bool).problem(True) is None and Field(bool).problem(1) is not None
    assert Field(float, 0, finite=False).problem(float("nan")) is None
    assert Field(float, 0, finite=False).problem(-1.0) == "-1.0 is below 0"
    assert Field(str, choices=("a", "b")).problem("b") is None
    assert Field(str, choices=("a", "b")).problem("c") == "'c' is not one of a, b"
    assert Field(str, required=True).problem(None) == "missing"
    assert Field(int, -3).problem(-4) == "-4 is below -3"
    assert Field(int, high=3).problem(4) == "4 is above 3"


def test_a_record_is_judged_field_by_field_and_kept_where_it_holds():
    fields = {"n": Field(int, 0, required=True), "why": Field(str)}
    assert records.problem({"n": 1, "other": object()}, fields) is None
    assert records.problem({"n": -1}, fields) == "n: -1 is below 0"
    assert records.problem({"why": "x"}, fields) == "n: missing"
    assert records.problem({"n": 1, "why": 3}, fields) == "why: 3 is not a str"
    assert records.problem([], fields) == "a list, not an object"
    assert records.kept({"n": -1, "why": "x", "extra": 2}, fields) == {"why": "x", "extra": 2}
    assert records.finite_or_none(float("nan")) is None
    assert records.finite_or_none(float("-inf")) is None
    assert records.finite_or_none(2.0) == 2.0 and records.finite_or_none("x") == "x"
    assert records.finite_or_none({"a": [1.0, float("nan"), {"b": float("inf")}], "c": 3}) == \
        {"a": [1.0, None, {"b": None}], "c": 3}


@pytest.mark.parametrize("kind,low,high,text,value", [
    (int, 1, 5, "1", 1), (int, 1, 5, "5", 5), (int, 1, 5, " 3 ", 3),
    (float, 0, 1, "1e-3", 1e-3), (float, 0, 1, "1", 1.0)])
def test_a_bounded_number_takes_its_range_edges(kind, low, high, text, value):
    assert Bounded(kind, low, high)(text) == value


@pytest.mark.parametrize("bound,text,says", [
    (Bounded(int, 1, 5), "0", "0 is out of range: from 1 to 5"),
    (Bounded(int, 1, 5), "6", "6 is out of range: from 1 to 5"),
    (Bounded(int, 1, 70000), "99999999999", "99999999999 is out of range: from 1 to 70,000"),
    (Bounded(int, 1, 5), "2.5", "'2.5' is not a whole number"),
    (Bounded(int, 1, 5), "0x3", "'0x3' is not a whole number"),
    (Bounded(float, 0, 1, low_open=True), "0", "0.0 is out of range: above 0 to 1"),
    (Bounded(float, 0, 1), "inf", "'inf' is not a finite number"),
    (Bounded(float, 0, 1), "nan", "'nan' is not a finite number"),
    (Bounded(float, 0, 1), "x", "'x' is not a number"),
    (Bounded(float, 0, 1, "why so"), "2", "2.0 is out of range: from 0 to 1 (why so)"),
])
def test_a_bounded_number_refuses_past_its_range_saying_so(bound, text, says):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        bound(text)
    assert str(e.value) == says


def test_a_parser_refuses_a_number_flag_without_a_range(capsys):
    p = StrictArgumentParser(prog="x")
    p.add_argument("--ok", type=Bounded(int, 0, 3))
    assert p.unbounded() == [] and p.parse_args(["--ok", "3"]).ok == 3
    with pytest.raises(SystemExit):
        p.parse_args(["--ok", "4"])
    assert "argument --ok: 4 is out of range" in capsys.readouterr().err
    p.add_argument_group("g").add_argument("--n", type=float)
    assert p.unbounded() == ["--n"]
    with pytest.raises(TypeError, match="--n: a number flag needs a range"):
        p.parse_args([])


def test_what_is_printed_shows_control_characters_instead_of_sending_them():
    from gpt2.processes import terminal_safe

    assert terminal_safe("a\x1b[2J\x07\r\x9b\u202eb\tc\nd\u2028") == \
        "a\\x1b[2J\\x07\\x0d\\x9b\\u202eb\tc\nd\\u2028"
    assert terminal_safe("plain text, é ü 日本") == "plain text, é ü 日本"
    # (the value typed is not echoed: what it parsed to is, and control characters that
    # int() skips never reach the message)
    with pytest.raises(argparse.ArgumentTypeError) as e:
        Bounded(int, 1, 5)("\r\x0b70")
    assert str(e.value).startswith("70 is out of range")
