"""The command line: usage errors exit 2 with a usage line; random arguments and configs never give a traceback."""

import dataclasses
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitkit import ConfigError, ViTConfig
from vitkit.cli.main import available_commands, main, parse_args


def run_cli(*argv):
    return subprocess.run([sys.executable, "-m", "vitkit", *argv], capture_output=True, text=True, timeout=120)


def test_help_lists_every_subcommand():
    out = run_cli("--help")  # the real entry point, in a fresh interpreter
    assert out.returncode == 0
    for name in available_commands():
        assert name in out.stdout


def test_list_command_counts(capsys):
    assert main(["list", "vit_base_patch16_224", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rows == [dict(name="vit_base_patch16_224", params=86_567_656, img_size=[224, 224], patch_size=16,
                         embed_dim=768, depth=12, num_heads=12)]


@pytest.mark.parametrize("command", available_commands())
def test_unknown_argument_exits_2_with_usage(command, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args([command, "--no-such-flag"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: vitkit {command}")
    # argparse names missing required arguments first; otherwise the unknown flag
    assert "unrecognized arguments: --no-such-flag" in err or "the following arguments are required" in err
    assert err.count("error:") == 1


@pytest.mark.parametrize("command", available_commands())
def test_missing_required_arguments_exit_2(command, capsys):
    # A subcommand with required positionals must exit 2 without them; one without must parse.
    try:
        parse_args([command])
    except SystemExit as e:
        assert e.code == 2
        assert "usage: vitkit " + command in capsys.readouterr().err


def test_unknown_command_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2 and "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_ill_typed_argument_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", "-n", "many"])
    assert e.value.code == 2 and "argument -n: invalid int value: 'many'" in capsys.readouterr().err


def test_library_error_is_one_line_exit_1(capsys):
    assert main(["train", "--model", "vit_nonexistent"]) == 1
    err = capsys.readouterr().err
    assert err == "vitkit: error: model 'vit_nonexistent' is not a known name; `vitkit list` shows every name\n"
    assert main(["demo", "--start", "2000"]) == 1
    assert capsys.readouterr().err == "vitkit: error: --start 2000: the built-in test digits are numbered 0 to 1999\n"


@pytest.mark.parametrize("argv, hint", [
    (["train", "--weight-decy", "0.1"], "unrecognized arguments: --weight-decy; did you mean --weight-decay?"),
    (["train", "--label-smoothing", "0.1"],
     "unrecognized arguments: --label-smoothing; did you mean --smoothing or --set augment.label_smoothing=0.1?"),
    (["finetune", "ck", "--erase-prob=0.25"],
     "unrecognized arguments: --erase-prob=0.25; did you mean --reprob or --set augment.erase_prob=0.25?"),
    (["eval", "ck", "--devcie", "cpu"], "unrecognized arguments: --devcie cpu; did you mean --device?"),
    (["predict", "ck", "x.png", "--topk", "3"], "unrecognized arguments: --topk 3; did you mean --top-k?"),
])
def test_an_unknown_flag_suggests_the_closest_flag_or_set_key(argv, hint, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and err[0].startswith(f"usage: vitkit {argv[0]}")
    assert err[-1] == f"vitkit {argv[0]}: error: {hint}" and sum("error:" in line for line in err) == 1


@pytest.mark.parametrize("command", ["eval", "predict", "explain"])
def test_tools_take_device_and_default_to_auto(command):
    argv = {"eval": ["ck"], "predict": ["ck", "x.png"], "explain": ["ck", "x.png", "--out", "o.png"]}[command]
    assert parse_args([command, *argv]).device == "auto"
    assert parse_args([command, *argv, "--device", "cpu"]).device == "cpu"


# ------------------------------------------------------------------------------------------------ fuzz
_words = st.sampled_from(
    available_commands()
    + ["--json", "--model", "--data", "--epochs", "--lr", "--out", "--seed", "--batch-size", "--format", "--from",
       "--to", "--set", "-h", "--top-k", "--img-size", "--dtype", "x=1", "optim.lr=abc", "--", "-", "1", "-1", "0.5",
       "nan", "inf", "1e309", "", " ", "é", "\x00", "vit_test", "/nonexistent", "a=b=c"]
)
_argv = st.lists(st.one_of(_words, st.text(max_size=12)), max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_argv)
def test_fuzz_parser_never_tracebacks(argv):
    try:
        parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): both are clean exits
        assert e.code in (0, 2)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5000) | st.floats(allow_nan=True) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)
_fields = [f.name for f in dataclasses.fields(ViTConfig)] + ["bogus"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_fields), _json, max_size=6))
def test_fuzz_config_loader_raises_only_config_errors(data):
    try:
        cfg = ViTConfig.from_dict(data)
    except ConfigError as e:
        assert "\n" not in str(e)
    else:
        assert ViTConfig.from_dict(cfg.to_dict()) == cfg


def test_override_none_is_a_string_choice_or_null_by_field_type():
    from vitkit.core.strict import apply_overrides, coerce, parse_override

    assert parse_override("augment.auto=none") == (["augment", "auto"], "none")
    assert parse_override("x=null") == (["x"], None)
    assert coerce("none", str, "augment.auto") == "none"
    assert coerce("none", int | None, "representation_size") is None
    assert apply_overrides({"a": {"b": 1}}, ["a.b=2", "a.c=[1, 2]"]) == {"a": {"b": 2, "c": [1, 2]}}
    with pytest.raises(ConfigError, match=r"override 'ab': expected KEY=VALUE"):
        parse_override("ab")
