"""The recipe `vitkit train --data DIR` picks from what the data is: the rules, the probe of the data,
the budget, and flags, overrides and --config winning over it."""

import copy
import json
import pickle

import numpy as np
import pytest
from helpers import FAST_TRAIN_ARGS as FAST
from helpers import idx_bytes, image_folder

from vitkit.cli.main import main
from vitkit.train.config import load_toml, resolve_config
from vitkit.train.recipe import (
    CLOCK_EPOCHS,
    SHORT_MINUTES,
    SHORT_RUN,
    PHOTO_SIZES,
    PHOTOS,
    SMALL_DATA,
    SMALL_DATA_MINUTES,
    SMALL_IMAGES,
    SMALL_SIDE,
    DataFacts,
    choose_recipe,
    probe_data,
    recipe_for,
)

CIFAR = DataFacts("folder", (32, 32), 3, 50_000, 10, scored=0)  # as probe_data reads CIFAR-10's class folders


# ------------------------------------------------------------------------------------------- rules
@pytest.mark.parametrize("facts, name", [
    (CIFAR, "small-data"),
    (DataFacts("cifar100", (32, 32), 3, 50_000, 100), "small-data"),
    (DataFacts("folder", (SMALL_SIDE, SMALL_SIDE), 3, SMALL_IMAGES, 200), "small-data"),  # both limits included
    (DataFacts("folder", (SMALL_SIDE + 1, 32), 3, 1_000, 10), "photos"),  # larger images
    (DataFacts("folder", (32, 32), 3, SMALL_IMAGES + 1, 10), "default"),  # more images
    (DataFacts("folder", (224, 224), 3, 1_000_000, 1000), "photos"),
    (DataFacts("mnist", (28, 28), 1, 60_000, 10), "digits"),  # grey: the demo's model, whatever the count
    (DataFacts("folder", (64, 48), 1, 500_000, 10), "digits"),
])
def test_the_rules_pick_the_recipe_from_image_size_count_and_channels(facts, name):
    r = choose_recipe(facts)
    assert r.name == name
    assert r.line.startswith(f"recipe {name}: {facts.size[0]}x{facts.size[1]} ")  # names it and says why
    assert (r.base.get("model") == SMALL_DATA["model"]) == (name == "small-data")
    if name == "digits":
        assert r.base == {}  # the defaults (the digits model is RunConfig's own)
    if name == "default":
        assert r.base == {"model_args": {"in_chans": 3}}  # the defaults, with the data's channels
    if name == "photos":
        assert r.base["model"] == PHOTOS["model"] and r.base["model_args"]["in_chans"] == facts.channels


def test_the_budget_sets_how_long_a_small_data_run_is():
    table = copy.deepcopy(SMALL_DATA)
    r = choose_recipe(CIFAR, max_minutes=5)
    assert r.base["max_minutes"] == 5 and r.base["epochs"] == CLOCK_EPOCHS  # the clock ends the run
    assert "fitted to 5 min (--max-minutes)" in r.reason
    # the same model but for one 3x3 conv at each of the tokenizer's resolutions, not two, and no EMA
    assert r.base["model_args"] == {**SMALL_DATA["model_args"], "stem_convs": 1, "stem_early_convs": 1}
    assert SMALL_DATA["model_args"]["stem_convs"] == SMALL_DATA["model_args"]["stem_early_convs"] == 2
    assert r.base["ema"] is None and SHORT_RUN == {"ema": None, "model_args": {"stem_convs": 1, "stem_early_convs": 1}}
    assert f"at most {SHORT_MINUTES:g} min: no EMA, one 3x3 conv at each of the tokenizer's resolutions" in r.reason
    assert all(r.base[k] == table[k] for k in table if k not in ("ema", "epochs", "model_args"))  # the rest kept
    assert choose_recipe(CIFAR, max_minutes=SHORT_MINUTES).base["model_args"] == r.base["model_args"]  # the limit included
    assert choose_recipe(CIFAR, max_minutes=SHORT_MINUTES + 1).base["model_args"] == SMALL_DATA["model_args"]
    assert SMALL_DATA == table  # and the recipe's own table untouched
    r = choose_recipe(CIFAR)  # no budget given: the recipe's own
    assert r.base["max_minutes"] == SMALL_DATA_MINUTES and r.base["epochs"] == CLOCK_EPOCHS
    assert r.base["model_args"] == SMALL_DATA["model_args"] and r.base["ema"] == SMALL_DATA["ema"]  # a longer budget: the whole recipe
    r = choose_recipe(CIFAR, epochs=3)  # epochs given: no clock of the recipe's
    assert "max_minutes" not in r.base and r.base["model_args"] == SMALL_DATA["model_args"] and r.base["epochs"] == SMALL_DATA["epochs"] and "3 epochs" in r.reason
    r = choose_recipe(CIFAR, max_minutes=0)  # no limit
    assert "max_minutes" not in r.base and "no time limit" in r.reason
    assert "max_minutes" not in SMALL_DATA  # the table itself is never changed


