"""Config files: the shipped values, every class of bad input (exact key + fix), precedence, no key leaks."""
from __future__ import annotations

import json
import re

import pytest
from pydantic import ValidationError

from server.cli import main
from tests.conftest import CANARY_KEY, ROOT
from vapo_engine.config import ConfigError, TrainConfig, load_config, load_settings, redact, resolve_channel


def _issue(fn, *args, **kw):
    with pytest.raises(ConfigError) as ei:
        fn(*args, **kw)
    assert ei.value.issues, "ConfigError without issues"
    return ei.value.issues[0]


def test_shipped_files_have_spec_values():
    c, s = load_config(ROOT / "config.toml"), load_settings(ROOT / "settings.json")
    assert (c.api.timeout_seconds, c.api.max_retries, c.model.max_tokens) == (120, 3, 4096)
    assert (c.vapo.alpha, c.vapo.lambda_base, c.vapo.group_size, c.vapo.replay_ratio) == (0.02, 0.95, 8, 0.3)
    assert (c.training.total_steps, c.training.batch_size, c.training.kl_coef) == (5000, 64, 0.01)
    assert (c.eval.benchmark, c.eval.eval_interval, c.eval.save_interval) == ("aime_2024", 250, 500)
    assert (c.vapo.lambda_critic, c.vapo.clip_range_high, c.vapo.positive_lm_coef) == (1.0, 0.28, 0.1)
    assert (c.vapo.value_pretrain_steps, c.vapo.value_learning_rate) == (50, 2e-6)
    assert c.model.local_path is None and c.prompts_per_step == 8
    assert s.models.fallback == "qwen-14b" and s.experiment.seed == 42 and s.runtime.stream is True


def test_every_field_documented():
    def walk(model):
        for name, f in model.model_fields.items():
            assert f.description, f"{model.__name__}.{name} has no docstring"
            ann = f.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann)
    walk(TrainConfig)


def test_models_are_frozen_and_forbid_extra():
    c = load_config(ROOT / "config.toml")
    with pytest.raises(ValidationError):
        c.vapo.alpha = 1.0  # type: ignore[misc]


def test_toml_syntax_error_has_line_and_column(project):
    p = project / "config.toml"
    p.write_text(p.read_text().replace("alpha = 0.02", "alpha = = 0.02"))
    i = _issue(load_config, p)
    line = next(n for n, ln in enumerate(p.read_text().splitlines(), 1) if "alpha = =" in ln)
    assert i.line == line and i.column is not None and "TOML syntax error" in i.message
    assert f"config.toml:{line}:" in str(i)


def test_json_syntax_error_has_line_and_column(project):
    p = project / "settings.json"
    p.write_text(p.read_text().replace('"stream": true,', '"stream": true,,'))
    i = _issue(load_settings, p)
    assert i.line == 9 and i.column is not None and "JSON syntax error" in i.message


@pytest.mark.parametrize("bad, good", [("alpah", "alpha"), ("grup_size", "group_size")])
def test_unknown_key_did_you_mean(project, bad, good):
    p = project / "config.toml"
    p.write_text(p.read_text().replace(f"\n{good} =", f"\n{bad} ="))
    i = _issue(load_config, p)
    assert i.key == f"vapo.{bad}" and i.message == "unknown key"
    assert f"did you mean vapo.{good}?" in i.fix


def test_unknown_section_and_settings_key(project):
    assert "did you mean training?" in _issue(load_config, project / "config.toml", ["trainig.x=1"]).fix
    p = project / "settings.json"
    data = json.loads(p.read_text())
    data["runtime"]["strem"] = True
    p.write_text(json.dumps(data))
    i = _issue(load_settings, p)
    assert i.key == "runtime.strem" and "did you mean runtime.stream?" in i.fix


@pytest.mark.parametrize("override, key, allowed", [
    ("training.total_steps=-5", "training.total_steps", "≥ 1"),
    ("training.clip_range=1.0", "training.clip_range", "< 1"),
    ("vapo.alpha=0", "vapo.alpha", "> 0"),
    ("vapo.alpha=-0.05", "vapo.alpha", "> 0"),
    ("vapo.replay_ratio=1.5", "vapo.replay_ratio", "≥ 0 and ≤ 1"),
    ("vapo.replay_ratio=-0.1", "vapo.replay_ratio", "≥ 0 and ≤ 1"),
    ("vapo.loss_reduction=mean", "vapo.loss_reduction", "'token_mean'"),
])
def test_out_of_range_names_file_key_value_and_range(project, override, key, allowed):
    i = _issue(load_config, project / "config.toml", [override])
    value = override.split("=")[1]
    assert i.key == key and i.file == "--set"
    assert value in i.message and allowed in i.message and allowed in i.fix and key in i.fix


