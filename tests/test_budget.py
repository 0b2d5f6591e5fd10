"""A time budget (``--max-minutes``) holds the whole run: ``train`` returns within the budget plus 10%,
whatever the run spends before its first step (a slow logger's start-up, a probe's feature pass) and after
its last (the final validation, a large test split scored with test-time views), and the schedule plans
for the training time that remains (its learning rate ends its decay when training stops).

Each test times one bounded ``train`` call, the behaviour itself. The process is warmed first: the first
optimizer a process builds imports torch's compiler machinery, once a process, 4 to 7 s on a loaded
2-core machine. A run pays it inside its budget as start-up (training gets what is left), but in a budget
of a few seconds it would leave nothing to measure, so the tests time the run's own work."""

import json
import time

import pytest
import torch
from helpers import tiny_model, tiny_run_config, tiny_set

import vitkit
from vitkit.data.sets import DataSplits
from vitkit.train import features as features_module
from vitkit.train import trainer as trainer_module
from vitkit.train.budget import eval_views
from vitkit.train.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")
SLACK = 1.1  # the budget's allowance: M minutes end within M plus 10%


@pytest.fixture(autouse=True)
def warm_process():
    torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())


def splits(train_n=64, val_n=64, test_n=64) -> DataSplits:
    return DataSplits(train=tiny_set(train_n), val=tiny_set(val_n, seed=1), test=tiny_set(test_n, seed=2),
                      classes=["a", "b"], format="folder")


def timed_run(tmp_path, seconds: float, data: DataSplits, loggers=(), **fields) -> tuple[float, dict, list, list]:
    """The wall-clock of one ``train`` call bounded by ``seconds``, its summary, its lines and its step records."""
    cfg = tiny_run_config(epochs=100_000, max_minutes=seconds / 60, **fields)
    lines = []
    t0 = time.perf_counter()
    summary = train(cfg, tmp_path / "run", splits=data, loggers=loggers, log=lines.append)
    total = time.perf_counter() - t0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return total, summary, lines, [r for r in records if r["type"] == "step"]


@pytest.fixture
def slow_eval(monkeypatch):
    """Scoring a batch takes 1 ms an image and view more than the tiny model's own time: a slow evaluation,
    its time little changed by other work on the machine (the training steps are as they are)."""
    real = trainer_module.model_logits

    def slow(model, x, tta=False, shift=0, flip=True):
        time.sleep(0.001 * len(x) * eval_views(tta, shift, flip))
        return real(model, x, tta, shift, flip)

    monkeypatch.setattr(trainer_module, "model_logits", slow)


def test_a_budget_holds_the_run_with_a_slow_evaluation(tmp_path, slow_eval):
    # 400 test images at 6 views an image: about 2.4 s of evaluation after the last step
    total, summary, lines, steps = timed_run(tmp_path, 8.0, splits(test_n=400), tta=True, tta_shift=2)
    assert total <= 8.0 * SLACK, (total, lines)
    assert "eval_views" not in summary, lines  # all 6 fit
    assert summary["train_seconds"] < 8.0 - 2.4 and summary["test_acc"] > 0.5, summary
    peak = max(s["lr"] for s in steps)
    assert steps[-1]["lr"] < 0.1 * peak, steps[-3:]  # the schedule ended its decay when training stopped


def test_the_evaluation_alone_past_the_budget_scores_fewer_views(tmp_path, slow_eval):
    # 6 views of 1,000 test images take 6 s, the whole budget; 2 views take 2 s
    total, summary, lines, _ = timed_run(tmp_path, 6.0, splits(test_n=1000), tta=True, tta_shift=2)
    assert total <= 6.0 * SLACK, (total, lines)
    assert summary["eval_views"] == 2, lines
    said = [line for line in lines if line.startswith("budget: evaluating with")]
    assert len(said) == 1 and "rather than 6 views" in said[0]


class SlowStart:
    """A logger whose start-up takes 2 s (a store's migration)."""

    def log_hparams(self, hparams):
        time.sleep(2.0)

    def log_metrics(self, metrics, step):
        pass


def test_a_slow_logger_start_comes_out_of_the_budget(tmp_path):
    total, summary, lines, steps = timed_run(tmp_path, 6.0, splits(), loggers=[SlowStart()])
    assert total <= 6.0 * SLACK, (total, lines)
    assert summary["train_seconds"] <= 6.0 - 2.0
    peak = max(s["lr"] for s in steps)
    assert len(steps) > 10 and steps[-1]["lr"] < 0.1 * peak  # planned for the time the start-up left


def test_a_probe_fits_its_feature_pass_in_the_budget(tmp_path, monkeypatch):
    weights = tmp_path / "weights"
    vitkit.save(tiny_model(num_classes=2, seed=1), weights)
    real = features_module.compute_features

    def slow(model, images, *args, **kwargs):  # a backbone of 2 ms an image
        time.sleep(0.002 * len(images))
        return real(model, images, *args, **kwargs)

    monkeypatch.setattr(features_module, "compute_features", slow)
    # 2,000 training images: 4 s of features alone, past the 4-s budget
    total, summary, lines, steps = timed_run(tmp_path, 4.0, splits(train_n=2000), init_from=str(weights),
                                             tune="probe", optim=dict(lr=0.05))
    assert total <= 4.0 * SLACK, (total, lines)
    cut = [line for line in lines if "training images a class" in line]
    assert len(cut) == 1 and "classes balanced" in cut[0], lines
    trained = next(line for line in lines if line.startswith("probe: "))
    assert "train 2000" not in trained and summary["test_acc"] > 0.5 and steps


def test_a_replay_scores_the_views_its_run_scored(tmp_path, slow_eval):
    # the run's budget cut its end to 2 views; its replay (no clock of its own) scores those 2, not the 6
    # its config asks for, and so prints the run's test accuracy
    _, summary, _, _ = timed_run(tmp_path, 6.0, splits(test_n=1000), tta=True, tta_shift=2)
    assert summary["eval_views"] == 2
    cfg = tiny_run_config(epochs=100_000, max_minutes=0.1, tta=True, tta_shift=2, replay=str(tmp_path / "run"))
    again = train(cfg, tmp_path / "again", splits=splits(test_n=1000), log=lambda m: None)
    assert again["eval_views"] == 2 and again["step"] == summary["step"]
    assert again["test_acc"] == summary["test_acc"]