def test_a_small_data_run_on_a_cpu_of_two_cores_or_more_trains_as_two_processes():
    from vitkit.train.recipe import CPU_PROCESSES

    r = choose_recipe(CIFAR, max_minutes=30, cpus=4)
    assert r.base["processes"] == CPU_PROCESSES == 2 and r.reason.endswith("; 2 processes on the CPU")
    assert choose_recipe(CIFAR, cpus=2).base["processes"] == 2  # the recipe's own clock
    for cpus in (1, None):  # one core, or a GPU run (None): one process
        assert "processes" not in choose_recipe(CIFAR, max_minutes=30, cpus=cpus).base
    assert "processes" not in choose_recipe(CIFAR, epochs=3, cpus=4).base  # fixed epochs: one process
    assert "processes" not in choose_recipe(CIFAR, max_minutes=0, cpus=4).base
    assert choose_recipe(DataFacts("mnist", (28, 28), 1, 60_000, 10), cpus=4).base == {}  # digits: the defaults
    r = choose_recipe(CIFAR, max_minutes=30, cpus=4, processes=1)  # --nproc wins, and the line says so
    assert "processes" not in r.base and r.reason.endswith("; 1 process (--nproc)")
    assert choose_recipe(CIFAR, cpus=4, processes=3).reason.endswith("; 3 processes (--nproc)")


def test_a_small_data_run_on_an_amx_cpu_trains_in_bf16_and_elsewhere_in_fp32():
    from vitkit.train.recipe import AMX_PRECISION

    r = choose_recipe(CIFAR, max_minutes=30, cpus=2, cpu_bf16="amx")
    assert r.base["precision"] == AMX_PRECISION["precision"] == "bf16"
    assert r.reason.endswith("; bf16: the CPU has AMX; 2 processes on the CPU")
    assert choose_recipe(CIFAR, epochs=3, cpus=1, cpu_bf16="amx").base["precision"] == "bf16"  # any budget
    for kind in ("avx512bf16", "none", None):  # bf16 slower than fp32 there (or emulated): the recipe's fp32
        r = choose_recipe(CIFAR, max_minutes=30, cpus=2, cpu_bf16=kind)
        assert r.base["precision"] == SMALL_DATA["precision"] == "fp32" and "bf16" not in r.reason
    assert choose_recipe(CIFAR, max_minutes=30, cpus=None, cpu_bf16="amx").base["precision"] == "fp32"  # a GPU run
    assert "precision" not in choose_recipe(DataFacts("mnist", (28, 28), 1, 60_000, 10), cpus=2, cpu_bf16="amx").base


@pytest.mark.parametrize("kind, flags, precision", [
    ("amx", [], "bf16"), ("avx512bf16", [], "fp32"), ("none", [], "fp32"),
    ("amx", ["--set", "precision=fp32"], "fp32"),  # an explicit value wins over the hardware's
])
def test_the_run_asks_the_cpu_whether_it_has_amx(tmp_path, capsys, monkeypatch, kind, flags, precision):
    import vitkit.train.resolve as resolve

    monkeypatch.setattr(resolve, "cpu_bf16_kind", lambda: kind)
    data = image_folder(tmp_path / "data", n=8, test=2)
    fast = [a for a in FAST if a != "--quiet"]
    del fast[fast.index("--precision"):fast.index("--precision") + 2]  # the recipe's own, unless flags say
    lines = run_lines(capsys, ["train", "--data", str(data / "train"), "--out", str(tmp_path / "r"), "--epochs", "1",
                               "--no-tta", *fast, *flags])
    assert ("; bf16: the CPU has AMX" in lines[0]) == (kind == "amx")
    assert json.loads((tmp_path / "r" / "config.json").read_text())["precision"] == precision


def test_the_small_data_config_file_is_the_recipe():
    """configs/small-data.toml holds the recipe's values (with --config it is run as written)."""
    from pathlib import Path

    file = Path(__file__).resolve().parent.parent / "configs" / "small-data.toml"
    assert resolve_config(file) == resolve_config(base=SMALL_DATA)
    assert load_toml(file)["model"] == SMALL_DATA["model"]


# ------------------------------------------------------------------------------------- the probe
def test_probe_reads_folders_without_decoding_them(tmp_path):
    root = image_folder(tmp_path / "d", ("a", "b", "c"), n=5, test=2, size=40)
    # the images of its val/ and test/ are counted (2 a class in test/); class folders alone have none
    assert probe_data(root) == DataFacts("split-folder", (40, 40), 3, 15, 3, scored=6)
    assert probe_data(root / "train") == DataFacts("folder", (40, 40), 3, 15, 3, scored=0)
    (root / "train" / "a" / "0.png").write_bytes(b"not an image")  # unreadable files are passed over
    assert probe_data(root / "train").images == 15


def test_probe_reads_array_formats(tmp_path):
    cifar = tmp_path / "cifar-10-batches-py"
    cifar.mkdir()
    for i in (1, 2):
        data = {b"data": np.zeros((7, 3072), np.uint8), b"labels": [0] * 7}
        (cifar / f"data_batch_{i}").write_bytes(pickle.dumps(data))
    assert probe_data(tmp_path) == DataFacts("cifar10", (32, 32), 3, 14, 10, scored=0)
    (cifar / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((5, 3072), np.uint8), b"labels": [1] * 5}))
    assert probe_data(tmp_path).scored == 5
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    (mnist / "train-images-idx3-ubyte").write_bytes(idx_bytes(np.zeros((9, 28, 28))))
    (mnist / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(9)))
    assert probe_data(mnist) == DataFacts("mnist", (28, 28), 1, 9, 10, scored=0)
    (mnist / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(4)))
    assert probe_data(mnist).scored == 4


