"""A machine's training speed, measured before a run the clock bounds (vitkit.train.speed): real steps of the
run's model, kept in the cache folder by machine and run, a cache that cannot be read or written never
an error or a hang; and a run whose recipe measured it says so first and takes the time from its budget."""

import json
import os
from pathlib import Path

import pytest
import torch
from helpers import image_folder

from vitkit.cli.main import main
from vitkit.train.config import RunConfig, resolve_config
from vitkit.train.recipe import SMALL_DATA, SMALL_DATA_CANDIDATES
from vitkit.train.speed import SPEED_FILE, machine_key, measure_speed, read_speeds, run_key, store_speed

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


def tiny(**fields) -> tuple[RunConfig, object]:
    from vitkit.train.build import model_config

    cfg = resolve_config(None, {}, [], base={"model": "vit_test", "batch_size": 8, "processes": 2, **fields})
    return cfg, model_config(cfg)


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    """A quiet machine, whatever else this one runs: its speeds are kept."""
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))


def test_a_busy_cpus_speed_serves_its_run_and_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    cfg, mcfg = tiny()
    assert measure_speed(cfg, mcfg, torch.device("cpu"), threads=1, cache_dir=tmp_path).images_per_s > 0
    assert not (tmp_path / SPEED_FILE).exists()


def test_a_speed_is_measured_once_then_read_from_the_cache(tmp_path):
    cfg, mcfg = tiny()
    first = measure_speed(cfg, mcfg, torch.device("cpu"), threads=1, cache_dir=tmp_path)
    assert first.images_per_s > 0 and first.seconds > 0 and not first.cached
    again = measure_speed(cfg, mcfg, torch.device("cpu"), threads=1, cache_dir=tmp_path)
    assert (again.images_per_s, again.seconds, again.cached) == (pytest.approx(first.images_per_s, rel=1e-3), 0.0, True)
    saved = json.loads((tmp_path / SPEED_FILE).read_text())
    (key, entry), = saved.items()
    assert key.startswith(machine_key(torch.device("cpu"))) and key.endswith(run_key(cfg, mcfg.img_size, 1))
    assert entry["images_per_s"] == pytest.approx(first.images_per_s, rel=1e-3)
    # what sets a step's cost is in the key: another batch, model or precision is measured anew
    other, omcfg = tiny(batch_size=16)
    assert not measure_speed(other, omcfg, torch.device("cpu"), threads=1, cache_dir=tmp_path).cached
    assert len(read_speeds(tmp_path / SPEED_FILE)) == 2


def test_the_processes_train_together_each_on_its_share_of_the_batch(monkeypatch):
    import vitkit.train.speed as speed

    seen = []
    monkeypatch.setattr(speed, "timed_steps", lambda trainer, images, batch, device, steps: seen.append(
        (trainer.cfg.batch_size, trainer.cfg.processes, len(images), torch.get_num_threads())) or 100.0)
    cfg, mcfg = tiny(batch_size=8, processes=2)
    assert measure_speed(cfg, mcfg, torch.device("cpu"), threads=1).images_per_s == 200.0
    assert seen == [(4, 1, 4, 1)]


def test_a_held_measurement_takes_exactly_the_steps_it_is_given(monkeypatch):
    """``process_speed(..., steps=n)`` (benchmarks/speed_measurement.py, where the ranks of a group must take the
    same steps) times n steps after the warm-up ones, however long they take; without it, MIN_STEPS to MAX_STEPS."""
    import vitkit.train.speed as speed
    from vitkit.train.trainer import Trainer

    calls = []
    real = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda self, batch: calls.append(1) or real(self, batch))
    cfg, mcfg = tiny(batch_size=8, processes=2)
    assert speed.process_speed(cfg, mcfg, torch.device("cpu"), 1, 10, steps=7) > 0
    assert len(calls) == speed.WARMUP_STEPS + 7
    calls.clear()
    monkeypatch.setattr(speed, "MIN_SECONDS", 0.0)
    speed.process_speed(cfg, mcfg, torch.device("cpu"), 1, 10)
    assert len(calls) == speed.WARMUP_STEPS + speed.MIN_STEPS


