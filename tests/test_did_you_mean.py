"""Errors that point at the fix: the closest names to a mistyped recipe, model, task, setting, flag or choice, in one
line, instead of every name there is (issue 61)."""

import pytest

from tokennet.cli import main
from tokennet.errors import did_you_mean, unknown_name


def _error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:  # argparse's errors exit; tokennet's own return 2
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err


def test_did_you_mean_names_the_closest_and_nothing_when_none_is_close():
    assert did_you_mean("gtp", ["gpt", "gpt-char", "vit"]) == "did you mean 'gpt'?"
    assert did_you_mean("num_layer", ["num_layers", "norm_layer", "dim"]) == "did you mean 'num_layers'?"
    assert did_you_mean("lr_min", ["min_lr", "lr"]) == "did you mean 'min_lr'?"  # the same words in another order
    assert did_you_mean("zzz", ["gpt", "vit"]) == ""
    assert unknown_name("recipe", "zzz", ["gpt", "vit"]) == "unknown recipe 'zzz' (recipes: gpt, vit)"


@pytest.mark.parametrize("argv, expected", [
    (["train", "gtp"], "unknown recipe 'gtp'; did you mean 'gpt'?"),
    (["train", "gpt", "--set", "num_layer=2"], "unknown setting 'num_layer'; did you mean 'num_layers'? "
     "(`tokennet train gpt --show-settings` lists all"),
    (["train", "multimodal", "--set", "tasks=text,imag", "--max-iters", "1", "--out", "{tmp}/r"],
     "unknown task 'imag'; did you mean 'image'?"),
    (["trian", "gpt"], "did you mean 'train'?"),
    (["train", "gpt", "--sett", "dim=8"], "unrecognized arguments: --sett dim=8; did you mean '--set'?"),
    (["generate", "runs/x", "--temprature", "1"], "did you mean '--temperature'?"),
    (["export", "runs/x", "--format", "onxx", "--out", "m"], "invalid choice: 'onxx'"),
])
def test_a_mistyped_name_gets_the_closest_names_in_one_line(argv, expected, capsys, tmp_path):
    err = _error(capsys, [arg.replace("{tmp}", str(tmp_path)) for arg in argv])
    assert expected in err
    assert err.count("'") < 12  # not a list of every name there is
    assert not (tmp_path / "r").exists()  # nothing written


def test_an_unknown_model_preset_gets_the_closest_presets():
    from tokennet.errors import ConfigError
    from tokennet.models.registry import preset_info

    with pytest.raises(ConfigError, match=r"unknown model 'gpt-mimi'; did you mean 'gpt-mini'"):
        preset_info("gpt-mimi")