def test_memory_options_parse_and_show_in_config_check(project, clean_env, capsys):
    c = load_config(project / "config.toml")
    assert c.training.micro_batch_tokens is None and c.training.gradient_checkpointing is False
    over = ["training.micro_batch_tokens=4096", "training.gradient_checkpointing=true"]
    c = load_config(project / "config.toml", over)
    assert c.training.micro_batch_tokens == 4096 and c.training.gradient_checkpointing is True
    main(["config", "check", "--config", str(project / "config.toml"), "--settings",
          str(project / "settings.json"), *(a for o in over for a in ("--set", o))])
    assert "micro_batch_tokens=4096" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["0", "-4096"])
def test_micro_batch_tokens_must_be_positive(project, bad):
    """(The loader hides the value of any key named like *token*: the message names the key and the range.)"""
    i = _issue(load_config, project / "config.toml", [f"training.micro_batch_tokens={bad}"])
    assert i.key == "training.micro_batch_tokens" and "≥ 1" in i.message
    assert "training.micro_batch_tokens" in i.fix and "≥ 1" in i.fix


def test_out_of_range_in_file_names_the_file(project):
    p = project / "config.toml"
    p.write_text(p.read_text().replace("clip_range = 0.2", "clip_range = 1.2"))
    i = _issue(load_config, p)
    assert i.file == str(p) and i.key == "training.clip_range" and "1.2" in i.message


def test_batch_not_divisible_by_group(project):
    i = _issue(load_config, project / "config.toml", ["training.batch_size=60"])
    assert i.key == "training.batch_size" and "not divisible by vapo.group_size 8" in i.message
    assert "multiple of 8" in i.fix


def test_all_errors_reported_together(project):
    with pytest.raises(ConfigError) as ei:
        load_config(project / "config.toml", ["vapo.alpha=0", "training.clip_range=2", "vapo.foo=1"])
    assert {i.key for i in ei.value.issues} == {"vapo.alpha", "training.clip_range", "vapo.foo"}


def test_bad_override_syntax_and_missing_file(project):
    assert "section.key=value" in _issue(load_config, project / "config.toml", ["alpha"]).message
    i = _issue(load_config, project / "nope.toml")
    assert i.message == "file not found" and "nope.toml" in i.file


def test_auth_header_in_settings_refused(project):
    p = project / "settings.json"
    data = json.loads(p.read_text())
    data["api"]["default_headers"]["Authorization"] = "Bearer x"
    p.write_text(json.dumps(data))
    i = _issue(load_settings, p)
    assert i.key == "api.default_headers" and "api_key_env" in i.fix


def test_precedence_env_over_dotenv_and_base_url_override(project, clean_env):
    s = load_settings(project / "settings.json")
    dot = project / ".env"
    dot.write_text("TAOTOKEN_API_KEY=sk-from-dotenv-000000000000000000001111\n")
    ch, warns = resolve_channel(s, dotenv_path=dot, env={})
    assert ch.key.reveal().endswith("1111") and ch.key_source.startswith(".env file") and not warns
    env = {"TAOTOKEN_API_KEY": CANARY_KEY, "TAOTOKEN_BASE_URL": "http://127.0.0.1:9/v1"}
    ch, _ = resolve_channel(s, dotenv_path=dot, env=env)
    assert ch.key.reveal() == CANARY_KEY and ch.key_source == "environment variable TAOTOKEN_API_KEY"
    assert ch.base_url == "http://127.0.0.1:9/v1" and ch.base_url_source == "environment TAOTOKEN_BASE_URL"
    ch, _ = resolve_channel(s, env={})
    assert ch.base_url == "https://taotoken.net/api" and ch.base_url_source.endswith("api.base_url")


def test_missing_key_is_a_warning_with_the_fix(project, clean_env):
    ch, warns = resolve_channel(load_settings(project / "settings.json"), env={})
    assert ch.key is None and ch.key_source == "missing"
    assert warns[0].level == "warning" and "export TAOTOKEN_API_KEY=" in warns[0].fix


