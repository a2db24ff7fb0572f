"""``tokennet heads``: one head ablated (zeroed or replaced by its mean) in a hand-checked attention layer; every head
of tiny trained vqa and gpt-char runs measured per group; the table, the JSON, and bad input in one line."""

import json

import pytest
import torch

from tokennet.attention.ablation import ablated_head, recorded_means, self_attention_layers
from tokennet.attention.multihead import MultiHeadAttention
from tokennet.cli import main
from tokennet.data.vqa import encode_questions
from tokennet.errors import DataError, RunError
from tokennet.recipes import train
from tokennet.run import load
from tokennet.tasks.heads import THRESHOLDS, head_jobs
from tokennet.tasks.heads_probes import character_class
from tokennet.tasks.vqa import exact_match, predict

pytestmark = pytest.mark.usefixtures("one_thread")

VQA = {"dim": 32, "num_layers": 2, "num_heads": 2, "batch_size": 16, "max_iters": 30, "eval_interval": 0,
       "warmup_iters": 1, "test_size": 60, "unseen_size": 4, "val_size": 8, "progress": False, "baselines": False,
       "grouping": False, "report": False}
GPT = {"dim": 32, "num_layers": 2, "num_heads": 2, "block_size": 16, "batch_size": 8, "eval_iters": 2,
       "sample_tokens": 8, "max_iters": 30, "eval_interval": 0, "progress": False, "report": False}


@pytest.fixture(scope="module")
def vqa_run(tmp_path_factory):
    out, _ = train("vqa", out=tmp_path_factory.mktemp("runs") / "vqa", sets=VQA, device="cpu")
    return out


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200)))
    out, _ = train("gpt-char", data=str(corpus), out=root / "gpt", sets=GPT, device="cpu")
    return out


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    sets = {"widths": [8, 16], "depths": [1, 1], "batch_size": 32, "max_iters": 2, "eval_interval": 0,
            "progress": False, "report": False}
    out, _ = train("cnn", out=tmp_path_factory.mktemp("runs") / "cnn", sets=sets, device="cpu")
    return out


def _layer_out(attention, x):
    with torch.no_grad():
        return attention(x)


def test_a_zeroed_head_is_its_slice_of_the_concatenation_set_to_zero_and_the_hook_goes_away():
    torch.manual_seed(0)
    attention = MultiHeadAttention(8, 2).eval()
    x = torch.randn(3, 5, 8)
    seen = {}
    handle = attention.out_proj.register_forward_hook(lambda _m, args, _out: seen.update(concat=args[0].clone()))
    full = _layer_out(attention, x)
    handle.remove()
    concat = seen["concat"]  # (B, N, H·E) before W_o
    zeroed = concat.clone()
    zeroed[..., 4:] = 0
    with ablated_head(attention, 1):
        got = _layer_out(attention, x)
    assert torch.allclose(got, attention.out_proj(zeroed).detach(), atol=1e-6)
    assert torch.allclose(_layer_out(attention, x), full)  # the hook is removed
    with recorded_means([attention]) as means:
        _layer_out(attention, x)
        _layer_out(attention, x[:1])
    everything = torch.cat([concat, concat[:1]])  # (4, N, H·E): both batches
    assert torch.allclose(means[0].head(0), everything[..., :4].mean(0), atol=1e-6)
    replaced = concat.clone()
    replaced[..., :4] = everything[..., :4].mean(0)
    with ablated_head(attention, 0, means[0].head(0)):
        got = _layer_out(attention, x)
    assert torch.allclose(got, attention.out_proj(replaced).detach(), atol=1e-6)
    with pytest.raises(DataError, match="head 2 out of range"):
        with ablated_head(attention, 2):
            pass


def test_every_vqa_head_is_measured_per_template_and_its_cost_is_the_accuracy_it_loses(vqa_run):
    run = load(vqa_run)
    jobs = head_jobs(run, limit=40)
    held = run.data.held_out().subset(list(range(40)))
    templates = sorted(set(held.templates))
    assert jobs.groups == [*templates, "all"] and jobs.examples == 40 and jobs.threshold == THRESHOLDS["vqa"]
    assert [job.name for job in jobs.heads] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    layers = self_attention_layers(run.model)
    with ablated_head(layers[1], 0):  # the same number, measured here by hand
        by_hand = exact_match(run.model, held, run.data.words, run.model.config.max_question_len)
    job = jobs.heads[2]
    assert job.scores["all"] == by_hand["exact_match"] and job.cost["all"] == pytest.approx(
        jobs.baseline["all"] - by_hand["exact_match"], abs=1e-3)
    assert {group: job.scores[group] for group in templates} == {t: by_hand[f"exact_match_{t}"] for t in templates}
    # the standard error counts the questions whose answer turned right or wrong: 100 √(lost + gained) / n
    questions = encode_questions(held.questions, run.data.words, run.model.config.max_question_len)
    right = predict(run.model, held.images, questions) == held.answers
    with ablated_head(layers[1], 0):
        right_ablated = predict(run.model, held.images, questions) == held.answers
    changed = int((right != right_ablated).sum())
    assert set(job.error) == set(jobs.groups) and job.error["all"] == pytest.approx(100 * changed ** 0.5 / 40, abs=1e-3)
    assert jobs.typical_error() is not None
    for job in jobs.heads:
        assert 0 < job.distance < 100  # pixels, in a 64-pixel picture
        assert sum(job.attends.values()) == pytest.approx(1.0, abs=1e-3) and job.attends["sink"] == 0.0
    assert jobs.necessary() == {group: [job.name for job in jobs.heads if job.cost[group] > 5.0]
                                for group in jobs.groups}
    mean = head_jobs(run, ablation="mean", limit=40, layer=1, head=0)
    assert [job.name for job in mean.heads] == ["L1H0"] and mean.baseline == jobs.baseline


