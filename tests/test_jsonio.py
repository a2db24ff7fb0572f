"""tokennet.jsonio: one bound on JSON nesting, measured without recursion."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokennet import jsonio
from tokennet.errors import TokennetError


def test_depth_counts_structure_not_brackets_inside_strings():
    assert jsonio.json_depth('{"a": "[[[[\\"[[", "b": [[1]]}') == 3
    assert jsonio.json_depth("7") == 0
    assert jsonio.json_depth(b'[{"k": []}]') == 3


def test_a_body_nested_deeper_than_the_bound_is_one_clean_error_not_a_recursion_error():
    deep = "[" * 40_000 + "]" * 40_000
    with pytest.raises(jsonio.JSONTooDeep, match="40000 levels deep; at most 128") as info:
        jsonio.loads(deep, what="request body")
    assert isinstance(info.value, (TokennetError, ValueError))
    assert str(info.value).startswith("request body:")


def test_the_bound_itself_is_accepted_and_one_more_refused():
    at_bound = "[" * jsonio.MAX_JSON_DEPTH + "]" * jsonio.MAX_JSON_DEPTH
    assert jsonio.json_depth(at_bound) == jsonio.MAX_JSON_DEPTH
    jsonio.loads(at_bound)
    with pytest.raises(jsonio.JSONTooDeep):
        jsonio.loads("[" + at_bound + "]")


def test_parse_errors_stay_json_decode_errors(tmp_path):
    with pytest.raises(json.JSONDecodeError):
        jsonio.loads("{")
    p = tmp_path / "x.json"
    p.write_text('{"a": [1, 2]}')
    assert jsonio.load(p) == {"a": [1, 2]}


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                     max_leaves=20)


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(_json)
def test_depth_equals_the_parsed_structures_depth(value):
    text = json.dumps(value)
    assert jsonio.json_depth(text) == _depth(value)
    assert jsonio.loads(text) == value
