"""timm's train.py flags on `vitkit train`: the aliases set their config keys, values vitkit lacks are
one-line errors, an unknown timm flag is told its vitkit form (never an unrelated flag), and the help
shows the defaults each command's run takes."""

import pytest
from helpers import FAST_TRAIN_ARGS as FAST

from vitkit.cli.main import main, parse_args
from vitkit.cli.commands.train import flags_from_args, overrides_from_args
from vitkit.train.config import resolve_config


def _cfg(*argv):
    args = parse_args(["train", *argv])
    return resolve_config(None, flags_from_args(args), overrides_from_args(args))


@pytest.mark.parametrize("argv, key, want", [
    (["--opt", "sgd"], "optim", {"name": "sgd", "nesterov": True}),  # timm's sgd is Nesterov
    (["--opt", "momentum"], "optim", {"name": "sgd", "nesterov": False}),
    (["--opt", "adamw"], "optim", {"name": "adamw"}),
    (["--opt", "adam"], "optim", {"name": "adam"}),
    (["--sched", "linear"], "schedule", {"decay": "linear"}),
    (["--sched", "step", "--decay-rate", "0.5"], "schedule", {"decay": "step", "step_rate": 0.5}),
    # timm's magnitudes are of 10 (vitkit's of 30), each op applied with probability 0.5, its default ops
    (["--aa", "rand-m7-n3"], "augment", {"auto": "randaugment", "ra_magnitude": 21, "ra_ops": 3, "ra_prob": 0.5,
                                         "ra_magnitude_std": 0.0, "ra_increasing": False}),
    (["--aa", "rand-inc1-mstd0.5-m9"], "augment", {"ra_magnitude": 27, "ra_ops": 2, "ra_magnitude_std": 1.5,
                                                   "ra_increasing": True}),  # parts in any order
    (["--aa", "rand-n1-p0.25"], "augment", {"ra_magnitude": 30, "ra_ops": 1, "ra_prob": 0.25}),
    (["--reprob", "0.25"], "augment", {"erase_prob": 0.25}),
    (["--clip-grad", "2.5"], "optim", {"clip_grad": 2.5}),
    (["-b", "32", "-j", "3"], None, {"batch_size": 32}),
])
def test_aliases_set_their_keys(argv, key, want):
    cfg = _cfg(*argv).to_dict()
    node = cfg[key] if key else cfg
    assert {k: node[k] for k in want} == want
    if argv[0] == "-b":
        assert cfg["data"]["workers"] == 3


def test_ema_amp_and_initial_checkpoint():
    assert _cfg("--model-ema").ema == 0.9998
    assert _cfg("--model-ema", "--model-ema-decay", "0.99").ema == 0.99
    assert _cfg("--ema", "0.95").ema == 0.95  # vitkit's own flag is kept when no alias is given
    assert _cfg("--amp").precision == "bf16"
    assert _cfg("--initial-checkpoint", "w.safetensors").init_from == "w.safetensors"


@pytest.mark.parametrize("argv, message", [
    (["--opt", "rmsprop"], "--opt: vitkit has no 'rmsprop'; the nearest it has: --opt adam"),
    (["--opt", "lamb"], "--opt: vitkit has no 'lamb'; the nearest it has: --opt adamw"),
    (["--opt", "bogus"], "--opt: 'bogus' is not one vitkit has; use one of sgd, nesterov, momentum, adam, adamw, lion, "
                         "muon"),
    (["--sched", "poly"], "--sched: vitkit has no 'poly'; the nearest it has: --sched linear (poly of power 1)"),
    (["--sched", "bogus"], "--sched: 'bogus' is not one vitkit has; use one of cosine, linear, constant, step"),
    (["--decay-epochs", "2"], "--decay-epochs: spaces and sizes the decays of --sched step; this run's schedule is "
                              "'cosine' (add --sched step)"),
    (["--decay-rate", "0.5", "--sched", "linear"], "--decay-rate: spaces and sizes the decays of --sched step; this "
                                                   "run's schedule is 'linear' (add --sched step)"),
    (["--sched", "step", "--decay-epochs", "2", "--max-minutes", "1"], "--decay-epochs: this run is bounded by the "
     "clock (1 min), so its epochs are not known ahead; give the decay's spacing as a share of the run: --set "
     "schedule.step_every=F"),
    (["--aa", "rand-m9-mmax12"], "--aa: 'rand-m9-mmax12': 'mmax12': vitkit's RandAugment takes m, n, mstd, inc and p "
                                 "(its ops and their magnitudes' cap are its own: no t, mmax or w)"),
    (["--aa", "rand-m12"], "--aa: 'rand-m12': 'm12': the magnitude is a whole number in 0..10 (timm's scale; timm "
                           "caps larger ones)"),
    (["--aa", "rand-m9-inc0"], "--aa: 'rand-m9-inc0': 'inc0': timm reads any inc part as inc1 (the increasing ops); "
                               "write inc1, or leave it out for timm's default ops"),
    (["--aa", "rand-m9-mstd101"], "--aa: 'rand-m9-mstd101': 'mstd101': timm's uniform magnitudes (mstd above 100) are "
                                  "not in vitkit; the nearest: --set augment.auto=trivialaugment (one op an image, at "
                                  "a uniform magnitude)"),
    (["--aa", "augmix-m5"], "--aa: 'augmix-m5': vitkit has RandAugment (rand-mM-nN-mstdS-inc1), not timm's 'augmix' "
                            "policy; the nearest: --aa rand-m9-mstd0.5-inc1, or --set augment.auto=trivialaugment"),
    (["--num-classes", "10"], "--num-classes: the classes come from the data (its class folders or labels); drop it"),
    (["--warmup-epochs", "2", "--max-minutes", "1"], "--warmup-epochs: this run is bounded by the clock (1 min), so "
     "its epochs are not known ahead; give the warmup as a share of the run: --set schedule.warmup_fraction=F"),
])
def test_values_vitkit_lacks_are_one_line(tmp_path, capsys, argv, message):
    assert main(["train", *argv, *FAST, "--out", str(tmp_path / "run")]) == 1
    assert capsys.readouterr().err == f"vitkit: error: {message}\n"