def test_a_run_that_names_another_model_trains_it_at_its_own_sizes():
    r = choose_recipe(CIFAR, max_minutes=5, model="vit_tiny_patch4_32")
    assert r.base["model_args"] == {} and r.base["optim"] == SMALL_DATA["optim"]  # the rest of the recipe stays
    assert "; --model vit_tiny_patch4_32 at its own sizes" in r.reason
    assert choose_recipe(CIFAR, max_minutes=30, model=SMALL_DATA["model"]).base["model_args"] == SMALL_DATA["model_args"]
    assert choose_recipe(CIFAR, max_minutes=5, model=SMALL_DATA["model"]).base["model_args"] == \
        {**SMALL_DATA["model_args"], **SHORT_RUN["model_args"]}
    photo = DataFacts("folder", (160, 160), 1, 3_000, 2)
    r = choose_recipe(photo, max_minutes=5, model="vit_test")
    assert r.base["model_args"] == {"in_chans": 1} and r.base["img_size"] == PHOTO_SIZES[0][1]  # the data's channels
    size, depth = PHOTO_SIZES[0][1:]
    assert f"trained at {size} px; --model vit_test at its own sizes" in r.reason and "blocks" not in r.reason
    assert f"trained at {size} px, {depth} blocks" in choose_recipe(photo, max_minutes=5).reason


def test_a_named_model_is_told_every_setting_the_recipe_lays_over_it():
    from vitkit.train.recipe import SAID_KEYS, laid_over_model

    given = {"model": "vit_test", "epochs": 5, "optim.lr": 0.01}
    recipe = laid_over_model(choose_recipe(CIFAR, epochs=5, model="vit_test"), "vit_test", set(given))
    head, told = recipe.reason.split("; over --model vit_test it sets ")
    told, tail = told.rsplit(" (", 1)
    assert tail == "--recipe none: RunConfig's defaults)"
    pairs = told.split(", ")
    for want in ("optim.name=muon", "optim.muon_convs=true", "ema=0.999", "tta=true", "tta_shift=1",
                 "augment.label_smoothing=0.2", "schedule.decay=linear", "batch_size=128"):
        assert want in pairs
    assert not any(p.startswith(("optim.lr=", "optim.clip_grad=", "model")) for p in pairs)  # given; the default
    # what it lists, laid over RunConfig's defaults, is the run the recipe makes, but for what the line says already
    listed = resolve_config(None, given, pairs)
    made = resolve_config(None, given, [], base=recipe.base)
    skip = set(SAID_KEYS)
    assert {k: v for k, v in listed.to_dict().items() if k not in skip} == \
        {k: v for k, v in made.to_dict().items() if k not in skip}
    own = choose_recipe(CIFAR, epochs=5)  # the recipe's own model: the line is the recipe's
    assert laid_over_model(own, None, set()) is own and laid_over_model(own, SMALL_DATA["model"], set()) is own


def test_recipe_none_trains_runconfigs_defaults_on_the_datas_channels(tmp_path):
    from vitkit.train.config import RunConfig
    from vitkit.train.resolve import RunRequest, resolve_run

    data = image_folder(tmp_path / "data", n=4, test=1)
    flags = {"model": "vit_test", "epochs": 1, "optim.lr": 0.01, "threads": 1, "device": "cpu"}
    run = resolve_run(RunRequest(data=str(data), recipe="none", flags=flags, out=str(tmp_path / "r")))
    plain = RunConfig()
    assert run.notes[0] == "recipe none (--recipe none): RunConfig's defaults"
    assert run.cfg.optim == type(plain.optim)(lr=0.01) and run.cfg.schedule == plain.schedule
    assert (run.cfg.ema, run.cfg.tta, run.cfg.batch_size, run.cfg.max_minutes) == (None, False, 64, None)
    assert run.cfg.augment == plain.augment and run.cfg.model_args == {"in_chans": 3}
    told = resolve_run(RunRequest(data=str(data), flags=flags, out=str(tmp_path / "r2")))  # the recipe, and its line
    assert told.cfg.optim.name == "muon" and "over --model vit_test it sets " in told.notes[0]
    assert "optim.name=muon" in told.notes[0] and "optim.lr" not in told.notes[0]
    adam = resolve_run(RunRequest(data=str(data), flags={**flags, "optim.name": "adam"}, out=str(tmp_path / "r3")))
    assert (adam.cfg.optim.name, adam.cfg.optim.muon_convs) == ("adam", False)  # not the recipe's Muon setting
    assert "muon" not in adam.notes[0]


