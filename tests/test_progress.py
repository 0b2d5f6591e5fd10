"""Progress: the ETA (a time cap ends it sooner), lines for a log and a bar for a terminal, and the tasks
that training, decoding, eval and predict report; `vitkit train` writing progress lines to a log."""

import io
import re

import pytest
from helpers import FAST_TRAIN_ARGS, image_folder, tiny_model, tiny_run_config, tiny_splits

from vitkit.cli.main import main
from vitkit.core.progress import Progress, ProgressBar, ProgressLines, eta_seconds, make_progress

pytestmark = pytest.mark.usefixtures("one_thread")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder(Progress):
    """Keeps every task it is given, with the counts each update reached and how it ended."""

    def __init__(self):
        super().__init__()
        self.tasks = []

    def begin(self, task):
        task.seen, task.ended = [], None
        self.tasks.append(task)

    def show(self, task):
        task.seen.append(task.done)

    def end(self, task, completed):
        task.ended = completed

    def named(self, prefix):
        return [t for t in self.tasks if t.what.startswith(prefix)]


# ================================================================================================ the ETA
def test_eta_is_the_work_left_at_the_rate_unless_the_time_cap_ends_first():
    assert eta_seconds(100, 10.0) == (10.0, False)
    assert eta_seconds(100, 10.0, budget_left=60.0) == (10.0, False)  # the steps end first
    assert eta_seconds(100, 10.0, budget_left=4.0) == (4.0, True)  # the cap ends first
    assert eta_seconds(100, 0.0) == (None, False)  # no rate yet
    assert eta_seconds(100, 0.0, budget_left=30.0) == (30.0, True)
    assert eta_seconds(100, 10.0, budget_left=-3.0) == (0.0, True)  # the budget is spent


def test_task_eta_counts_from_its_start_and_honours_its_budget():
    clock = Clock()
    p = Progress(clock)
    task = p.task("train", 1000, unit="steps", done=200, budget=60.0)  # a resumed run, 60 s of budget left
    clock.now += 10
    task.update(300)  # 100 steps in 10 s: 70 s for the 700 left, but the budget ends in 50 s
    assert task.rate() == pytest.approx(10.0)
    assert task.eta() == (pytest.approx(50.0), True)
    free = p.task("decode", 1000, unit="images")
    clock.now += 10
    free.update(500)
    assert free.eta() == (pytest.approx(10.0), False)


# ============================================================================================ what is shown
def test_lines_every_n_seconds_then_a_closing_line():
    clock, out = Clock(), io.StringIO()
    p = ProgressLines(out, every=30, clock=clock)
    with p.task("decoding data/", 300, unit="images") as task:
        for _ in range(30):
            clock.now += 2
            task.update(advance=10)
    lines = out.getvalue().splitlines()
    assert lines == ["decoding data/: 150/300 images (50.0%), 5 images/s, 30s elapsed, ETA 30s",
                     "decoding data/: 300/300 images (100.0%), 5 images/s, 1m00s elapsed, ETA 0s",
                     "decoding data/: 300 images in 60.0s (5 images/s)"]


def test_quick_work_is_silent_and_a_failed_task_has_no_closing_line():
    clock, out = Clock(), io.StringIO()
    p = ProgressLines(out, every=30, clock=clock)
    with p.task("predicting", 4, unit="images") as task:
        clock.now += 1
        task.update(4)
    assert out.getvalue() == ""  # under min(every, 5 s) and no line shown: nothing
    with pytest.raises(RuntimeError):
        with p.task("evaluating", 8, unit="images") as task:
            clock.now += 40
            task.update(4)
            raise RuntimeError("stop")
    assert out.getvalue().splitlines() == ["evaluating: 4/8 images (50.0%), 0 images/s, 40s elapsed, ETA 40s"]


def test_training_line_shows_its_notes_and_the_time_cap():
    clock, out = Clock(), io.StringIO()
    p = ProgressLines(out, every=30, clock=clock)
    task = p.task("train", 2500, unit="steps", budget=240.0, rate=False, closing=False)
    task.info = ("epoch 1/20", "loss 0.8123", "train acc 71.3%", "812 img/s")
    clock.now += 30
    task.update(400)  # 2100 steps left at 13.3/s: 158 s, within the 210 s left
    clock.now += 30
    task.update(600)  # 1900 steps left at 10/s: 190 s, but the cap ends in 180 s
    task.close()
    assert out.getvalue().splitlines() == [
        "train: 400/2500 steps (16.0%), epoch 1/20, loss 0.8123, train acc 71.3%, 812 img/s, 30s elapsed, ETA 2m38s",
        "train: 600 steps (25.0% of 4m00s), epoch 1/20, loss 0.8123, train acc 71.3%, 812 img/s, 1m00s elapsed, "
        "ETA 3m00s (time cap)"]  # the clock is to end it first: the line counts the time, not the steps


