"""The loggers next to metrics.jsonl: metrics.csv, TensorBoard (read back with tensorboard's own reader),
wandb, MLflow, logger objects from Python; a resumed run continues each without duplicates; the CLI
takes the loggers' settings from their environment variables; a missing package is one line."""

import csv
import importlib.machinery
import json
import re
import sys
import time
import types

import pytest
from helpers import tiny_run_config as cfg  # vit_test, 2 epochs of 4 steps (batch 8) on tiny_splits()
from helpers import tiny_splits

from vitkit.cli.main import main
from vitkit.train import train
from vitkit.train.metrics import CSV_COLUMNS, csv_row

pytestmark = pytest.mark.usefixtures("one_thread")


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def csv_rows(run):
    with open(run / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        return list(reader)


def expected_csv(run):
    """metrics.csv as metrics.jsonl says it should be: a row for each step and eval record."""
    rows = [csv_row(r) for r in records(run)]
    return [{k: str(v) for k, v in r.items()} for r in rows if r is not None]


def crash_then_resume(run, loggers, epochs=3):
    """Train, crash during step 7 (the last checkpoint is epoch 1's, at step 4: steps 5 and 6 are logged
    past it), then resume to the end."""
    def crash():
        crash.calls += 1
        if crash.calls == 7:
            raise RuntimeError("crash")
        return False

    crash.calls = 0
    c = cfg(epochs=epochs, eval_every=1, loggers=loggers)
    with pytest.raises(RuntimeError):
        train(c, run, splits=tiny_splits(), stop=crash, log=lambda m: None)
    assert [r["step"] for r in records(run) if r["type"] == "step"] == [1, 2, 3, 4, 5, 6]
    return train(c, run, resume=True, splits=tiny_splits(), log=lambda m: None)


def test_csv_holds_the_steps_and_evaluations_and_is_trimmed_on_resume(tmp_path):
    run = tmp_path / "run"
    s = crash_then_resume(run, ["csv"])
    assert s["status"] == "completed" and s["step"] == 12
    rows = csv_rows(run)
    assert rows == expected_csv(run)
    assert [r["step"] for r in rows if r["split"] == "train"] == [str(i) for i in range(1, 13)]  # each once
    assert [(r["type"], r["step"]) for r in rows if r["split"] == "val"] == [("eval", "4"), ("eval", "8"),
                                                                             ("eval", "12")]
    assert [(r["type"], r["step"], r["split"]) for r in rows][-1] == ("final", "12", "test")  # as metrics.jsonl
    assert (float(rows[-1]["acc"]), float(rows[-1]["loss"])) == (s["test_acc"], s["test_loss"])


def test_csv_has_one_test_row_the_last_segments(tmp_path):
    """A run continued for more epochs: the first segment's test row gives way to the longer run's."""
    run = tmp_path / "run"
    train(cfg(loggers=["csv"]), run, splits=tiny_splits(), log=lambda m: None)
    assert [r["step"] for r in csv_rows(run) if r["split"] == "test"] == ["8"]
    s = train(cfg(epochs=3, loggers=["csv"]), run, resume=True, splits=tiny_splits(), log=lambda m: None)
    rows = csv_rows(run)
    assert rows == expected_csv(run) and [r["step"] for r in rows if r["split"] == "test"] == ["12"]
    assert float(rows[-1]["acc"]) == s["test_acc"]


def test_tensorboard_scalars_read_back_with_tensorboards_reader(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    crash_then_resume(run, ["tensorboard"])
    acc = EventAccumulator(str(run))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["test/acc", "test/loss", "train/acc", "train/img_per_s", "train/loss",
                                             "train/lr", "val/acc", "val/loss"]
    recs = records(run)
    steps = [r for r in recs if r["type"] == "step"]
    evals = [r for r in recs if r["type"] == "eval"]
    final = recs[-1]
    for tag, want in [("train/loss", [(r["step"], r["loss"]) for r in steps]),
                      ("train/acc", [(r["step"], r["train_acc"]) for r in steps]),
                      ("train/lr", [(r["step"], r["lr"]) for r in steps]),
                      ("val/acc", [(r["step"], r["acc"]) for r in evals]),
                      ("test/acc", [(final["step"], final["test_acc"])])]:
        got = [(e.step, e.value) for e in acc.Scalars(tag)]  # the crashed segment's steps 5, 6: purged
        assert [s for s, _ in got] == [s for s, _ in want], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), tag


def test_wandb_logs_offline_and_a_resumed_run_continues_it(tmp_path):
    pytest.importorskip("wandb")
    run = tmp_path / "run"
    train(cfg(loggers=["wandb"]), run, splits=tiny_splits(), log=lambda m: None)
    run_id = (run / "wandb-id.txt").read_text().strip()
    train(cfg(epochs=3, loggers=["wandb"]), run, resume=True, splits=tiny_splits(), log=lambda m: None)
    assert (run / "wandb-id.txt").read_text().strip() == run_id
    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))  # offline: nothing was sent anywhere
    assert len(files) == 2 and all(f.name == f"run-{run_id}.wandb" for f in files)
    # wandb's own service process writes the files: give it a moment to finish them
    deadline = time.monotonic() + 30
    while not all(b"train/loss" in f.read_bytes() and b"val/acc" in f.read_bytes() for f in files):
        assert time.monotonic() < deadline, [(f, f.stat().st_size) for f in files]
        time.sleep(0.2)


