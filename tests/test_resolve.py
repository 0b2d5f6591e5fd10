"""A run resolved once (train/resolve.py): the command line and ``vitkit.fit`` resolve the same request
the same way, every 'auto' is settled in the run's config.json, processes that a launcher starts read
that file, a resumed run keeps its model; and the shape of the package that the layers promise."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FAST_TRAIN_ARGS as FAST
from helpers import TINY_MODEL, image_folder

import vitkit
from vitkit.cli.main import main
from vitkit.core.errors import ConfigError
from vitkit.train.config import FINETUNE_DEFAULTS, RunConfig
from vitkit.train.recipe import CLOCK_EPOCHS
from vitkit.train.resolve import RunRequest, read_resolved, resolve_run, write_resolved

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model": TINY_MODEL, "batch_size": 8, "threads": 1, "device": "cpu", "plots": False}


def _request(**kw) -> RunRequest:
    flags = dict(TINY)
    flags.update(kw.pop("flags", {}))
    return RunRequest(flags=flags, **kw)


# ------------------------------------------------------------------------------------- resolution
def test_every_auto_is_settled_once(tmp_path):
    data = image_folder(tmp_path / "data")
    run = resolve_run(_request(data=str(data), flags={"epochs": 1, "threads": None}, out=str(tmp_path / "run")))
    cfg = run.cfg
    assert cfg.precision in ("fp32", "bf16") and isinstance(cfg.channels_last, bool)
    assert cfg.threads >= 1 and cfg.processes >= 1
    assert run.path is not None and run.path.precision == cfg.precision
    assert run.notes and run.notes[0].startswith("recipe ")  # the recipe chosen from the data, and why
    assert run.run_dir == tmp_path / "run" and not run.resume


def test_the_written_run_is_what_a_launched_process_reads(tmp_path):
    run = resolve_run(_request(flags={"epochs": 1}, out=str(tmp_path / "run")))
    file = write_resolved(run)
    saved = json.loads(file.read_text())
    assert saved["precision"] != "auto" and saved["channels_last"] is not None and saved["threads"] == 1
    back = read_resolved(tmp_path / "run")
    assert back.cfg.to_dict() == run.cfg.to_dict() and back.run_dir == run.run_dir


def test_finetuning_takes_its_defaults_whatever_calls_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    vitkit.save(vitkit.create_model(TINY_MODEL, num_classes=2), ckpt)
    data = image_folder(tmp_path / "data")
    run = resolve_run(RunRequest(data=str(data), weights=str(ckpt), flags={"threads": 1, "device": "cpu"}))
    want = RunConfig.from_dict(FINETUNE_DEFAULTS)
    assert run.cfg.optim == want.optim and run.cfg.epochs == want.epochs
    assert run.cfg.init_from == str(ckpt)


def test_finetuning_within_a_budget_runs_until_the_clock_ends_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    vitkit.save(vitkit.create_model(TINY_MODEL, num_classes=2), ckpt)
    data = image_folder(tmp_path / "data")
    flags = {"threads": 1, "device": "cpu", "max_minutes": 5}
    run = resolve_run(RunRequest(data=str(data), weights=str(ckpt), flags=flags))
    assert run.cfg.epochs == CLOCK_EPOCHS and run.cfg.max_minutes == 5
    assert any("fitted to 5 min" in line for line in run.notes)
    given = resolve_run(RunRequest(data=str(data), weights=str(ckpt), flags={**flags, "epochs": 3}))
    assert given.cfg.epochs == 3  # --epochs still ends it sooner
    told = resolve_run(RunRequest(data=str(data), weights=str(ckpt), flags={"threads": 1, "device": "cpu"},
                                  overrides=["max_minutes=2"]))
    assert told.cfg.epochs == CLOCK_EPOCHS


def test_a_small_model_fine_tuned_within_a_budget_on_the_cpu_trains_as_two_processes(tmp_path, monkeypatch):
    from vitkit.train import resolve

    monkeypatch.setattr(resolve, "usable_cpus", lambda: 2)
    ckpt = tmp_path / "ckpt"
    vitkit.save(vitkit.create_model(TINY_MODEL, num_classes=2), ckpt)
    data = str(image_folder(tmp_path / "data"))
    flags = {"device": "cpu", "max_minutes": 5}
    run = resolve_run(RunRequest(data=data, weights=str(ckpt), flags=flags))
    assert run.cfg.processes == 2 and run.cfg.threads == 1
    assert any("2 processes on the CPU" in line for line in run.notes)
    told = resolve_run(RunRequest(data=data, weights=str(ckpt), flags={**flags, "processes": 1}))
    assert told.cfg.processes == 1  # --nproc wins
    # the epochs its speed line counts are one process's: where two train, the share they reach is not recorded
    # against them
    counted = {"batch_size": 8}  # a batch the data holds, which is measured
    assert resolve_run(RunRequest(data=data, weights=str(ckpt), flags={**flags, **counted, "processes": 1})
                       ).cfg.expected_epochs > 0
    assert resolve_run(RunRequest(data=data, weights=str(ckpt), flags={**flags, **counted})).cfg.expected_epochs is None
    fixed = resolve_run(RunRequest(data=data, weights=str(ckpt), flags={"device": "cpu", "epochs": 2}))
    assert fixed.cfg.processes == 1  # a run of fixed epochs stays one process
    probe = resolve_run(RunRequest(data=data, weights=str(ckpt), flags={**flags, "tune": "probe"}))
    assert probe.cfg.processes == 1  # a probe trains on cached features in one process
    monkeypatch.setattr(resolve, "SMALL_MODEL_FLOPS", 1.0)
    large = resolve_run(RunRequest(data=data, weights=str(ckpt), flags=flags))
    assert large.cfg.processes == 1


def test_threads_cut_by_other_work_say_so_and_are_what_the_run_records(tmp_path, monkeypatch):
    from vitkit.train import resolve

    monkeypatch.setattr(resolve, "usable_cpus", lambda: 2)
    data = str(image_folder(tmp_path / "data"))
    flags = {"device": "cpu", "epochs": 1, "processes": 1, "model": TINY_MODEL}
    monkeypatch.setattr(os, "getloadavg", lambda: (1.3, 1.0, 0.5))  # another process busy on a core
    busy = resolve_run(RunRequest(data=data, flags=flags))
    assert busy.cfg.threads == 1
    assert ("threads: 1 per process, not 2: the 1-minute load average was 1.3 on 2 CPUs as the run started "
            "(other work; threads that share a core wait for each other); config.json records the 1 it trains "
            "with; --threads 2 takes them all") in busy.notes
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.1, 0.1))
    idle = resolve_run(RunRequest(data=data, flags=flags))
    assert idle.cfg.threads == 2 and not any(line.startswith("threads:") for line in idle.notes)
    told = resolve_run(RunRequest(data=data, flags={**flags, "threads": 1}))
    assert not any(line.startswith("threads:") for line in told.notes)


def test_the_cli_and_fit_record_the_same_run(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    args = ["--data", str(data), "--epochs", "1", "--nproc", "1"]
    assert main(["train", *args, *FAST, "--out", str(tmp_path / "cli")]) == 0
    res = vitkit.fit(data, epochs=1, out=tmp_path / "py", model=TINY_MODEL, log=None,
                     settings={"batch_size": 8, "threads": 1, "device": "cpu", "precision": "fp32", "plots": False,
                               "processes": 1})
    capsys.readouterr()
    cli = json.loads((tmp_path / "cli" / "config.json").read_text())
    py = json.loads((tmp_path / "py" / "config.json").read_text())
    assert cli == py  # the same request, resolved the same way
    cli_sum = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert res.summary["test_acc"] == cli_sum["test_acc"] and res.run_dir == tmp_path / "py"
    # the decoded-image cache on in both, in the same folder: the command line decoded, fit read it back
    assert (cli_sum["data_cache"], res.summary["data_cache"]) == ("miss", "hit")


def test_fit_feeds_logger_objects(tmp_path):
    class Collect:
        def __init__(self):
            self.records, self.closed = [], False

        def log_metrics(self, metrics, step):
            self.records.append((step, metrics))

        def close(self):
            self.closed = True

    data = image_folder(tmp_path / "data")
    logger = Collect()
    vitkit.fit(data, epochs=1, out=tmp_path / "run", model=TINY_MODEL, log=None, loggers=[logger],
               settings={"batch_size": 8, "threads": 1, "device": "cpu", "plots": False, "processes": 1,
                         "log_every": 1})
    assert logger.closed and any("test/acc" in m or "val/acc" in m for _, m in logger.records)
    assert any("train/loss" in m for _, m in logger.records)


def test_fit_without_data_for_weights_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="^fit: fine-tuning needs data"):
        vitkit.fit(weights=tmp_path / "w.safetensors")


# --------------------------------------------------------------------------------------- resume
def test_resume_with_another_model_is_refused_and_the_record_kept(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", *FAST, "--out", str(run)]) == 0
    before = (run / "config.json").read_text()
    assert main(["train", "--resume", str(run), "--model", "vit_tiny_patch4_32", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vitkit: error: model: ") and "--resume continues a run as it is" in err
    assert err.count("\n") == 1
    assert (run / "config.json").read_text() == before  # config.json still says what was trained


# ---------------------------------------------------------------------------------------- shape
def test_help_imports_no_torch():
    code = "import sys\nfrom vitkit.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n" \
           "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_the_package_keeps_its_layers():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "code_shape.py"), "--json", "--top", "1"],
                         capture_output=True, text=True, check=True, timeout=120)
    shape = json.loads(out.stdout)
    assert shape["cycles"] == [] and shape["against_layers"] == [] and shape["unlayered"] == []
    assert shape["longest"][0][0] <= 80
    top = [p for p in (ROOT / "src" / "vitkit").glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(top) <= 6


def test_foreign_weights_are_read_once_for_a_run_in_this_process(tmp_path, capsys, monkeypatch):
    """Resolving the run reads timm weights for the model's config; the run then starts from that read."""
    import importlib

    from helpers import random_model

    from vitkit.io.timm import save_timm

    convert = importlib.import_module("vitkit.io.convert")  # the module (vitkit.io.convert is also a function)
    weights = tmp_path / "vit.safetensors"
    save_timm(random_model(), weights)
    reads = []
    real = convert.read
    monkeypatch.setattr(convert, "read", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    data = image_folder(tmp_path / "data")
    assert main(["finetune", str(weights), "--data", str(data), "--epochs", "1", "--set", "model_args.num_heads=2",
                 *FAST[2:], "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert reads == [str(weights)]


def test_a_bad_model_arg_in_a_config_file_names_the_file(tmp_path, capsys):
    """The run's model is resolved with the run now, so a config file's model_args are checked with the
    file's other values, and the error names the file (the hypothesis fuzz of test_robustness found it)."""
    f = tmp_path / "run.toml"
    f.write_text('[model_args]\n"" = false\n')
    assert main(["train", "--config", str(f), "--threads", "1", "--out", str(tmp_path / "run"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vitkit: error: {f}: vit_hybrid_mini_patch4_28: unknown field(s) ''") and err.count("\n") == 1


def test_config_of_a_run_bounded_by_the_clock_replays_its_steps_unless_the_request_bounds_it_anew(tmp_path):
    """`--config RUN` of a run bounded by the clock replays RUN's recorded steps (cfg.replay); a request that
    gives max_minutes or epochs is a new run bounded by the clock; a TOML config, or a run with no clock,
    is not a replay of steps; a run whose steps are not recorded says so and trains on the clock again."""
    from helpers import tiny_run_config, tiny_splits

    from vitkit.train import train
    from vitkit.train.replay import settle_replay

    run = tmp_path / "run"
    train(tiny_run_config(max_minutes=5.0, epochs=1), run, splits=tiny_splits(), log=None)
    clocked = lambda: tiny_run_config(max_minutes=5.0, epochs=1)  # noqa: E731 - as --config RUN resolves it
    for config in (run, run / "config.json"):
        cfg = clocked()
        assert settle_replay(cfg, str(config), {}) is None and cfg.replay == str(run)
    for given in ({"max_minutes": 2}, {"epochs": 3}):
        cfg = clocked()
        assert settle_replay(cfg, str(run), given) is None and cfg.replay is None
    toml = tmp_path / "run.toml"
    toml.write_text("max_minutes = 5.0\n")
    cfg = clocked()
    assert settle_replay(cfg, str(toml), {}) is None and cfg.replay is None
    cfg = tiny_run_config(epochs=1, replay=str(run))  # a run with no clock: nothing to follow
    assert settle_replay(cfg, str(run), {}) is None and cfg.replay is None
    (run / "last" / "trainer.pt").unlink()
    cfg = clocked()
    assert settle_replay(cfg, str(run), {}) == (f"--config {run}: no record of the run's steps there (no last/ "
                                                "checkpoint that holds one): bounded by the clock again (5 min), not "
                                                "replayed step by step")
    assert cfg.replay is None