def test_cross_file_disagreement_warns(project):
    c = load_config(project / "config.toml", ['api.base_url="https://other.example/v1"'])
    _, warns = resolve_channel(load_settings(project / "settings.json"), c, env={})
    w = next(w for w in warns if w.key == "api.base_url")
    assert "used for every API call" in w.message and w.level == "warning"


def test_redaction_format():
    assert redact(CANARY_KEY) == f"sk-…{CANARY_KEY[-4:]} (len {len(CANARY_KEY)})"
    assert CANARY_KEY not in repr(resolve_channel(load_settings(ROOT / "settings.json"),
                                                  env={"TAOTOKEN_API_KEY": CANARY_KEY})[0])


def test_cli_config_check_ok_and_redacted(project, clean_env, capsys):
    clean_env.setenv("TAOTOKEN_API_KEY", CANARY_KEY)
    rc = main(["config", "check", "--config", str(project / "config.toml"),
               "--settings", str(project / "settings.json")])
    out = capsys.readouterr()
    assert rc == 0 and "environment variable TAOTOKEN_API_KEY" in out.out and CANARY_KEY[-4:] in out.out
    assert CANARY_KEY not in out.out + out.err


def test_cli_config_check_missing_key_warns(project, clean_env, capsys):
    rc = main(["config", "check", "--config", str(project / "config.toml"),
               "--settings", str(project / "settings.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "TAOTOKEN_API_KEY is not set" in out and "export TAOTOKEN_API_KEY=" in out


def test_cli_config_check_errors_exit_2_without_traceback(project, clean_env, capsys):
    rc = main(["config", "check", "--config", str(project / "config.toml"),
               "--settings", str(project / "settings.json"), "--set", "vapo.alpha=-1"])
    err = capsys.readouterr().err
    assert rc == 2 and "vapo.alpha" in err and "Traceback" not in err


def test_cli_json_output(project, clean_env, capsys):
    clean_env.setenv("TAOTOKEN_API_KEY", CANARY_KEY)
    rc = main(["config", "check", "--json", "--config", str(project / "config.toml"),
               "--settings", str(project / "settings.json")])
    out = capsys.readouterr().out
    data = json.loads(out)
    assert rc == 0 and data["ok"] and data["channel"]["key"].startswith("sk-…")
    assert not re.search(re.escape(CANARY_KEY), out)


def test_key_pasted_as_env_name_is_redacted_in_errors(project):
    p = project / "settings.json"
    data = json.loads(p.read_text())
    data["api"]["api_key_env"] = CANARY_KEY
    p.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as ei:
        load_settings(p)
    assert CANARY_KEY not in str(ei.value) and "api.api_key_env" in str(ei.value)


def test_every_ablation_is_one_visible_decision():
    """Each variant changes the derived decisions it names (and nothing else of VAPO's); ppo_clip is
    reachable from the config; the decisions are written into config.json and read back."""
    from vapo_engine.variants import VARIANTS
    base = load_config(ROOT / "config.toml", preset="cpu-demo")
    d0 = base.decisions.model_dump()
    expect = {"no_value_pretrain": {"value_pretrain_steps"}, "no_decoupled_gae": {"estimator", "lambda_critic"},
              "no_length_adaptive": {"lambda_policy"}, "no_clip_higher": {"policy_loss", "clip_high"},
              "no_token_level_loss": {"loss_reduction"}, "no_positive_lm": {"positive_lm_coef", "positive_replay"},
              "no_positive_replay": {"positive_replay"}, "no_group_sampling": set()}
    for name, fields in expect.items():
        cfg = load_config(ROOT / "config.toml", VARIANTS[name].apply(base), preset="cpu-demo")
        changed = {k for k, v in cfg.decisions.model_dump().items() if v != d0[k]}
        assert changed == fields, (name, changed)
    off = load_config(ROOT / "config.toml", VARIANTS["no_clip_higher"].apply(base), preset="cpu-demo").decisions
    assert off.policy_loss == "ppo_clip" and off.clip_high == off.clip_low == 0.2
    grpo = load_config(ROOT / "config.toml", VARIANTS["grpo"].apply(base), preset="cpu-demo").decisions
    assert grpo.estimator == "grpo" and not grpo.uses_critic and grpo.value_pretrain_steps == 0
    dumped = base.model_dump(mode="json")
    assert dumped["decisions"] == d0 and TrainConfig.model_validate(dumped).decisions == base.decisions


def test_clip_range_high_is_only_checked_when_clip_higher_is_on():
    cfg = load_config(ROOT / "config.toml", ["vapo.clip_higher=false", "vapo.clip_range_high=0.1"])
    assert cfg.decisions.policy_loss == "ppo_clip"
    with pytest.raises(ConfigError, match="clip_range_high"):
        load_config(ROOT / "config.toml", ["vapo.clip_range_high=0.1"])


def test_fsdp_is_accepted_and_its_combinations_are_checked():
    cfg = load_config(ROOT / "config.toml", ['distributed.strategy="fsdp"', "distributed.cpu_offload=true"])
    assert cfg.distributed.strategy == "fsdp" and cfg.distributed.cpu_offload
    with pytest.raises(ConfigError, match="distributed.strategy.*lora"):
        load_config(ROOT / "config.toml", ['distributed.strategy="fsdp"', "lora.enabled=true"])
    with pytest.raises(ConfigError, match="distributed.cpu_offload"):
        load_config(ROOT / "config.toml", ["distributed.cpu_offload=true"])


def test_sampling_settings_that_make_ratios_approximate_warn():
    """The shipped top_p 0.95 samples from a nucleus the trainer's full-vocabulary log-probs do not renormalise
    over: `config check` says so with the fix; top_p 1 is silent; temperature 0 (greedy rollouts) warns."""
    from vapo_engine.config import config_warnings
    keys = lambda cfg: {w.key: w for w in config_warnings(cfg)}
    shipped = keys(load_config(ROOT / "config.toml"))
    assert "approximate" in shipped["model.top_p"].message and "top_p = 1.0" in shipped["model.top_p"].fix
    assert "model.top_p" not in keys(load_config(ROOT / "config.toml", preset="cpu-demo"))
    greedy = keys(load_config(ROOT / "config.toml", ["model.temperature=0"]))
    assert "greedy" in greedy["model.temperature"].message and "model.top_p" not in greedy


@pytest.mark.parametrize("override, fix", [
    ("rollout.urls=http://h:8000", """write rollout.urls as a list in [ ], e.g. --set 'rollout.urls=["http://h:8000"]'"""),
    ("vapo=1", "set the keys of vapo one by one: --set vapo."),
    ("training.total_steps=abc", ("write training.total_steps as a whole number (≥ 1 and ≤ 10000000), e.g. "
                                  "--set training.total_steps=5000")),
    ("vapo.alpha=x", "write vapo.alpha as a number (> 0 and ≤ 100), e.g. --set vapo.alpha="),
    ("training.gradient_checkpointing=maybe", ("write training.gradient_checkpointing as true or false, e.g. "
                                               "--set training.gradient_checkpointing=")),
    ("model.name=5", "write model.name as a quoted string, e.g. --set 'model.name=\""),
])
def test_a_value_of_the_wrong_shape_gets_a_fix_in_the_right_shape(project, override, fix):
    i = _issue(load_config, project / "config.toml", [override])
    assert i.file == "--set" and i.fix.startswith(fix) and "a valid value" not in i.fix
    assert "instance of" not in i.message and "expected" in i.message


def test_a_shape_fix_in_the_file_is_written_as_a_toml_line(project):
    cfg = project / "config.toml"
    cfg.write_text('[rollout]\nurls = "http://h:8000"\n')
    assert _issue(load_config, cfg).fix.endswith('e.g. urls = ["http://h:8000"] under [rollout]')
    cfg.write_text('eval = 3\n[rollout]\nurls = [5]\n')
    with pytest.raises(ConfigError) as ei:
        load_config(cfg)
    fixes = {i.key: i.fix for i in ei.value.issues}
    assert "a [eval] section with one `key = value` line per key (keys: benchmark" in fixes["eval"]
    assert fixes["rollout.urls[0]"] == 'write rollout.urls as a list of quoted strings, e.g. urls = ["5"] under [rollout]'


@pytest.mark.parametrize("key", ["model.temperature", "provider_rollouts.temperature"])
def test_a_numerically_unsafe_temperature_is_a_config_error_naming_the_field(key):
    issue = _issue(load_config, ROOT / "config.toml", [f"{key}=1e-7"])
    assert issue.key == key and "numerically unsafe" in issue.message and "use 0 for greedy" in issue.fix, issue
    for ok in ("0", "1e-5", "1.0"):
        load_config(ROOT / "config.toml", [f"{key}={ok}"])
