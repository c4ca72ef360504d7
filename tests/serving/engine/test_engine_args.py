"""One declaration of the engine options: every command's flags come from EngineConfig's
fields, so a new field is a flag of serve, chat, eval, quantize and the benchmarks at once;
`graft serve --config serve.yaml` sets the same options (and every other serve flag)."""

import argparse
import dataclasses
import importlib

import pytest

from graft.errors import GraftConfigError
from graft.serving import EngineConfig
from graft.serving.engine import engine_args
from graft.serving.engine.config import option
from graft.serving.http import serve_cli
from graft.serving.http.serve_config import parse_args

COMMANDS = ["graft.serving.http.serve_cli", "graft.chat_cli", "graft.evals.eval_cli",
            "graft.quantize.cli", "graft.benchmarks.engine", "graft.benchmarks.grafts"]


def _parser(module: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=module)
    importlib.import_module(module).add_arguments(parser)
    return parser


@dataclasses.dataclass
class _WithNewOption(EngineConfig):
    prefill_chunk_tokens: int = option(512, "a new engine option, declared once")
    warm_start: bool = option(False, "a new switch")


@pytest.mark.parametrize("module", COMMANDS)
def test_a_new_field_is_a_flag_of_every_command(module, monkeypatch):
    monkeypatch.setattr(engine_args, "EngineConfig", _WithNewOption)
    parser = _parser(module)
    text = parser.format_help()
    assert "--prefill-chunk-tokens" in text and "a new engine option, declared once" in text
    assert "--warm-start" in text
    argv = {"graft.serving.http.serve_cli": ["run"], "graft.chat_cli": ["run"],
            "graft.quantize.cli": ["run", "--tasks", "t", "--out", "o"],
            "graft.benchmarks.engine": ["llm"]}.get(module, [])
    args = parser.parse_args(argv + ["--prefill-chunk-tokens", "64", "--warm-start"])
    config = _WithNewOption.from_args(args)
    assert config.prefill_chunk_tokens == 64 and config.warm_start is True
    with pytest.raises(SystemExit):  # the declared range: a positive int
        parser.parse_args(argv + ["--prefill-chunk-tokens", "0"])


def test_flags_carry_the_declared_default_choices_and_help():
    parser = _parser("graft.serving.http.serve_cli")
    actions = {a.dest: a for a in parser._actions}
    for f in engine_args.engine_fields():
        action = actions[f.name]
        assert action.default == f.default and action.choices == f.metadata.get("choices")
        assert f.metadata["help"] in action.help
    assert actions["enable_prefix_caching"].option_strings == ["--no-prefix-caching"]
    args = parser.parse_args(["run", "--no-prefix-caching", "--enforce-eager"])
    config = EngineConfig.from_args(args)
    assert config.enable_prefix_caching is False and config.enforce_eager is True


def test_every_command_resolves_the_same_kv_cache_default():
    """serve defaulted --kv-cache-dtype to auto and chat to None; both now come from the field."""
    for module, argv in (("graft.serving.http.serve_cli", ["run"]), ("graft.chat_cli", ["run"]),
                         ("graft.benchmarks.engine", ["llm"]), ("graft.evals.eval_cli", [])):
        args = _parser(module).parse_args(argv)
        assert EngineConfig.from_args(args).kv_cache_dtype == "auto", module


def test_chat_answers_on_the_engine_only_when_an_engine_option_is_given():
    parser = _parser("graft.chat_cli")
    assert engine_args.given_options(parser.parse_args(["run", "--dtype", "bfloat16"])) == []
    args = parser.parse_args(["run", "--num-kv-blocks", "8"])
    assert engine_args.given_options(args) == ["num_kv_blocks"]
    config = EngineConfig.from_args(args, device="cpu", dtype="float32")
    assert config.num_kv_blocks == 8 and config.seed == 0  # chat's --seed is the sampler's


def test_excluded_options_keep_the_command_meaning():
    """bench engine's --quantization is a list of formats to compare, not the engine's weights."""
    args = _parser("graft.benchmarks.engine").parse_args(["llm", "--quantization", "int8,int4"])
    assert EngineConfig.from_args(args).quantization is None
    with pytest.raises(ValueError, match="no engine option named"):
        engine_args.add_engine_args(argparse.ArgumentParser(), exclude=("max_num_seq",))