def test_a_language_models_heads_cost_nats_of_loss_by_character_class(gpt_run):
    assert [character_class(text) for text in ("a", "É", " ", "\n", ".", "7", "")] == \
        ["letter", "letter", "space", "space", "other", "other", "other"]
    run = load(gpt_run)
    jobs = head_jobs(run, limit=4)
    assert jobs.unit == "nats" and not jobs.higher_is_better and jobs.examples == 4
    assert set(jobs.groups) == {"letter", "space", "other", "all"} and len(jobs.heads) == 4
    for job in jobs.heads:
        assert job.cost["all"] == pytest.approx(job.scores["all"] - jobs.baseline["all"], abs=1e-3)
        assert 0 <= job.distance <= 15  # tokens back, within a 16-token window
        assert job.attends == {}


def test_the_cli_prints_a_table_and_json_and_writes_nothing(vqa_run, gpt_run, capsys):
    before = sorted(p.name for p in vqa_run.iterdir())
    assert main(["heads", str(vqa_run), "--limit", "20"]) == 0
    table = capsys.readouterr().out
    assert "exact match (%) on 20 held-out questions" in table and "L1H1" in table and "necessary (cost > 5" in table
    assert main(["heads", str(vqa_run), "--limit", "20", "--json", "--ablation", "mean", "--layer", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ablation"] == "mean" and [job["layer"] for job in data["heads"]] == [0, 0]
    assert set(data["necessary"]) == set(data["groups"])
    assert sorted(p.name for p in vqa_run.iterdir()) == before
    assert main(["heads", str(gpt_run), "--limit", "2", "--head", "1"]) == 0
    assert "nats gained" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--layer", "2"], "layer 2 out of range: the model has layers 0..1"),
    (["--head", "-1"], "head -1 out of range: the model has heads 0..1"),
    (["--limit", "0"], "--limit must be at least 1"),
])
def test_bad_indices_are_one_line_and_exit_2(vqa_run, capsys, argv, message):
    assert main(["heads", str(vqa_run), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_:
        main(["heads", str(vqa_run), "--ablation", "half"])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_a_run_without_heads_is_refused_in_one_line(cnn_run, capsys, tmp_path):
    before = sorted(p.name for p in cnn_run.iterdir())
    assert main(["heads", str(cnn_run)]) == 2
    err = capsys.readouterr().err
    assert "has no attention heads to ablate" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in cnn_run.iterdir()) == before
    with pytest.raises(RunError, match="no attention heads"):
        head_jobs(load(cnn_run))


def test_the_reports_section_has_the_table_and_the_heat_map(vqa_run):
    from tokennet.viz.heads import draw_head_costs
    from tokennet.viz.report.html import png_size

    run = load(vqa_run)
    [(title, body)] = run.task._heads_section(run)
    assert title == "Heads' jobs" and "each attention layer can be attending to different things" in body
    assert body.count("<tr>") == 1 + 1 + 4 and "data:image/png;base64," in body  # header, unablated, 4 heads
    both = [head_jobs(run, limit=20, ablation=mode).to_dict() for mode in ("zero", "mean")]
    width, height = png_size(draw_head_costs(both))
    assert width > height > 100


def test_a_tuned_run_with_a_sink_and_patch_local_attention_shows_the_sink_and_no_distance(tmp_path):
    from tokennet.tasks.heads_command import format_head_jobs

    sets = {**VQA, "max_iters": 2, "test_size": 12, "transformer": "tuned", "read_layers": [1]}
    out, _ = train("vqa", out=tmp_path / "tuned", sets=sets, device="cpu")
    jobs = head_jobs(load(out))
    assert all(job.distance is None for job in jobs.heads)  # patch-local: a patch never attends to another patch
    for job in jobs.heads:
        assert sum(job.attends.values()) == pytest.approx(1.0, abs=1e-3) and job.attends["sink"] > 0
    table = format_head_jobs(jobs)
    assert "asked/other/words/self/sink" in table and "—" in table.splitlines()[3]