def test_candidates_whose_steps_cost_the_same_are_measured_once_on_a_busy_machine(tmp_path, monkeypatch):
    import vitkit.train.speed as speed
    from vitkit.train.resolve import data_recipe

    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))  # nothing kept in the cache between them
    measured = []
    monkeypatch.setattr(speed, "process_speed", lambda cfg, mcfg, device, threads, classes: measured.append(
        (cfg.model_args["depth"], cfg.model_args["stem_convs"])) or (300.0 if cfg.model_args["stem_convs"] == 1 else 200.0))
    data = image_folder(tmp_path / "data", n=4, test=1)
    recipe, seconds = data_recipe(str(data / "train"), None, {"max_minutes": 5.0, "processes": 2, "threads": 1}, [],
                                  cache_dir=str(tmp_path / "cache"))
    on_cpu = [c for c in SMALL_DATA_CANDIDATES if not c.accelerator]  # a GPU's candidates are not measured here
    costs = {tuple(sorted(c.overrides.get("model_args", {"stem_convs": 2}).items())) for c in on_cpu}
    assert len(on_cpu) > len(costs) == 4  # learning rates share a model's step
    assert sorted(measured) == [(1, 1), (1, 2), (2, 1), (2, 2)]  # one measurement a step cost, not one a candidate
    assert seconds is not None and seconds > 0
    assert "one-block-lr-3x 600 img/s" in recipe.line and "short-lr-3x 600 img/s" in recipe.line and "long-lr-3x 400 img/s" in recipe.line and "long 400 img/s" in recipe.line


@pytest.mark.parametrize("content", ["fifo", "garbage", "list", "bad-values", "directory"])
def test_a_speed_cache_that_is_not_one_is_measured_again_never_read_as_one(tmp_path, content):
    file = tmp_path / SPEED_FILE
    if content == "fifo":
        os.mkfifo(file)  # opened, it would block: never opened
    elif content == "directory":
        file.mkdir()
    else:
        file.write_text({"garbage": "{not json", "list": "[1, 2]",
                         "bad-values": json.dumps({"a": {"images_per_s": "fast"}, "b": {"images_per_s": -1},
                                                   "c": {"images_per_s": float("inf")}, "d": 3})}[content])
    assert read_speeds(file) == {}
    store_speed(file, "k", 12.5)  # a cache that cannot be written is no error
    if content in ("garbage", "list", "bad-values"):
        assert read_speeds(file) == {"k": {"images_per_s": 12.5, "when": read_speeds(file)["k"]["when"]}}


def test_a_cache_folder_that_cannot_be_made_is_no_error(tmp_path):
    (tmp_path / "file").write_text("x")
    cfg, mcfg = tiny()
    assert measure_speed(cfg, mcfg, torch.device("cpu"), threads=1, cache_dir=tmp_path / "file" / "sub").images_per_s > 0


