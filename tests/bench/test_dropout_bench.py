"""bench/dropout.py: a training step without dropout, with PyTorch's (its module and SDPA's) and with tokennet's, in
the same model."""

import json

from support import load_bench

from tokennet.dropout import Dropout


def test_the_three_rows_time_the_same_model_with_each_dropout(tmp_path, capsys):
    bench = load_bench("dropout")
    out = tmp_path / "dropout.json"
    assert bench.main(["--set", "dim=16", "num_layers=1", "num_heads=2", "block_size=8", "--batch", "2",
                       "--rounds", "1", "--steps", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert list(record["ms_per_step_median"]) == ["no dropout", "PyTorch's dropout 0.1", "tokennet's dropout 0.1"]
    assert record["settings"]["dim"] == 16 and record["speedup_over_torch_dropout"] > 0
    assert "| tokennet's dropout 0.1 |" in capsys.readouterr().out
    torch_model = bench.build("gpt", record["settings"], 0.1, torch_dropout=True)
    assert not any(isinstance(m, Dropout) for m in torch_model.modules())  # every place swapped to nn.Dropout
    assert torch_model.config.backend == "sdpa"  # and the attention weights dropped by SDPA
    assert any(isinstance(m, Dropout) for m in bench.build("gpt", record["settings"], 0.1, False).modules())


def test_settings_parse_as_tokennet_train_parses_them(capsys):
    bench = load_bench("dropout")
    assert bench.model_settings("gpt", ["dim=16", "qk_norm=false"])["qk_norm"] is False
    assert bench.main(["--set", "bogus=1"]) == 2 and "unknown setting 'bogus'" in capsys.readouterr().err
    assert bench.main(["--set", "dim=x"]) == 2 and "setting dim=x: expected int" in capsys.readouterr().err