def test_help_states_the_budget_a_run_takes_when_given_none(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert (f"(default: {SMALL_DATA_MINUTES:g} for the small-data and photos recipes and 4 for the demo on the "
            "built-in digits, none with --epochs, --recipe none, weights to start from or for other data; 0 = none)") in out
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    assert "spent (default: none; 0 = none)" in " ".join(capsys.readouterr().out.split())


def test_data_that_cannot_be_inspected_gets_the_defaults(tmp_path):
    r = recipe_for(tmp_path / "missing")
    assert r.name == "default" and r.base == {} and "no such folder" in r.reason


# ----------------------------------------------------------------------------- the command line
def run_lines(capsys, argv):
    assert main(argv) == 0
    return capsys.readouterr().out.splitlines()


def test_train_on_data_names_the_recipe_and_explicit_values_win(tmp_path, capsys):
    data = image_folder(tmp_path / "data", n=8, test=2)
    fast = [a for a in FAST if a != "--quiet"]
    lines = run_lines(capsys, ["train", "--data", str(data / "train"), "--out", str(tmp_path / "r1"), "--epochs", "1",
                               "--no-tta", *fast, "--set", "optim.lr=0.01", "augment.label_smoothing=0"])
    assert lines[0].startswith("recipe small-data: 32x32 RGB images, 16 for training, 2 classes")
    assert any(line.startswith("training vit_test ") for line in lines[1:4])  # the header follows (after the data lines)
    saved = json.loads((tmp_path / "r1" / "config.json").read_text())
    # the recipe's values ...
    assert saved["ema"] == SMALL_DATA["ema"] and saved["augment"]["flip_mode"] == "alternate"
    # ... under the flags and overrides given: they win
    assert saved["model"] == "vit_test" and saved["epochs"] == 1 and saved["max_minutes"] is None
    # another model than the recipe's trains as registered: the recipe's sizes were for its own model
    assert saved["model_args"] == {} and SMALL_DATA["model_args"]
    assert saved["optim"]["lr"] == 0.01 and saved["augment"]["label_smoothing"] == 0 and saved["tta"] is False

    # --max-minutes without --epochs: the schedule is fitted to the clock
    lines = run_lines(capsys, ["train", "--data", str(data), "--out", str(tmp_path / "r2"), "--max-minutes", "0.02",
                               *fast, "--nproc", "1"])  # (one process here: on the clock the recipe takes 2 on 2 cores)
    assert lines[0].startswith("recipe small-data: ") and "; 1 process (--nproc); " in lines[0]  # as it trains
    assert "; measured on this CPU (" in lines[0]  # another model than the recipe's: its own speed, in epochs
    saved = json.loads((tmp_path / "r2" / "config.json").read_text())
    assert 0 < saved["max_minutes"] <= 0.02 and saved["epochs"] == CLOCK_EPOCHS and saved["tta"] is True
    assert saved["tta_shift"] == 1 and saved["optim"]["muon_convs"] is True  # the recipe's views and convs' Muon
    summary = json.loads((tmp_path / "r2" / "summary.json").read_text())
    assert 0 <= summary["test_acc"] <= 1  # scored with the six views: the 1-px copies fit these 32-px images


def test_a_config_file_replaces_the_recipe(tmp_path, capsys):
    data = image_folder(tmp_path / "data", n=8, test=2)
    conf = tmp_path / "c.toml"
    conf.write_text('epochs = 1\n')
    lines = run_lines(capsys, ["train", "--data", str(data), "--config", str(conf), "--out", str(tmp_path / "r"),
                               *[a for a in FAST if a != "--quiet"]])
    assert not any(line.startswith("recipe ") for line in lines)
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["ema"] is None and saved["tta"] is False  # RunConfig's defaults under the file


@pytest.mark.parametrize("minutes, epochs, size, depth", [
    (5, None, 64, 2), (10, None, 64, 2), (30, None, 96, 4), (None, None, 96, 4), (5, 3, 96, 4)])
def test_photos_take_a_resolution_and_depth_for_the_budget(minutes, epochs, size, depth):
    facts = DataFacts("folder", (160, 160), 3, 3_000, 2)
    r = choose_recipe(facts, max_minutes=minutes, epochs=epochs, cpus=2)
    assert r.name == "photos" and r.base["img_size"] == size and r.base["model_args"]["depth"] == depth
    assert f"trained at {size} px, {depth} blocks" in r.reason
    assert (r.base.get("processes") == 2) == (epochs is None)  # the clock's runs take both cores
    assert PHOTO_SIZES[-1][0] == float("inf")


def test_a_grey_photo_folder_trains_a_grey_model_and_colour_never_grey():
    assert choose_recipe(DataFacts("folder", (160, 160), 1, 3_000, 2)).base["model_args"]["in_chans"] == 1
    assert choose_recipe(DataFacts("folder", (32, 32), 3, SMALL_IMAGES + 1, 10)).base["model_args"]["in_chans"] == 3


def test_every_recipe_fits_its_schedule_to_a_given_budget():
    for facts in (DataFacts("mnist", (28, 28), 1, 60_000, 10), DataFacts("folder", (32, 32), 3, SMALL_IMAGES + 1, 10),
                  DataFacts("folder", (160, 160), 3, 3_000, 2), CIFAR):
        r = choose_recipe(facts, max_minutes=3)
        assert r.base["max_minutes"] == 3 and r.base["epochs"] == CLOCK_EPOCHS, r.name


# ------------------------------------------------------------------------------------ budgets in work
from vitkit.train.recipe import (  # noqa: E402
    PHOTO_CANDIDATES,
    REACH,
    SMALL_DATA_CANDIDATES,
    Candidate,
    choose_by_work,
    end_seconds,
    work_images,
)

TABLE = Candidate("t", "a table", {}, ((2.0, 70.0, "x"), (8.0, 80.0, "x"), (32.0, 85.0, "x")))


def test_a_candidate_predicts_linearly_in_log_epochs_and_holds_past_its_last_point():
    assert TABLE.predict(4.0) == pytest.approx(75.0)  # halfway between 2 and 8 in log epochs
    assert TABLE.predict(16.0) == pytest.approx(82.5)
    assert TABLE.predict(8.0) == 80.0 and TABLE.predict(500.0) == 85.0  # no gain assumed past what was measured
    assert TABLE.predict(2.0 / REACH) == pytest.approx(70.0 - 10.0 * np.log(REACH) / np.log(4))  # the first segment
    assert TABLE.predict(2.0 / REACH * 0.99) is None  # fewer epochs than it was measured near
    one = Candidate("one", "one point", {}, ((10.0, 88.0, "x"),))
    assert one.predict(9.0) == 88.0 and one.predict(10.0 / REACH - 0.01) is None


def rates(**by_depth):
    """A speed function: images per second by the candidate config's model depth (a stand-in for measuring)."""
    seen = []

    def speed(cfg):
        seen.append(cfg)
        return by_depth[f"d{cfg['model_args']['depth']}"]

    return speed, seen


def test_the_budget_in_epochs_chooses_the_candidate_with_the_best_measured_accuracy():
    short = Candidate("short", "cheap", {"model_args": {"depth": 1}}, ((2.0, 70.0, "x"), (10.0, 84.0, "x")))
    long = Candidate("long", "dear", {"model_args": {"depth": 2}}, ((10.0, 83.0, "x"), (30.0, 89.0, "x")))
    base = {"model_args": {"depth": 0, "embed_dim": 8}, "ema": 0.9, "plots": False}  # nothing after the last step
    speed, seen = rates(d1=100.0, d2=50.0)
    pick = choose_by_work((short, long), base, seconds=100, images=2_000, speed=speed, clock=lambda: 0.0)
    assert (pick.candidate.name, pick.epochs, pick.predicted) == ("short", {"short": 5.0, "long": 2.5},
                                                                  {"short": pytest.approx(70 + 14 * np.log(2.5) / np.log(5)),
                                                                   "long": None})
    assert seen == [{"model_args": {"depth": 1, "embed_dim": 8}, "ema": 0.9, "plots": False},
                    {"model_args": {"depth": 2, "embed_dim": 8}, "ema": 0.9, "plots": False}]
    assert base["model_args"]["depth"] == 0
    pick = choose_by_work((short, long), base, seconds=1_000, images=2_000, speed=rates(d1=100.0, d2=50.0)[0],
                          clock=lambda: 0.0)
    assert pick.candidate.name == "long"  # 50 epochs of short hold at 84%; 25 of long read 88.0%
    slow = choose_by_work((long, short), base, seconds=10, images=2_000, speed=rates(d1=100.0, d2=50.0)[0],
                          clock=lambda: 0.0)
    assert slow.candidate.name == "short"  # measured at no so few epochs: the one measured at the fewest
    line = pick.line("this CPU (AVX2)")
    assert line == ("measured on this CPU (AVX2), epochs of 2,000 images: short 100 img/s -> 50.0 epochs (table: "
                    "84.0%); long 50 img/s -> 25.0 epochs (table: 88.0%); chose long: dear")
    assert slow.line("x").startswith("measured on x, epochs of 2,000 images: long 50 img/s -> 0.2 epochs (table: "
                                     "none so few); short")


def test_the_epochs_are_those_the_budget_leaves_after_measuring_and_the_end():
    one = Candidate("one", "one", {}, ((1.0, 50.0, "x"),))
    ticks = iter([100.0, 110.0])  # measuring took 10 s of the budget
    cfg = {"tta": True, "tta_shift": 1}  # 6 views of each scored image, each a third of a step's time an image
    pick = choose_by_work((one,), cfg, seconds=300, images=4_500, speed=lambda c: 150.0, scored=500,
                          clock=ticks.__next__)
    end = 500 * 6 / 3 / 150.0 + 2.0  # the views, and the plots
    assert end_seconds(cfg, 150.0, 500) == pytest.approx(end)
    assert pick.epochs["one"] == pytest.approx(150.0 * (300 - 10 - end) / 4_500)
    assert end_seconds({"tta": False, "plots": False}, 150.0, 500) == pytest.approx(500 / 3 / 150.0)
    assert end_seconds({"tta": True}, 150.0, 0) == 2.0  # flips alone, nothing scored: the plots
    short = choose_by_work((one,), cfg, seconds=5, images=10, speed=lambda c: 150.0, scored=500, clock=lambda: 0.0)
    assert short.epochs["one"] == 0.0  # an end longer than the budget leaves no epochs, never fewer than none
    # the run's own --no-tta (and plots=false) count for the end over the recipe's values; other keys do not
    mine = choose_by_work((one,), cfg, seconds=300, images=4_500, speed=lambda c: 150.0, scored=500,
                          clock=lambda: 0.0, end={"tta": False, "plots": False, "max_minutes": 1})
    assert mine.epochs["one"] == pytest.approx(150.0 * (300 - 500 / 3 / 150.0) / 4_500)
    # the images: a run whose data has no val or test part trains on 90% and scores the 10% it holds out
    assert work_images(DataFacts("folder", (32, 32), 3, 50_000, 10, scored=0)) == (45_000, 5_000)
    assert work_images(DataFacts("split-folder", (32, 32), 3, 50_000, 10, scored=10_000)) == (50_000, 10_000)
    assert work_images(DataFacts("folder", (32, 32), 3, 50_000, 10)) == (50_000, 0)  # not counted


def test_small_data_runs_bounded_by_the_clock_choose_by_work_and_say_so():
    from vitkit.train.config import merge

    seen = []

    def speed(cfg):  # images/s by the model's encoder blocks and its convs at each of the tokenizer's resolutions
        seen.append(cfg)
        m = cfg["model_args"]
        return {(1, 1): 650.0, (2, 1): 500.0, (1, 2): 420.0, (2, 2): 350.0}[m["depth"], m["stem_convs"]]

    r = choose_recipe(CIFAR, max_minutes=5, cpus=2, speed=speed, where="this CPU (AVX2)")
    on_cpu = [c for c in SMALL_DATA_CANDIDATES if not c.accelerator]
    # measured as the run trains: the one-block model, then the short ones, then the one-block long model, which
    # the one-block short model bounds: at its 4.1 epochs the long one's table (from 5.0 / REACH = 4.0) could be
    # chosen. Not measured: the two-block long model, bounded by the one-block long one's 2.6 epochs, and `long`,
    # by the two-block short model's 3.1 (a bound is always a model whose step is a part of the bounded one's)
    assert [cfg["processes"] for cfg in seen] == [2] * 6
    assert [(cfg["model_args"]["depth"], cfg["model_args"]["stem_convs"]) for cfg in seen] == [
        (1, 1), (1, 1), (2, 1), (2, 1), (2, 1), (1, 2)]
    assert ("; long-one-block-lr-3x 420 img/s -> 2.6 epochs (table: none so few); long-lr-3x not measured: at most "
            "2.6 epochs, slower than long-one-block-lr-3x (table: none so few); long not measured: at most 3.1 epochs, "
            "slower than short-lr-3x (table: none so few); chose ") in r.line
    # each candidate's epochs: the 5 minutes less the end's 6 views of the 5,000 held out (at a third of a step's
    # time an image) and the plots (2 s), at its own speed, over the 45,000 images trained on; the table's best
    # there is trained: one block at 0.008, at 4.1 epochs where the two blocks reach 3.1
    # (the long models left unmeasured at most the epochs of the speed that bounds them)
    reach = {v: v * (300 - 5_000 * 6 / 3 / v - 2.0) / 45_000 for v in (650.0, 500.0, 420.0)}
    epochs = {c.name: reach[650.0 if c.name.startswith("one-block") else 420.0 if c.name.startswith("long-")
                            else 500.0] for c in on_cpu}
    best = max((c for c in on_cpu if c.predict(epochs[c.name]) is not None), key=lambda c: c.predict(epochs[c.name]))
    assert best.name == "one-block-lr-4x"
    e = epochs[best.name]
    assert r.base == merge(dict(copy.deepcopy(SMALL_DATA), max_minutes=5, epochs=CLOCK_EPOCHS, processes=2),
                           {**copy.deepcopy(best.overrides), "expected_epochs": round(e, 3)})
    assert r.base["model_args"]["depth"] == 1 and r.base["optim"]["lr"] == 0.008 and r.base["ema"] is None
    lr3 = {c.name: c for c in on_cpu}["one-block-lr-3x"]
    assert (f"measured on this CPU (AVX2), epochs of 45,000 images: one-block-lr-3x 650 img/s -> {e:.1f} epochs "
            f"(table: {lr3.predict(e):.1f}%); one-block-lr-4x 650 img/s -> {e:.1f} epochs (table: "
            f"{best.predict(e):.1f}%)") in r.line
    assert "; short-lr-3x 500 img/s -> 3.1 epochs (table: " in r.line
    assert f"{e:.1f}" == "4.1"
    assert f"; chose {best.name}: {best.what}; 2 processes on the CPU" in r.line
    # where the last runs of 2 processes here reached 0.8 of the epochs they expected, every candidate counts 0.8
    # of its own; the run records its epochs before that share, which its end compares with what it reached
    asked = []
    speed, _ = rates(d1=650.0, d2=500.0)
    r = choose_recipe(CIFAR, max_minutes=5, cpus=2, speed=speed, where="this CPU (AVX2)",
                      share=lambda processes: asked.append(processes) or (0.8, 3))
    assert asked == [2] and r.base["expected_epochs"] == round(e, 3)
    assert (f"measured on this CPU (AVX2), epochs of 45,000 images at 0.80x, the median share of their expected "
            f"epochs that the last 3 runs here reached: one-block-lr-3x 650 img/s -> {0.8 * e:.1f} "
            "epochs") in r.line
    speed, _ = rates(d1=6_000.0, d2=5_000.0)  # a fast machine: 30 epochs in 5 minutes
    r = choose_recipe(CIFAR, max_minutes=5, cpus=2, speed=speed)
    assert r.base["model_args"] == SMALL_DATA["model_args"] and r.base["ema"] == SMALL_DATA["ema"]
    assert r.base["optim"] == SMALL_DATA["optim"] and "chose long" in r.line
    for given in ({"epochs": 3}, {"model": "vit_test"}, {"max_minutes": 0}):  # nothing to choose: nothing measured
        speed, seen = rates(d1=650.0, d2=500.0)
        choose_recipe(CIFAR, **{"max_minutes": 5, **given}, cpus=2, speed=speed)
        assert seen == []


def test_a_slower_candidate_is_measured_only_where_it_could_be_chosen():
    from vitkit.train.config import merge

    short = Candidate("short", "cheap", {"model_args": {"depth": 1}}, ((2.0, 70.0, "x"), (10.0, 84.0, "x")))
    long = Candidate("long", "dear", {"model_args": {"depth": 2}}, ((10.0, 83.0, "x"), (30.0, 89.0, "x")),
                     slower_than="short")
    free = Candidate("long", "dear", {"model_args": {"depth": 2}}, long.points)  # the same, no bound
    base = {"model_args": {"depth": 0}, "plots": False}
    for seconds in (100, 150, 159, 161, 200, 1_000):  # short reaches 5, 7.5, 7.95, 8.05, 10, 50 epochs
        speed, seen = rates(d1=100.0, d2=50.0)
        pick = choose_by_work((short, long), base, seconds=seconds, images=2_000, speed=speed, clock=lambda: 0.0)
        every = choose_by_work((short, free), base, seconds=seconds, images=2_000, speed=rates(d1=100.0, d2=50.0)[0],
                               clock=lambda: 0.0)
        assert pick.candidate.name == every.candidate.name and pick.predicted == every.predicted  # the same choice
        # long's table starts at 10 / REACH = 8 epochs: under that many epochs of short it is never measured
        measured = seconds * 100.0 / 2_000 >= 10.0 / REACH
        assert [cfg["model_args"]["depth"] for cfg in seen] == ([1, 2] if measured else [1])
        assert pick.images_per_s == {"short": 100.0, "long": 50.0 if measured else None}
        assert pick.epochs["long"] == pytest.approx(seconds * (50.0 if measured else 100.0) / 2_000)
        if not measured:
            assert pick.line("x").endswith(f"long not measured: at most {seconds * 100.0 / 2_000:.1f} epochs, slower "
                                           "than short (table: none so few); chose short: cheap")
    # the time measuring takes counts: short measured in 20 s leaves long's bound at 8 epochs of 180 s, not 200
    ticks = iter([0.0, 20.0, 20.0, 20.0])
    speed, seen = rates(d1=100.0, d2=50.0)
    pick = choose_by_work((short, long), base, seconds=180, images=2_000, speed=speed, clock=ticks.__next__)
    assert len(seen) == 2 and pick.epochs == {"short": 8.0, "long": 4.0}
    ticks = iter([0.0, 21.0, 21.0, 21.0])
    speed, seen = rates(d1=100.0, d2=50.0)
    pick = choose_by_work((short, long), base, seconds=180, images=2_000, speed=speed, clock=ticks.__next__)
    assert len(seen) == 1 and pick.epochs["long"] == pytest.approx(7.95) and pick.candidate.name == "short"
    # a bound the run does not measure first (not among the candidates, or after it) bounds nothing
    speed, seen = rates(d1=100.0, d2=50.0)
    choose_by_work((long, short), base, seconds=100, images=2_000, speed=speed, clock=lambda: 0.0)
    assert len(seen) == 2
    # a bound that was itself left unmeasured bounds by what bounded it: the fastest one's speed
    tiny = Candidate("tiny", "cheapest", {"model_args": {"depth": 3}}, ((1.0, 60.0, "x"), (10.0, 80.0, "x")))
    mid = Candidate("mid", "cheap", {"model_args": {"depth": 1}}, ((8.0, 81.0, "x"),), slower_than="tiny")
    top = Candidate("top", "dear", {"model_args": {"depth": 2}}, ((10.0, 83.0, "x"),), slower_than="mid")
    speed, seen = rates(d3=200.0, d1=100.0, d2=50.0)
    pick = choose_by_work((tiny, mid, top), base, seconds=50, images=2_000, speed=speed, clock=lambda: 0.0)
    assert [cfg["model_args"]["depth"] for cfg in seen] == [3]  # 5 epochs of tiny: neither table reaches so few
    assert pick.images_per_s == {"tiny": 200.0, "mid": None, "top": None}
    assert pick.epochs == {"tiny": 5.0, "mid": 5.0, "top": 5.0} and pick.bound == {"mid": "tiny", "top": "mid"}
    assert pick.candidate.name == "tiny"
    # every bound in the recipes names an earlier candidate, at the same batch, with less work in its step: no
    # size of the model or its images larger than the bounded one's, so its step is a part of the bounded one's
    sizes = ("depth", "embed_dim", "num_heads", "stem_width", "stem_convs", "stem_early_convs")
    for table, recipe in ((SMALL_DATA_CANDIDATES, SMALL_DATA), (PHOTO_CANDIDATES, PHOTOS)):
        names, by = [c.name for c in table], {c.name: c for c in table}
        built = {c.name: merge(copy.deepcopy(recipe), copy.deepcopy(c.overrides)) for c in table}
        for i, c in enumerate(table):
            if c.slower_than:
                assert c.slower_than in names[:i]
                assert c.overrides.get("batch_size") == by[c.slower_than].overrides.get("batch_size")
                slow, fast = built[c.name], built[c.slower_than]
                assert (fast.get("img_size") or 0) <= (slow.get("img_size") or 0), (c.name, c.slower_than)
                for key in sizes:
                    if key in fast["model_args"] or key in slow["model_args"]:
                        assert fast["model_args"][key] <= slow["model_args"][key], (c.name, c.slower_than, key)


def test_at_two_epochs_the_table_takes_the_higher_learning_rate_it_measured_better():
    by_name = {c.name: c for c in SMALL_DATA_CANDIDATES}
    assert by_name["short-lr-3x"].predict(2.0) > by_name["short-lr-2x"].predict(2.0) > by_name["short"].predict(2.0)
    assert by_name["short-lr-3x"].overrides["optim"] == {"lr": 0.006} and SMALL_DATA["optim"]["lr"] == 0.002
    assert by_name["long"].predict(3.0) is None


@pytest.mark.parametrize("short_epochs, chosen", [(2.2, "one-block-lr-4x"), (4.0, "one-block-lr-3x"),
                                                  (10.0, "long-one-block-lr-3x"), (14.0, "long-lr-3x"),
                                                  (40.0, "long")])
def test_the_long_model_at_the_higher_rate_takes_the_middle_budgets(short_epochs, chosen):
    # one block trains at about 1.3x the short model's images/s (speed_measurement.jsonl, --on model_args.depth=1),
    # the long model at about 0.7x (ablate_small_data.jsonl, seed 1's 10-epoch pair: 985 s against 713 s), and it
    # with one block at about 1.17x that (--candidate long-lr-3x --on model_args.depth=1)
    def speed(cfg):
        short = cfg["model_args"]["stem_convs"] == 1
        one = cfg["model_args"]["depth"] == 1
        return 50_000 * short_epochs / 300 * ((1.3 if one else 1.0) if short else (0.82 if one else 0.7))

    r = choose_recipe(CIFAR, max_minutes=5, cpus=2, speed=speed)
    assert f"; chose {chosen}:" in r.line
    lr = {"one-block-lr-4x": 0.008, "one-block-lr-3x": 0.006, "long-one-block-lr-3x": 0.006, "long-lr-3x": 0.006,
          "long": 0.002}[chosen]
    assert r.base["optim"]["lr"] == lr and (r.base["model_args"]["depth"] == 1) == ("one-block" in chosen)
    assert (r.base["model_args"]["stem_convs"] == 2) == chosen.startswith("long")


def test_on_a_gpu_the_wider_model_at_batch_512_is_a_candidate_where_its_epochs_reach_its_table():
    wide = {c.name: c for c in SMALL_DATA_CANDIDATES}["wide-b512"]
    assert wide.accelerator and wide.overrides["batch_size"] == 512 and wide.min_images == 20_480
    seen = []

    def speed(cfg):  # a GPU's steps are bound by their launches: a batch of 512, about 3x the images/s of 128
        seen.append(cfg)
        return 20_000.0 if cfg["batch_size"] == 512 else 6_000.0

    r = choose_recipe(CIFAR, max_minutes=2, cpus=None, speed=speed, where="NVIDIA H200")
    # 52 epochs of it (its 34.2-epoch 88.82% held) against 15.5 of the others (long-lr-3x's about 88.3%): the
    # 2 minutes less the end (6 views of 5,000 images at a third of a step's time, and the plots), of 45,000
    assert ("measured on NVIDIA H200, epochs of 45,000 images: one-block-lr-3x 6,000 img/s -> 15.5 epochs (table: "
            "85.4%); one-block-lr-4x 6,000 img/s -> 15.5 epochs (table: 81.4%); short-lr-3x 6,000 img/s -> 15.5 "
            "epochs") in r.line
    assert "; wide-b512 20,000 img/s -> 52.2 epochs (table: 88.8%); chose wide-b512: 4 blocks of width 192" in r.line
    assert r.base["batch_size"] == 512 and r.base["optim"]["lr"] == 0.004 and r.base["ema"] == 0.999
    assert r.base["model_args"] == {**SMALL_DATA["model_args"], "depth": 4, "embed_dim": 192, "num_heads": 3}
    assert "processes" not in r.base  # one process on the GPU
    r = choose_recipe(CIFAR, max_minutes=0.85, cpus=None, speed=speed)  # 21.6 epochs: its first segment's line
    assert "wide-b512 20,000 img/s -> 21.6 epochs (table: 87.8%); chose wide-b512" in r.line
    r = choose_recipe(CIFAR, max_minutes=0.4, cpus=None, speed=speed)  # 9.6 epochs: fewer than it was measured near
    assert "wide-b512 20,000 img/s -> 9.6 epochs (table: none so few); chose one-block-lr-4x" in r.line
    seen.clear()  # on the CPU it is never measured, however fast: a larger batch is no faster an image there
    r = choose_recipe(CIFAR, max_minutes=30, cpus=2, speed=speed)
    assert "wide-b512" not in r.line and seen and all(cfg["batch_size"] == 128 for cfg in seen)
    for images in (20_479, 5_000):  # fewer than 40 batches of 512: its points had 87 steps an epoch
        r = choose_recipe(DataFacts("folder", (32, 32), 3, images, 10), max_minutes=2, cpus=None, speed=speed)
        assert "wide-b512" not in r.line and r.base["batch_size"] == 128
    assert "; chose wide-b512" in choose_recipe(DataFacts("folder", (32, 32), 3, 20_480, 10), max_minutes=2,
                                                cpus=None, speed=speed).line


def test_photos_choose_their_resolution_by_work():
    photos = DataFacts("folder", (160, 160), 3, 3_000, 2)
    fast = choose_recipe(photos, max_minutes=30, cpus=2, speed=lambda cfg: 1_000.0 * 64 / cfg["img_size"])
    assert (fast.base["img_size"], fast.base["model_args"]["depth"]) == (96, 4)
    slow = choose_recipe(photos, max_minutes=30, cpus=2, speed=lambda cfg: 100.0 * 64 / cfg["img_size"])
    # 40 epochs of 96 px (86.00%) against 60 of 64 px (86.9%, between its points at 20 and 67.8 epochs)
    assert (slow.base["img_size"], slow.base["model_args"]["depth"]) == (64, 2)


@pytest.mark.parametrize("candidates", [SMALL_DATA_CANDIDATES, PHOTO_CANDIDATES])
def test_every_measured_point_is_a_row_of_the_results_file_it_cites(candidates):
    from pathlib import Path

    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    for c in candidates:
        for epochs, acc, source in c.points:
            rows = [json.loads(line) for line in (results / source.split(":")[0]).read_text().splitlines() if line]
            flat = [r.get("vitkit", r) for r in rows]
            assert any(abs(r.get("epochs", -1) - epochs) < 1e-3 and abs(r["val_acc"] * 100 - acc) < 0.01
                       for r in flat), (c.name, source, epochs, acc)


def test_the_run_s_own_end_values_reach_the_recipe(monkeypatch):
    """``resolve.data_recipe`` hands the flags and overrides to the recipe as its ``end`` (--no-tta, plots)."""
    from vitkit.train import recipe as recipe_mod
    from vitkit.train import resolve

    seen = {}

    def fake(*args, **kw):
        seen.update(kw)
        return recipe_mod.Recipe("default", "x", {})

    monkeypatch.setattr(recipe_mod, "recipe_for", fake)
    resolve.data_recipe("somewhere", None, {"tta": False, "max_minutes": 5}, ["plots=false"])
    assert seen["end"]["tta"] is False and seen["end"]["plots"] is False