def test_warmup_epochs_become_a_share_of_the_run(tmp_path):
    from vitkit.train.resolve import RunRequest, resolve_run

    run = resolve_run(RunRequest(flags={"model": "vit_test", "epochs": 8, "threads": 1, "device": "cpu",
                                        "max_minutes": 0}, warmup_epochs=2, out=str(tmp_path / "r")))
    assert run.cfg.schedule.warmup_fraction == 0.25
    assert "warmup: 2 of 8 epochs (schedule.warmup_fraction=0.25)" in run.notes


def test_decay_epochs_become_a_share_of_the_run(tmp_path):
    from vitkit.train.resolve import RunRequest, resolve_run

    flags = {"model": "vit_test", "epochs": 8, "threads": 1, "device": "cpu", "max_minutes": 0,
             "schedule.decay": "step", "schedule.step_rate": 0.5}
    run = resolve_run(RunRequest(flags=flags, decay_epochs=2, out=str(tmp_path / "r")))
    assert run.cfg.schedule.step_every == 0.25 and run.cfg.schedule.step_rate == 0.5
    assert "step schedule: lr x 0.5 every 2 of 8 epochs (schedule.step_every=0.25)" in run.notes


def test_a_demo_given_epochs_is_bounded_by_them_not_the_clock(tmp_path):
    """`vitkit train --opt sgd --warmup-epochs 1 --epochs 1`: the demo's 4 minutes are for a run given no epochs."""
    from vitkit.train.config import DEMO_BUDGET
    from vitkit.train.resolve import RunRequest, demo_base, resolve_run

    args = parse_args(["train", "--opt", "sgd", "--warmup-epochs", "1", "--epochs", "1", "--threads", "1"])
    flags = flags_from_args(args)
    run = resolve_run(RunRequest(flags=flags, warmup_epochs=args.warmup_epochs, out=str(tmp_path / "r")))
    assert run.cfg.max_minutes is None and run.cfg.epochs == 1 and run.cfg.optim.name == "sgd"
    assert run.cfg.schedule.warmup_fraction == 1.0  # as timm, the warmup may span the run
    assert demo_base({})["max_minutes"] == DEMO_BUDGET["max_minutes"]  # no epochs: the demo's budget
    assert demo_base({"epochs": 1, "max_minutes": 2})["max_minutes"] == DEMO_BUDGET["max_minutes"]  # both kept:
    both = resolve_config(None, {"epochs": 1, "max_minutes": 2}, [], base=demo_base({"epochs": 1, "max_minutes": 2}))
    assert (both.epochs, both.max_minutes) == (1, 2)  # whichever ends the run first


@pytest.mark.parametrize("flag, hint", [
    ("--momentum", "use --set optim.momentum=M"),
    ("--min-lr", "use --set schedule.min_lr_ratio=R (a share of --lr, not a rate)"),
    ("--color-jitter", "timm's --color-jitter has no vitkit counterpart"),
    ("--data-dir", "use --data PATH"),
])
def test_unknown_timm_flags_get_their_vitkit_form(capsys, flag, hint):
    with pytest.raises(SystemExit):
        main(["train", flag, "0.1"])
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"vitkit train: error: unrecognized arguments: {flag}") and hint in err
    assert "did you mean" not in err


@pytest.mark.parametrize("flag", ["--pretrianed", "--schedd", "--warmup-epoch-count", "--ama"])
def test_no_unrelated_suggestion(capsys, flag):
    """Look-alikes of unrelated settings were suggested before (--amp -> --mixup, --sched -> --seed)."""
    with pytest.raises(SystemExit):
        main(["train", flag, "1"])
    err = capsys.readouterr().err.splitlines()[-1]
    for unrelated in ("--precision", "--seed", "--mixup", "--nproc", "--out", "--data "):
        assert f"did you mean {unrelated}" not in err


def test_help_shows_the_defaults_the_run_takes(capsys):
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "peak learning rate (default: 0.01)" in out and "training epochs (default: 10)" in out
    assert "label smoothing (augment.label_smoothing) (default: 0.0)" in out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "training epochs (default: 20, or what the recipe chosen for the data sets)" in out
    assert "across all processes (timm: per process)" in out


def test_pretrained_names_the_models_published_weights(capsys):
    assert _cfg("--model", "vit_small_patch16_224", "--pretrained").init_from == \
        "hf-hub:timm/vit_small_patch16_224.augreg_in21k_ft_in1k"
    assert main(["train", "--pretrained"]) == 1
    assert capsys.readouterr().err == ("vitkit: error: --pretrained: name the model whose published weights to start "
                                       "from (--model NAME)\n")
    assert main(["train", "--pretrained", "--model", "vit_test"]) == 1
    assert "has no published weights vitkit knows of" in capsys.readouterr().err
