"""The tokennet lm-eval model's arguments: a missing ``run=``, a value of the wrong type or an unknown name is one
``tokennet: error:`` line and exit 2, checked before lm-eval reads its task index; lm-eval's own refusals of its
command line (a ``ValueError`` it raises) are one line too, while a ``ValueError`` from tokennet's code stays a bug."""

import pytest

from tokennet.cli import main
from tokennet.errors import ConfigError, RunError

pytest.importorskip("lm_eval")
import lm_eval.__main__  # noqa: E402

from tokennet.interop import lm_eval as tk_lm_eval  # noqa: E402
from tokennet.interop.lm_eval import LMEvalError, TokennetLM, check_argv  # noqa: E402


@pytest.fixture
def no_harness(monkeypatch):
    """lm-eval's command line replaced by a marker: a test fails if tokennet's checks let the arguments through."""
    calls = []
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: calls.append(1))
    return calls


@pytest.mark.parametrize("model_args, words", [
    ("max_length=8", ["run=DIR"]),
    ("run={d},max_length=abc", ["max_length='abc'", "positive integer"]),
    ("run={d},batch_size=-3", ["batch_size=", "positive integer"]),
    ("run={d},colour=blue", ["unknown argument", "'colour'"]),
    ("run={d},quantize=int3", ["quantize=", "none, bf16, int8"]),
    ("run={d},device=gpu7", ["device=", "not a device name"]),
    ("run={d},oops", ["expected key=value"]),
    ('{{"run": "{d}", "max_length": [1]}}', ["max_length=[1]"]),
    ("run={d}/missing", ["no such run directory"]),
    ("run=" + "9" * 5000, ["no such run directory"]),  # found by the fuzzing: a name too long raised OSError
])
def test_bad_model_args_are_one_line(tmp_path, capsys, no_harness, model_args, words):
    args = model_args.format(d=tmp_path)
    assert main(["lm-eval", "--model", "tokennet", "--model_args", args, "--tasks", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokennet: error: ") and err.count("\n") == 1, err
    for w in words:
        assert w in err
    assert no_harness == []  # refused before lm-eval ran


def test_good_model_args_reach_lm_eval(tmp_path, no_harness):
    assert main(["lm-eval", "--model", "tokennet", "--model_args", f"run={tmp_path},max_length=8",
                 "batch_size=auto", "--tasks", "x"]) == 0
    assert main(["lm-eval", "--model", "hf", "--model_args", "anything=goes", "--tasks", "x"]) == 0
    assert no_harness == [1, 1]


def test_the_model_checks_its_arguments_inside_lm_eval(tmp_path):
    """lm-eval builds the model from its own parse of the arguments (``simple_evaluate`` from Python, too)."""
    with pytest.raises(ConfigError, match="needs run=DIR"):
        TokennetLM.create_from_arg_obj({"max_length": 8}, {"batch_size": 4})
    with pytest.raises(ConfigError, match="max_length='abc' is not a positive integer"):
        TokennetLM.create_from_arg_string(f"run={tmp_path},max_length=abc")
    with pytest.raises(ConfigError, match="unknown argument"):
        TokennetLM.create_from_arg_obj({"run": str(tmp_path), "temperature": 0.5})
    with pytest.raises(RunError, match="no such run directory"):  # what lm-eval adds itself is accepted
        TokennetLM.create_from_arg_obj({"run": str(tmp_path / "no")}, {"batch_size": 2, "max_batch_size": 64,
                                                                       "device": "cpu"})


def test_deep_json_argument_is_refused_before_lm_eval_parses_it():
    with pytest.raises(ConfigError, match="nested deeper"):
        check_argv(["--model", "hf", "--gen_kwargs", "[" * 5000 + "]" * 5000])


def test_a_value_error_lm_eval_raises_is_one_line(monkeypatch, capsys):
    from lm_eval._cli.utils import try_parse_json

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: try_parse_json("{not json"))
    assert main(["lm-eval", "--model", "hf", "--tasks", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokennet: error: lm-eval: Invalid JSON") and err.count("\n") == 1, err


def test_a_value_error_in_tokennet_code_stays_a_bug(monkeypatch, tmp_path):
    """lm-eval's machinery calls the model: a ValueError raised below tokennet's code there is a bug, not a refusal."""
    def broken(args):
        raise ValueError("tokennet bug")

    monkeypatch.setattr(tk_lm_eval, "check_model_args", broken)
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate",
                        lambda: TokennetLM.create_from_arg_obj({"run": str(tmp_path)}))
    with pytest.raises(ValueError, match="tokennet bug") as e:
        tk_lm_eval.main(["--model", "hf"])
    assert not isinstance(e.value, LMEvalError)