def test_loggers_are_recorded_in_the_run_config(tmp_path, capsys):
    from helpers import FAST_TRAIN_ARGS, image_folder

    data = image_folder(tmp_path / "data")
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", "--out", str(run), "--log", "csv", *FAST_TRAIN_ARGS]) == 0
    assert json.loads((run / "config.json").read_text())["loggers"] == ["csv"]
    assert csv_rows(run) == expected_csv(run)


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_a_missing_logger_package_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, nproc):
    import importlib.util

    import vitkit.train.launch as launch

    started = []
    monkeypatch.setattr(launch, "launch", lambda argv, n: started.append(n) or 0)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    code = main(["train", "--data", str(tmp_path / "nodata"), "--out", str(tmp_path / "r"), "--nproc", nproc,
                 "--threads", "1", "--log", "csv,wandb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and not started and not (tmp_path / "r").exists()
    assert err == ["vitkit: error: loggers: wandb needs the wandb package: pip install 'vitkit[wandb]'"]


def test_an_unknown_logger_is_one_line(tmp_path, capsys):
    code = main(["train", "--data", str(tmp_path), "--log", "tensorbord", "--threads", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert re.fullmatch(r"vitkit: error: config.loggers\[0\]: expected one of 'csv', 'tensorboard', 'wandb', "
                        r"'mlflow', got 'tensorbord'", err[0]), err


# ------------------------------------------------------------------------------ TensorBoard: hparams, confusion
def test_tensorboard_has_the_config_as_hparams_and_the_final_confusion_matrix(tmp_path):
    pytest.importorskip("tensorboard")
    import io

    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run = tmp_path / "run"
    crash_then_resume(run, ["tensorboard"])  # hyper-parameters once (a resumed segment adds none)
    acc = EventAccumulator(str(run), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hp = start.session_start_info.hparams
    assert hp["optim.lr"].number_value == pytest.approx(cfg().optim.lr)
    assert hp["epochs"].number_value == 3 and hp["model"].string_value == "vit_test"
    assert hp["loggers"].string_value == '["tensorboard"]' and hp["ema"].bool_value is False
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == ["val/acc", "val/loss", "test/acc", "test/loss"]
    assert acc.Tags()["images"] == ["test/confusion"]  # at the end of the run only
    (event,) = acc.Images("test/confusion")
    assert event.step == 12
    picture = Image.open(io.BytesIO(event.encoded_image_string))
    assert picture.width > 100 and picture.height > 100


def test_the_confusion_matrix_counts_the_test_split():
    import torch

    from vitkit.model.variants import build_model
    from vitkit.train.trainer import evaluate_split

    model = build_model("vit_test", num_classes=2).eval()
    test = tiny_splits().test
    r = evaluate_split(model, test, torch.device("cpu"), confusion=True)
    m = torch.tensor(r["confusion"])
    assert m.shape == (2, 2) and m.sum() == len(test) == r["n"]
    assert m.sum(1).tolist() == torch.bincount(test.labels, minlength=2).tolist()  # rows: the true classes
    assert m.trace().item() / len(test) == pytest.approx(r["acc"])


# -------------------------------------------------------------------- wandb and MLflow, as their users set them
def fake_module(monkeypatch, name, **attrs):
    """A module ``name`` in sys.modules (with a spec, as importlib.util.find_spec wants) holding ``attrs``."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, module)
    return module


class FakeWandbRun:
    def __init__(self, calls, kw):
        self.calls, self.kw = calls, kw

    def log(self, values, step):
        self.calls.append(("log", step, sorted(values)))

    def finish(self):
        self.calls.append(("finish",))


@pytest.mark.parametrize("settings, mode, project", [
    ({}, "offline", "vitkit"),  # as before: offline, under vitkit
    ({"wandb_mode": "online", "wandb_project": "digits"}, "online", "digits"),
])
def test_wandb_takes_the_mode_and_project_of_the_config(tmp_path, monkeypatch, settings, mode, project):
    calls: list = []
    inits: list = []

    def init(**kw):
        inits.append(kw)
        return FakeWandbRun(calls, kw)

    fake_module(monkeypatch, "wandb", init=init)
    train(cfg(loggers=["wandb"], **settings), tmp_path / "run", splits=tiny_splits(), log=lambda m: None)
    (kw,) = inits
    assert (kw["mode"], kw["project"], kw["name"]) == (mode, project, "run")
    assert kw["config"]["loggers"] == ["wandb"] and calls[-1] == ("finish",)
    assert ("log", 1, ["train/acc", "train/img_per_s", "train/loss", "train/lr"]) in calls


class FakeMlflowClient:
    """What vitkit calls of mlflow.tracking.MlflowClient, recorded in ``FakeMlflowClient.calls``."""

    calls: list = []
    experiments: dict = {}

    def __init__(self, tracking_uri):
        self.calls.append(("client", tracking_uri))

    def get_experiment_by_name(self, name):
        found = self.experiments.get(name)
        return types.SimpleNamespace(experiment_id=found) if found else None

    def create_experiment(self, name, artifact_location=None):
        self.experiments[name] = f"exp-{name}"
        return self.experiments[name]

    def create_run(self, experiment_id, run_name):
        self.calls.append(("run", experiment_id, run_name))
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))

    def log_param(self, run_id, key, value):
        self.calls.append(("param", run_id, key, value))

    def log_metric(self, run_id, key, value, step):
        self.calls.append(("metric", run_id, key, step))

    def set_terminated(self, run_id):
        self.calls.append(("end", run_id))


def test_mlflow_records_params_once_and_the_metrics_of_a_resumed_run_in_the_same_run(tmp_path, monkeypatch):
    FakeMlflowClient.calls, FakeMlflowClient.experiments = [], {}
    mlflow = fake_module(monkeypatch, "mlflow")
    mlflow.tracking = fake_module(monkeypatch, "mlflow.tracking", MlflowClient=FakeMlflowClient)
    run = tmp_path / "run"
    crash_then_resume(run, ["mlflow"])
    calls = FakeMlflowClient.calls
    assert [c for c in calls if c[0] == "client"] == [("client", f"sqlite:///{(run / 'mlflow.db').resolve()}")] * 2
    assert [c for c in calls if c[0] == "run"] == [("run", "exp-vitkit", "run")]  # the resumed run continues it
    assert (run / "mlflow-id.txt").read_text() == "r1\n"
    params = {c[2]: c[3] for c in calls if c[0] == "param"}
    assert len([c for c in calls if c[0] == "param"]) == len(params)  # each once
    assert params["optim.lr"] == str(cfg().optim.lr) and params["loggers"] == '["mlflow"]'
    steps = [c[3] for c in calls if c[0] == "metric" and c[2] == "train/loss"]
    assert steps == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8, 9, 10, 11, 12]  # MLflow keeps the crashed segment's 5, 6 too
    assert ("metric", "r1", "test/acc", 12) in calls and calls[-1] == ("end", "r1")


def test_mlflow_for_real_in_a_store_mlflow_takes(tmp_path, monkeypatch):
    """With the installed mlflow (3.x refuses file stores): the run's SQLite store, nothing written outside
    the run directory, and a resumed run continues the same MLflow run."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    train(cfg(loggers=["mlflow"]), run, splits=tiny_splits(), log=lambda m: None)
    train(cfg(epochs=3, loggers=["mlflow"]), run, resume=True, splits=tiny_splits(), log=lambda m: None)
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    got = client.get_run((run / "mlflow-id.txt").read_text().strip())
    assert got.data.params["model"] == "vit_test" and "test/acc" in got.data.metrics
    assert [m.step for m in client.get_metric_history(got.info.run_id, "test/acc")] == [8, 12]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no mlruns/ in the working folder


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_a_store_mlflow_refuses_is_one_line_naming_it_before_wandb_starts(tmp_path, capfd, monkeypatch, nproc):
    mlflow = pytest.importorskip("mlflow")
    from helpers import FAST_TRAIN_ARGS, image_folder

    started = []  # in this process (one), a wandb listed first must not have started its run
    fake_module(monkeypatch, "wandb", init=lambda **kw: started.append(kw))
    loggers = "wandb,mlflow" if nproc == "1" else "csv,mlflow"
    store = (tmp_path / "mlruns").as_uri()  # a file store, which mlflow 3 refuses (2.x took it)
    if mlflow.__version__.startswith(("1.", "2.")):
        store = "bogus://nowhere"
    data = image_folder(tmp_path / "data")
    code = main(["train", "--data", str(data), "--out", str(tmp_path / "r"), "--nproc", nproc, *FAST_TRAIN_ARGS,
                 "--epochs", "1", "--log", loggers, "--set", f"mlflow_tracking_uri={store}"])
    err = [line for line in capfd.readouterr().err.strip().splitlines() if line.strip()]
    assert code == 1 and not started, err
    assert len(err) == 1 and err[0].startswith("vitkit: error: loggers: mlflow could not start ("), err


# ------------------------------------------------------------------------------ logger objects from Python
class ListLogger:
    def __init__(self):
        self.metrics, self.hparams, self.closed = [], [], 0

    def log_metrics(self, metrics, step):
        self.metrics.append((step, dict(metrics)))

    def log_hparams(self, hparams):
        self.hparams.append(hparams)

    def close(self):
        self.closed += 1


def test_a_logger_object_gets_the_metrics_hparams_and_close(tmp_path):
    run = tmp_path / "run"
    obj = ListLogger()
    minimal = types.SimpleNamespace(got=[])
    minimal.log_metrics = lambda metrics, step: minimal.got.append(step)  # the one method a logger needs
    train(cfg(loggers=["csv"]), run, splits=tiny_splits(), log=lambda m: None, loggers=[obj, minimal])
    recs = records(run)
    steps = [r for r in recs if r["type"] == "step"]
    got = [(s, m["train/loss"]) for s, m in obj.metrics if "train/loss" in m]
    assert got == [(r["step"], r["loss"]) for r in steps]
    assert [s for s, m in obj.metrics if "val/acc" in m] == [r["step"] for r in recs if r["type"] == "eval"]
    assert obj.metrics[-1] == (8, {"test/loss": recs[-1]["test_loss"], "test/acc": recs[-1]["test_acc"]})
    (hp,) = obj.hparams
    assert hp["model"] == "vit_test" and hp["optim.lr"] == cfg().optim.lr and obj.closed == 1
    assert minimal.got == [step for step, _ in obj.metrics]
    assert csv_rows(run) == expected_csv(run)  # beside the config's named loggers


def test_an_object_without_log_metrics_is_one_line(tmp_path):
    from vitkit.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^loggers: a dict has no log_metrics\(metrics, step\) method$"):
        train(cfg(), tmp_path / "run", splits=tiny_splits(), log=lambda m: None, loggers=[{}])


# ------------------------------------------------------------------------------ the CLI reads the environment
def test_logger_settings_follow_the_libraries_environment_variables(tmp_path):
    from vitkit.cli.logger_env import logger_settings

    none = {"wandb_mode": None, "wandb_project": None, "mlflow_tracking_uri": None, "mlflow_experiment": None}
    assert logger_settings({}, tmp_path) == none  # no credentials: the config's default, offline
    assert logger_settings({"WANDB_API_KEY": "k"}, tmp_path)["wandb_mode"] == "online"
    assert logger_settings({"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}, tmp_path)["wandb_mode"] == "offline"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert logger_settings({}, tmp_path)["wandb_mode"] == "online"
    (tmp_path / ".netrc").write_text("machine example.com\n  login user\n  password secret\n")
    assert logger_settings({}, tmp_path)["wandb_mode"] is None
    env = {"WANDB_MODE": "disabled", "WANDB_PROJECT": "p", "MLFLOW_TRACKING_URI": "http://localhost:5000",
           "MLFLOW_EXPERIMENT_NAME": "e"}
    assert logger_settings(env, tmp_path) == {"wandb_mode": "disabled", "wandb_project": "p",
                                              "mlflow_tracking_uri": "http://localhost:5000", "mlflow_experiment": "e"}


def test_the_cli_passes_the_environment_to_the_run_config_and_set_wins(tmp_path, monkeypatch):
    from helpers import FAST_TRAIN_ARGS, image_folder

    monkeypatch.setenv("WANDB_PROJECT", "digits")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HOME", str(tmp_path))
    data = image_folder(tmp_path / "data")
    args = ["train", "--data", str(data), "--epochs", "1", *FAST_TRAIN_ARGS]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (saved["wandb_project"], saved["wandb_mode"]) == ("digits", "offline")
    assert main([*args, "--out", str(tmp_path / "b"), "--set", "wandb_project=other"]) == 0
    assert json.loads((tmp_path / "b" / "config.json").read_text())["wandb_project"] == "other"


def test_the_confusion_image_without_matplotlib_is_a_heat_map(monkeypatch):
    import vitkit.train.metrics as metrics

    drawn = metrics.confusion_image([[3, 1], [0, 4]], ["a", "b"])
    assert drawn.ndim == 3 and drawn.shape[2] == 3 and drawn.dtype.name == "uint8"
    monkeypatch.setattr(metrics, "confusion_png", lambda *a: None)
    heat = metrics.confusion_image([[3, 1], [0, 4]], ["a", "b"])
    assert heat.shape == (16, 16, 3)  # 8 pixels a cell
    assert heat[0, 0, 0] == 63 and heat[0, 8, 0] == 191 and heat[8, 0, 0] == 255 and heat[8, 8, 0] == 0