def _serve(tmp_path, yaml_text: str, *argv: str) -> argparse.Namespace:
    config = tmp_path / "serve.yaml"
    config.write_text(yaml_text)
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parse_args(parser, ["--config", str(config), *argv])


def test_serve_config_file_sets_every_option_and_flags_win(tmp_path):
    args = _serve(tmp_path, "path: runs/a\nmax_num_seqs: 8\nkv-cache-dtype: int8\nport: 9001\n"
                  "enable_prefix_caching: false\napi_key: [k1, k2]\n"
                  "quantization: {default: int8, modules: {lm_head: fp32}}\n",
                  "--max-num-seqs", "4")
    assert args.path == "runs/a" and args.port == 9001 and args.api_key == ["k1", "k2"]
    config = EngineConfig.from_args(args)
    assert config.max_num_seqs == 4  # the command line wins over the file
    assert config.kv_cache_dtype == "int8" and config.enable_prefix_caching is False
    assert config.quant_config.default.name == "int8"


@pytest.mark.parametrize("yaml_text, message", [
    ("max_num_seq: 8\n",
     "unknown key 'max_num_seq' (not a graft serve option); did you mean 'max_num_seqs'"),
    ("kv_cache_dtype: fp8\n", "kv_cache_dtype: must be one of auto, float32, bfloat16, int8"),
    ("block_size: 0\n", "block_size: 0 is out of range"),
    ("enforce_eager: 1\n", "enforce_eager: must be true or false"),
    ("- 1\n", "must be a mapping"),
])
def test_serve_config_file_errors_name_the_key_and_the_file(tmp_path, yaml_text, message):
    with pytest.raises(GraftConfigError, match="serve.yaml") as err:
        _serve(tmp_path, yaml_text)
    assert message in str(err.value)


def test_graft_serve_reports_a_bad_config_file_in_one_line(tmp_path, capsys):
    from graft.cli import main

    (tmp_path / "serve.yaml").write_text("ports: 1\n")
    assert main(["serve", "--config", str(tmp_path / "serve.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown key 'ports'" in err and "did you mean 'port'" in err


def test_quantization_is_parsed_once(tiny_llama, monkeypatch):
    from graft.serving import Engine
    from graft.serving.models.quant_config import QuantConfig

    calls = []
    parse = QuantConfig.parse.__func__
    monkeypatch.setattr(QuantConfig, "parse", classmethod(
        lambda cls, value: calls.append(value) or parse(cls, value)))
    Engine.from_pretrained(tiny_llama, EngineConfig(quantization="int8", num_kv_blocks=16))
    assert calls == ["int8"]


def test_eval_refuses_engine_options_on_the_hf_backend(capsys):
    from graft.cli import main

    assert main(["eval", "--model", "x", "--tasks", "t", "--kv-cache-dtype", "int8",
                 "--max-num-seqs", "8"]) == 2
    err = capsys.readouterr().err
    assert "--max-num-seqs --kv-cache-dtype needs --backend engine" in err


def test_chat_help_shows_the_engine_defaults_though_its_flags_start_unset():
    text = " ".join(_parser("graft.chat_cli").format_help().split())
    assert "(default: auto)" in text and "(default: None)" not in text


@pytest.mark.parametrize("module", COMMANDS)
def test_each_default_is_shown_once(module, capsys):
    from graft.cli import _HelpFormatter

    parser = argparse.ArgumentParser(prog=module, formatter_class=_HelpFormatter)
    importlib.import_module(module).add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "(default: 4) (default" not in text and "(default: auto)" in text
    assert "(default: True)" not in text  # not after --no-prefix-caching, a switch that turns it off


def test_declared_ranges_are_argparse_errors_naming_the_flag(capsys):
    parser = _parser("graft.serving.http.serve_cli")
    for argv in (["--kv-cache-fraction", "0"], ["--kv-cache-fraction", "1.5"], ["--seed", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["run", *argv])
        assert f"argument {argv[0]}: " in capsys.readouterr().err
    assert parser.parse_args(["run", "--kv-cache-fraction", "1", "--seed", "0"]).seed == 0