def test_a_run_bounded_by_the_clock_names_its_measured_speed_first_and_takes_the_time_from_its_budget(tmp_path,
                                                                                                       capsys):
    data = image_folder(tmp_path / "data", n=8, test=2)
    cache = tmp_path / "cache"
    argv = ["train", "--data", str(data), "--max-minutes", "0.05", "--nproc", "1", "--threads", "1", "--device", "cpu",
            "--batch-size", "8", "--set", "plots=false", "--cache-dir", str(cache)]
    assert main([*argv, "--out", str(tmp_path / "r1")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("recipe small-data: ") and "; measured on this CPU (" in lines[0]
    assert " img/s -> " in lines[0]
    chosen = {c.name: c for c in SMALL_DATA_CANDIDATES}[lines[0].split("; chose ")[1].split(":")[0]]
    spent = lines[1]
    assert spent.startswith("measuring the speed took ") and spent.endswith(" s of the budget: training for "
                                                                              f"{json.loads((tmp_path / 'r1' / 'config.json').read_text())['max_minutes']:g} min")
    saved = json.loads((tmp_path / "r1" / "config.json").read_text())
    assert 0 < saved["max_minutes"] < 0.05  # the candidate chosen is what trains
    assert saved["model_args"] == {**SMALL_DATA["model_args"], **chosen.overrides.get("model_args", {})}
    assert saved["ema"] == chosen.overrides.get("ema", SMALL_DATA["ema"])
    assert saved["optim"]["lr"] == chosen.overrides.get("optim", SMALL_DATA["optim"])["lr"]
    # one a step cost (the learning rates share a model's), of the candidates measured: a slower one is not where
    # its faster one's speed leaves it fewer epochs than its table's, as so short a budget may
    on_cpu = [c for c in SMALL_DATA_CANDIDATES if not c.accelerator]
    measured = [c for c in on_cpu if f"; {c.name} not measured: " not in lines[0] and f" {c.name} " in lines[0]]
    assert measured and measured[0].name == "one-block-lr-3x"  # the fastest is measured first, always
    costs = {json.dumps({**SMALL_DATA["model_args"], **c.overrides.get("model_args", {}),
                         "ema": c.overrides.get("ema", SMALL_DATA["ema"]) is not None}, sort_keys=True)
             for c in measured}
    assert len(read_speeds(cache / SPEED_FILE)) == len(costs)
    # the next run of the same request on this machine reads them, measuring none again (it may measure a slower
    # candidate the first could not spare the time for: the time the cached ones took is its own)
    first = read_speeds(cache / SPEED_FILE)
    assert main([*argv, "--out", str(tmp_path / "r2")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "measured on this CPU (" in lines[0]
    after = read_speeds(cache / SPEED_FILE)
    assert all(after[k] == v for k, v in first.items())  # read, not measured again
    if len(after) == len(first):  # nothing new to measure: no time taken
        assert not lines[1].startswith("measuring the speed took")
        assert json.loads((tmp_path / "r2" / "config.json").read_text())["max_minutes"] == 0.05
    assert SMALL_DATA["model_args"]["stem_convs"] == 2  # the recipe's table is left as it was


def test_the_demo_says_first_what_its_budget_is_in_epochs_on_this_machine(tmp_path, capsys):
    argv = ["train", "--max-minutes", "0.02", "--epochs", "1", "--nproc", "1", "--threads", "1", "--set", "plots=false",
            "--cache-dir", str(tmp_path / "cache")]
    assert main([*argv, "--out", str(tmp_path / "d")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("measured on this CPU (") and " img/s -> " in first and " epochs in 0.02 min" in first
    # a run of fixed epochs has no budget in minutes to turn into epochs
    assert main(["train", "--epochs", "1", "--nproc", "1", "--threads", "1", "--set", "plots=false",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "e"),
                 "--max-minutes", "0"]) == 0
    assert not capsys.readouterr().out.startswith("measured on")


def test_the_budget_in_epochs_counts_the_images_trained_on_in_the_time_left(tmp_path, capsys):
    """The first line's epochs: of the images the run trains on (a folder with no val or test part holds out 10%),
    in the budget less the end's scoring of the held-out images (``recipe.end_seconds``)."""
    from vitkit.train.recipe import end_seconds

    data = image_folder(tmp_path / "data", n=20, test=1) / "train"  # class folders alone: 40 images, 4 held out
    argv = ["train", "--data", str(data), "--recipe", "none", "--max-minutes", "5", "--epochs", "1", "--nproc", "1",
            "--threads", "1", "--device", "cpu", "--batch-size", "8", "--set", "plots=false", "--cache-dir",
            str(tmp_path / "cache")]
    assert main([*argv, "--out", str(tmp_path / "a"), "--quiet"]) == 0  # measures, keeps the speed in the cache
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0  # reads it: no budget goes to measuring
    first = capsys.readouterr().out.splitlines()[0]
    rate = float(first.split("measured on this CPU (")[1].split(": ")[1].split(" img/s")[0].replace(",", ""))
    epochs = float(first.split(" -> ")[1].split(" epochs")[0])
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["max_minutes"] == 5  # nothing taken for measuring
    want = rate * (300 - end_seconds(config, rate, 4)) / 36
    # the line rounds the epochs to 0.1 and the rate to 1 img/s (0.15% of 342 img/s, on a slow CPU)
    assert epochs == pytest.approx(want, abs=0.06 + want * 0.6 / rate), first
    assert epochs > 1.09 * rate * 300 / 40  # not the whole budget over all 40 images: 40 / 36 of that, less the end


def test_a_fine_tune_bounded_by_the_clock_chooses_its_mode_at_its_measured_speed(tmp_path, capsys):
    """A fine-tune with --max-minutes measures the whole model training (its weights unread: the same cost),
    says so first, and its mode 'auto' weighs that speed, not the FLOP estimate."""
    data = image_folder(tmp_path / "data", n=8, test=2)
    common = ["--data", str(data), "--nproc", "1", "--threads", "1", "--device", "cpu", "--batch-size", "8",
              "--set", "plots=false", "--cache-dir", str(tmp_path / "cache")]
    assert main(["train", *common, "--epochs", "1", "--out", str(tmp_path / "w"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["finetune", str(tmp_path / "w"), *common, "--max-minutes", "0.05", "--out", str(tmp_path / "f")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("measured on this CPU (") and " img/s training the whole model -> " in lines[0], lines
    assert any(ln.startswith("measuring the speed took ") for ln in lines), lines
    tune = next(ln for ln in lines if ln.startswith("fine-tuning "))
    assert "the budget gives a measured full ~" in tune, tune
    # --tune last: the whole model's speed says nothing of its own, so nothing is measured
    assert main(["finetune", str(tmp_path / "w"), *common, "--max-minutes", "0.05", "--tune", "last",
                 "--out", str(tmp_path / "l")]) == 0
    assert not capsys.readouterr().out.startswith("measured on")


def test_a_budget_that_cannot_hold_one_step_is_refused_before_anything_is_written(tmp_path, capsys):
    data = image_folder(tmp_path / "data", n=4, test=2)
    out = tmp_path / "run"
    code = main(["train", "--data", str(data), "--model", "vit_small_patch16_224", "--batch-size", "256",
                 "--max-minutes", "0.3", "--nproc", "1", "--threads", "2", "--device", "cpu", "--precision", "fp32",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and not out.exists()
    assert err.startswith("vitkit: error: --max-minutes 0.3: one training step of batch 256 is about ")
    assert err.endswith("s of work on this CPU (27.6 GFLOPs an image on 2 thread(s) at about 20 GFLOP/s each), more "
                        "than the budget; lower --batch-size (about 26 fits) or raise --max-minutes")
    assert "\n" not in err


def test_a_progressive_run_is_timed_at_each_size_and_weighted_by_its_share_of_the_time(tmp_path, monkeypatch):
    """augment.low_size: the steps at the low size and at the model's are timed apart (each as the run takes
    it), and the run's speed is their mean weighted by the time at each (low_share of a run the clock bounds);
    the share and the size are in the cache's key."""
    import vitkit.train.speed as speed

    seen = []

    def timed(trainer, images, batch, device, steps):
        seen.append((trainer.cfg.augment.low_size, trainer.cfg.augment.low_share))
        return 300.0 if trainer.cfg.augment.low_size else 100.0

    monkeypatch.setattr(speed, "timed_steps", timed)
    aug = {"crop": "pad", "pad": 2, "low_size": 16, "low_share": 0.25}
    cfg, mcfg = tiny(batch_size=8, processes=2, augment=aug)
    assert mcfg.dynamic_img_size
    got = measure_speed(cfg, mcfg, torch.device("cpu"), threads=1, cache_dir=tmp_path)
    assert got.images_per_s == pytest.approx(2 * (0.25 * 300.0 + 0.75 * 100.0)) and not got.cached
    assert seen == [(0, 0.0), (16, 1.0)]
    assert measure_speed(cfg, mcfg, torch.device("cpu"), threads=1, cache_dir=tmp_path).cached
    other, omcfg = tiny(batch_size=8, processes=2, augment={**aug, "low_share": 0.5})
    assert measure_speed(other, omcfg, torch.device("cpu"), threads=1, cache_dir=tmp_path).images_per_s == 400.0
    plain, pmcfg = tiny(batch_size=8, processes=2, augment={"crop": "pad", "pad": 2})
    assert measure_speed(plain, pmcfg, torch.device("cpu"), threads=1, cache_dir=tmp_path).images_per_s == 200.0
    assert len(read_speeds(tmp_path / SPEED_FILE)) == 3


def test_the_share_of_their_expected_epochs_that_runs_reached_is_kept_by_machine_and_processes(tmp_path):
    """A finished run bounded by the clock keeps reached / expected epochs (the last RUN_SHARES of each machine and
    process count); later runs scale their count by the median. A share out of range, a cache folder that cannot be
    read or written: no record, no error."""
    import vitkit.train.speed as speed

    cpu = torch.device("cpu")
    first = (speed.FIRST_SHARE, 0)  # none recorded: what first runs of several processes on a CPU reach
    assert speed.reached_share(tmp_path, cpu, 2) == first and speed.reached_share(None, cpu, 2) == first
    assert speed.reached_share(tmp_path, cpu, 1) is None and speed.reached_share(None, cpu, 1) is None
    assert "none recorded here yet" in speed.share_words(first)
    for reached in (3.0, 2.4, 3.3):
        speed.record_reached(tmp_path, cpu, 2, expected=4.0, reached=reached)
    assert speed.reached_share(tmp_path, cpu, 2) == (0.75, 3)  # the median of 0.75, 0.6, 0.825
    assert speed.reached_share(tmp_path, cpu, 1) is None  # another layout: its own
    speed.record_reached(tmp_path, cpu, 2, expected=100.0, reached=3.0)  # stopped short (or a Ctrl-C): not kept
    speed.record_reached(tmp_path, cpu, 2, expected=1.0, reached=5.0)  # given more time: not kept
    assert speed.reached_share(tmp_path, cpu, 2) == (0.75, 3)
    for _ in range(speed.RUN_SHARES):
        speed.record_reached(tmp_path, cpu, 2, expected=2.0, reached=1.8)
    assert speed.reached_share(tmp_path, cpu, 2) == (0.9, speed.RUN_SHARES)  # the recent ones only
    (tmp_path / speed.RUNS_FILE).write_text("[not, json")
    assert speed.reached_share(tmp_path, cpu, 2) == first and speed.reached_share(tmp_path, cpu, 1) is None
    (tmp_path / "file").write_text("x")
    speed.record_reached(tmp_path / "file", cpu, 2, expected=2.0, reached=1.8)  # no error


def test_the_first_share_is_what_first_runs_of_several_processes_on_a_cpu_reached():
    """FIRST_SHARE is the median reached / expected epochs of the recorded runs bounded by the clock that were the
    first on their machine (an empty cache folder: the data decoded, 'miss') with two or more processes on a CPU,
    within 0.03 (a new record moves the median a little; more than that, and the constant wants measuring again)."""
    import statistics

    import vitkit.train.speed as speed

    shares = []
    for line in (ROOT / "benchmarks" / "results" / "time_to_accuracy.jsonl").read_text().splitlines():
        run = (json.loads(line).get("vitkit") or {}) if line.strip() else {}
        recipe = run.get("recipe") or {}
        if (run.get("data_cache") == "miss" and str(run.get("machine", "")).startswith("cpu")
                and (recipe.get("processes") or 1) > 1 and recipe.get("expected_epochs") and run.get("epochs")):
            shares.append(run["epochs"] / recipe["expected_epochs"])
    assert len(shares) >= 15
    assert abs(statistics.median(shares) - speed.FIRST_SHARE) <= 0.03, statistics.median(shares)
    assert min(shares) >= speed.MIN_SHARE and max(shares) <= speed.MAX_SHARE


def test_a_run_the_clock_ends_records_the_share_it_reached_and_the_next_run_counts_with_it(tmp_path, capsys,
                                                                                          monkeypatch):
    import vitkit.train.loop as loop
    import vitkit.train.speed as speed

    recorded = []
    real = loop.record_reached
    monkeypatch.setattr(loop, "record_reached", lambda *a: recorded.append(a) or real(*a))
    cache = tmp_path / "cache"
    data = image_folder(tmp_path / "data", n=8, test=2)
    # 6 s: time for the two short models' measurements (about 1.5 s each here) and some training after them
    argv = ["train", "--data", str(data), "--max-minutes", "0.1", "--nproc", "1", "--threads", "1", "--device",
            "cpu", "--batch-size", "8", "--set", "plots=false", "--cache-dir", str(cache)]
    assert main([*argv, "--out", str(tmp_path / "d")]) == 0
    saved = json.loads((tmp_path / "d" / "config.json").read_text())
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    ((where, device, processes, expected, reached),) = recorded
    assert (where, device.type, processes) == (str(cache), "cpu", 1)
    assert expected == saved["expected_epochs"] > 0 and reached == summary["epochs"]
    capsys.readouterr()
    # the next run's line counts the recent share, as the cache holds it
    speed.record_reached(cache, torch.device("cpu"), 1, expected=2.0, reached=1.5)
    speed.record_reached(cache, torch.device("cpu"), 1, expected=2.0, reached=1.5)
    share, runs = speed.reached_share(cache, torch.device("cpu"), 1)
    assert main([*argv, "--out", str(tmp_path / "e")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert f" at {share:.2f}x, the median share of their expected epochs that the last {runs} runs here reached: " in first
    assert len(recorded) == 2
    assert main([*argv, "--epochs", "1", "--out", str(tmp_path / "f")]) == 0
    # a run its epochs end, or a replay (bound by no clock), records nothing
    assert len(recorded) == 2
    assert main(["train", "--config", str(tmp_path / "d"), "--out", str(tmp_path / "again"), "--quiet"]) == 0
    assert len(recorded) == 2