def test_bar_on_a_terminal_shows_the_notes_and_its_own_eta():
    clock, out = Clock(), io.StringIO()
    p = ProgressBar(out, clock=clock)
    with p.task("train", 100, unit="steps", budget=20.0, rate=False) as task:
        task.info = ("loss 0.5000",)
        clock.now += 5
        task.update(10)  # 90 steps left at 2/s: 45 s; the cap: 15 s
        text = out.getvalue()
        assert "train:" in text and "10/" in text and "loss 0.5000" in text and "ETA 15s (time cap)" in text
        clock.now += 1
        task.update(12)  # the bar's end moves to where the cap stops it: 12 steps + 2/s x 14 s = 40
        assert p.bars[id(task)].total == 40


def test_the_command_line_chooses_bar_lines_or_nothing():
    out = io.StringIO()
    assert type(make_progress(out, tty=True)) is ProgressBar
    assert type(make_progress(out, tty=False, every=30)) is ProgressLines
    assert type(make_progress(out, tty=False, every=0)) is Progress
    assert type(make_progress(out, tty=True, quiet=True)) is Progress


# ================================================================================ the tasks the library reports
def test_decoding_a_folder_is_counted(tmp_path):
    from vitkit.data import open_dataset

    data = image_folder(tmp_path / "data", n=40, test=8)
    rec = Recorder()
    open_dataset(data, num_workers=1, progress=rec)
    train, test = rec.tasks
    assert train.what == f"decoding {data / 'train'}" and test.what == f"decoding {data} (test)"
    assert train.seen[-1] == train.total == 80 and test.seen[-1] == test.total == 16
    assert train.ended and test.ended
    rec = Recorder()
    open_dataset(data, in_memory=False, progress=rec)  # streamed: the headers are read up front
    assert rec.tasks[0].what.startswith("reading the headers of") and rec.tasks[0].seen[-1] == 80


def test_eval_and_predict_count_their_images(tmp_path):
    from vitkit.tools.evaluate import evaluate
    from vitkit.tools.predict import predict

    data = image_folder(tmp_path / "data", classes=("a", "b"), n=4, test=10)
    model = tiny_model(num_classes=2, labels=["a", "b"])
    rec = Recorder()
    evaluate(model, data=str(data), batch_size=8, progress=rec)
    (task,) = rec.named("evaluating")
    assert task.seen == [8, 16, 20] and task.total == 20 and task.ended
    rec = Recorder()
    predict(model, [str(data / "test")], batch_size=16, progress=rec)
    (task,) = rec.named("predicting")
    assert task.seen == [16, 20] and task.total == 20 and task.ended


def test_training_reports_its_steps(tmp_path):
    from vitkit.train import train

    rec = Recorder()
    train(tiny_run_config(), tmp_path / "run", splits=tiny_splits(), progress=rec, log=lambda m: None)
    (task,) = rec.named("train")
    assert task.seen == list(range(1, 9)) and task.total == 8 and task.ended
    assert task.info[0] == "epoch 2/2" and task.info[1].startswith("loss ")


def test_train_writes_progress_lines_to_a_log(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    argv = ["train", "--data", str(data), "--epochs", "2", "--out", str(tmp_path / "run"), "--json",
            "--progress-every", "0.000001", "--max-minutes", "30", "--set", "log_every=1",
            *[a for a in FAST_TRAIN_ARGS if a != "--quiet"]]
    assert main(argv) == 0
    out, err = capsys.readouterr()  # stderr is not a terminal here: lines, not a bar
    lines = [line for line in err.splitlines() if line.startswith("train: ")]
    assert len(lines) == 6, err  # one a step: 24 images / 8 = 3 steps an epoch
    pattern = (r"train: (\d)/6 steps \(\d+\.\d%\), epoch [12]/2, loss \d\.\d{4}, train acc \d+\.\d%, lr \S+, "
               r"\d+ img/s, \d+s elapsed, ETA \d+s")
    assert all(re.fullmatch(pattern, line) for line in lines), lines
    assert [int(re.match(pattern, line)[1]) for line in lines] == [1, 2, 3, 4, 5, 6]
    assert out.splitlines()[-2].startswith("test accuracy")  # stdout keeps its last two lines
    capsys.readouterr()
    argv[argv.index(str(tmp_path / "run"))] = str(tmp_path / "quiet")
    assert main([*argv, "--quiet"]) == 0
    assert "train: " not in capsys.readouterr().err


def test_only_rank_0_of_a_distributed_run_reports(tmp_path):
    """Two ranks started as torchrun starts them, each with its own stderr: rank 0 shows the decoding and
    the steps, rank 1 nothing."""
    import os
    import subprocess
    import sys

    from helpers import free_port

    data = image_folder(tmp_path / "data")
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), WORLD_SIZE="2",
               LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    argv = [sys.executable, "-m", "vitkit", "train", "--data", str(data), "--epochs", "1", "--out",
            str(tmp_path / "run"), "--progress-every", "0.000001", *[a for a in FAST_TRAIN_ARGS if a != "--quiet"]]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    (out0, err0), (out1, err1) = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], err0 + err1
    assert sum(line.startswith("train: ") for line in err0.splitlines()) == 3, err0  # 24 images / 8 a step
    assert any(line.startswith("decoding ") for line in err0.splitlines()), err0
    assert out1 == "" and "train: " not in err1 and "decoding " not in err1, err1
