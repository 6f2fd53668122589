"""diagnose_error and the knowledge base: every rule fires on its evidence; bad rule files fail loudly."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from fake_openai import CANARY

from tools.diagnose import diagnose_error, list_rules
from vapo_engine.diagnostics import (
    PREDICATES,
    Evidence,
    RuleFileError,
    evaluate,
    gather_evidence,
    load_rules,
    parse_rule_file,
    predicate,
)
from vapo_engine.diagnostics.scan import env_name_as_key_hits, hardcoded_key_hits

REAL_LOOKING = "sk-proj-Q7rT2mX9vB4nK8pL3wZ6yH1jD5fG0sA2"


def write_settings(tmp_path: Path, base_url: str = "https://api.example.com/v1", env_name: str = "TEST_KEY",
                   extra_api: dict | None = None) -> Path:
    p = tmp_path / "settings.json"
    api = {"base_url": base_url, "api_key_env": env_name, **(extra_api or {})}
    p.write_text(json.dumps({"api": api, "models": {"reasoning": "qwen-32b", "fallback": "qwen-14b"}}))
    return p


def git_repo(tmp_path: Path, ignore_env: bool) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".env").write_text(f"TEST_KEY={REAL_LOOKING}\n")
    if ignore_env:
        (tmp_path / ".gitignore").write_text(".env\n")
    return tmp_path


def _key_case(value: str):
    return lambda tmp: {"settings_path": write_settings(tmp), "env": {"TEST_KEY": value}}


def _code_case(source: str):
    def build(tmp):
        (tmp / "train.py").write_text(source)
        return {"code_path": tmp}
    return build


LOG_401_429 = ('INFO HTTP Request: POST https://h/v1/chat/completions "HTTP/1.1 401 Unauthorized"\n'
               'INFO HTTP Request: POST https://h/v1/chat/completions "HTTP/1.1 429 Too Many Requests"\n')

CASES = {
    "http-401-env-name-as-key": lambda tmp: {"status": 401, "body": json.dumps({"error": {
        "message": "Incorrect API key provided: TAOTOKEN_API_KEY.", "code": "invalid_api_key"}})},
    "http-401-key-rejected": lambda tmp: {"status": 401, "body": '{"error": {"message": "invalid key"}}'},
    "http-403-forbidden": lambda tmp: {"status": 403, "body": '{"error": {"message": "model not allowed"}}'},
    "http-404-route": lambda tmp: {"status": 404, "body": '{"detail": "Not Found"}',
                                   "base_url": "https://h/api/v1/"},
    "http-404-model": lambda tmp: {"status": 404, "model": "qwen-32b", "body": json.dumps({"error": {
        "message": "The model `qwen-32b` does not exist", "code": "model_not_found"}})},
    "http-429-cooldown-after-401": lambda tmp: {"text": LOG_401_429},
    "http-429-quota": lambda tmp: {"status": 429, "body": json.dumps({"error": {
        "message": "You exceeded your current quota", "type": "insufficient_quota"}})},
    "http-429-rate-limit": lambda tmp: {"status": 429, "headers": ["Retry-After: 20"],
                                        "body": '{"error": {"message": "Rate limit reached for requests"}}'},
    "http-5xx-server": lambda tmp: {"status": 502, "body": "<html><title>502 Bad Gateway</title></html>"},
    "http-400-context-length": lambda tmp: {"status": 400, "body": json.dumps({"error": {
        "message": "This model's maximum context length is 8192 tokens, you requested 12000"}})},
    "http-400-bad-request": lambda tmp: {"status": 422, "body": '{"detail": [{"loc": ["body"], "msg": "bad"}]}'},
    "http-200-error-body": lambda tmp: {"status": 200, "body": '{"code": 500, "msg": "upstream failed"}'},
    "http-3xx-redirect": lambda tmp: {"status": 307, "headers": ["Location: https://other.example/v1/chat"]},
    "net-dns": lambda tmp: {"text": "httpx.ConnectError: [Errno -2] Name or service not known"},
    "net-refused": lambda tmp: {"text": "ConnectionRefusedError: [Errno 111] Connection refused"},
    "net-tls-http-port": lambda tmp: {"text": "ssl.SSLError: [SSL: WRONG_VERSION_NUMBER] wrong version number"},
    "net-tls-cert": lambda tmp: {"text": "ssl.SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] "
                                         "certificate verify failed: self-signed certificate"},
    "net-timeout": lambda tmp: {"text": "httpx.ReadTimeout: The read operation timed out"},
    "net-connection-dropped": lambda tmp: {"text": "httpx.RemoteProtocolError: peer closed connection without "
                                                   "sending complete message body (incomplete chunked read)"},
    "net-proxy-captures-localhost": lambda tmp: {"base_url": "http://127.0.0.1:8000/v1",
                                                 "env": {"HTTPS_PROXY": "http://proxy:3128",
                                                         "HTTP_PROXY": "http://proxy:3128"}},
    "net-proxy-error": lambda tmp: {"text": "httpx.ProxyError: 407 Proxy Authentication Required"},
    "key-not-exported": lambda tmp: {"text": "Traceback ...\nKeyError: 'TAOTOKEN_API_KEY'"},
    "key-env-name-as-value": _key_case("OPENAI_API_KEY"),
    "key-quoted": _key_case(f'"{CANARY}"'),
    "key-whitespace": _key_case(f"{CANARY} "),
    "key-bearer-prefix": _key_case(f"Bearer {CANARY}"),
    "key-placeholder": _key_case("your-api-key"),
    "key-truncated": _key_case("sk-7f3a9c…1c3e"),
    "url-no-scheme": lambda tmp: {"base_url": "taotoken.net/api/v1"},
    "url-trailing-slash": lambda tmp: {"base_url": "https://h/v1/"},
    "url-missing-v1": lambda tmp: {"base_url": "https://h/api"},
    "url-double-v1": lambda tmp: {"base_url": "https://h/v1/v1"},
    "url-endpoint-pasted": lambda tmp: {"base_url": "https://h/v1/chat/completions"},
    "config-base-url-override": lambda tmp: {"settings_path": write_settings(tmp), "status": 404,
                                             "env": {"TEST_KEY": CANARY, "TAOTOKEN_BASE_URL": "http://old:1/v1"}},
    "config-invalid": lambda tmp: {"settings_path": (tmp / "s.json", (tmp / "s.json").write_text("{bad"))[0]},
    "config-key-in-settings": lambda tmp: {"settings_path": write_settings(tmp, extra_api={"api_key": CANARY})},
    "config-read-keyerror": lambda tmp: {"text": 'File "train.py", line 3\n    key = cfg["api"]["api_key"]\n'
                                                 "KeyError: 'api_key'"},
    "code-env-name-as-key": _code_case('import tomllib\ncfg = tomllib.load(open("config.toml", "rb"))\n'
                                       'api_key = cfg["api"]["api_key_env"]\n'),
    "code-hardcoded-key": _code_case(f'client = OpenAI(api_key="{REAL_LOOKING}")\n'),
    "dotenv-not-ignored": lambda tmp: {"code_path": git_repo(tmp, ignore_env=False)},
}


def test_every_rule_has_a_case():
    from test_diagnose_training import TRAINING_CASES  # training rules are exercised on run directories there
    assert sorted([*CASES, *TRAINING_CASES]) == sorted(r["id"] for r in list_rules())


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires(rule_id, tmp_path):
    if rule_id == "dotenv-not-ignored" and shutil.which("git") is None:
        pytest.skip("git not installed")
    kwargs = CASES[rule_id](tmp_path)
    kwargs.setdefault("env", {})
    d = diagnose_error(**kwargs, limit=50)
    found = [f.rule_id for f in d.findings]
    assert rule_id in found, (rule_id, found)
    f = d.findings[found.index(rule_id)]
    assert f.cause and f.fix and f.evidence and f.score > 0
    assert CANARY not in d.model_dump_json() and REAL_LOOKING not in d.model_dump_json()


@pytest.mark.parametrize("rule_id, top", [
    ("http-401-env-name-as-key", "http-401-env-name-as-key"), ("http-429-cooldown-after-401",
                                                               "http-429-cooldown-after-401"),
    ("http-429-quota", "http-429-quota"), ("http-404-route", "http-404-route"),
    ("http-404-model", "http-404-model"), ("key-quoted", "key-quoted"),
])
def test_specific_rules_rank_first(rule_id, top, tmp_path):
    kwargs = CASES[rule_id](tmp_path)
    kwargs.setdefault("env", {})
    assert diagnose_error(**kwargs).findings[0].rule_id == top


def test_key_shape_rules_rank_above_generic_401(tmp_path):
    """The server's own key is the cause when its own channel is checked; for a pasted 401 it is a labelled
    fact about this server's channel that ranks after the finding about the pasted error."""
    ev = gather_evidence(settings_path=write_settings(tmp_path), env={"TEST_KEY": f"Bearer {CANARY}"})
    live = evaluate(ev.model_copy(update={"status": 401}), limit=50)
    assert live[0].rule_id == "key-bearer-prefix" and "http-401-key-rejected" in [f.rule_id for f in live]
    d = diagnose_error(status=401, settings_path=write_settings(tmp_path), env={"TEST_KEY": f"Bearer {CANARY}"})
    ids = [f.rule_id for f in d.findings]
    assert ids[0] == "http-401-key-rejected" and d.findings[0].scope == "given"
    shape = d.findings[ids.index("key-bearer-prefix")]
    assert shape.scope == "server_channel" and shape.title.startswith("this server's channel: ")


def test_dotenv_ignored_is_not_reported(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    d = diagnose_error(code_path=git_repo(tmp_path, ignore_env=True), env={})
    assert "dotenv-not-ignored" not in [f.rule_id for f in d.findings]
    assert "code-hardcoded-key" not in [f.rule_id for f in d.findings]  # keys in .env are expected


def test_openai_sdk_traceback_is_parsed():
    tb = ("Traceback (most recent call last):\n  File \"run.py\", line 9, in <module>\n"
          "openai.NotFoundError: Error code: 404 - {'error': {'message': 'The model `qwen-32b` does not exist "
          "or you do not have access to it.', 'type': 'invalid_request_error', 'param': None, 'code': "
          "'model_not_found'}}")
    d = diagnose_error(text=tb, env={})
    assert d.findings[0].rule_id == "http-404-model" and "log/traceback text" in d.inputs


def test_no_evidence_and_bad_arguments():
    d = diagnose_error(env={})
    assert d.findings == [] and "no evidence" in d.summary
    with pytest.raises(ValueError, match="HTTP status"):
        diagnose_error(status=999)
    with pytest.raises(ValueError, match="Name: value"):
        diagnose_error(headers=["no colon"])
    with pytest.raises(ValueError, match="not found"):
        diagnose_error(log_path="/nonexistent/log.txt")


def test_log_file_and_limit(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("x" * 300_000 + "\nKeyError: 'TAOTOKEN_API_KEY'\n" + LOG_401_429)
    d = diagnose_error(log_path=log, limit=1, env={})
    assert len(d.findings) == 1 and d.truncated and d.findings[0].rule_id == "http-429-cooldown-after-401"


# --- the code scanner ---------------------------------------------------------------------------------

@pytest.mark.parametrize("source", [
    'api_key = config["api"]["api_key_env"]',
    'client = OpenAI(base_url=u, api_key=settings["api"]["api_key_env"])',
    'headers = {"Authorization": f"Bearer {cfg[\'api\'][\'api_key_env\']}"}',
    'self.api_key = settings.api.api_key_env',
    'key_env = cfg["api"].get("api_key_env")\nclient = OpenAI(api_key=key_env)',
    'headers = {"api-key": cfg["api"]["api_key_env"]}',
])
def test_scanner_finds_env_name_used_as_key(source):
    assert [h.kind for h in env_name_as_key_hits(source, "x.py")] == ["env_name_as_key"]


@pytest.mark.parametrize("source", [
    'api_key = os.environ[config["api"]["api_key_env"]]',
    'api_key = os.getenv(settings["api"]["api_key_env"])',
    'api_key = os.environ.get(cfg["api"]["api_key_env"], "")',
    'key_env = cfg["api"]["api_key_env"]\nkey = os.environ[key_env]',
    'print(cfg["api"]["api_key_env"])',
    'def broken(:',
])
def test_scanner_accepts_correct_reads(source):
    assert env_name_as_key_hits(source, "x.py") == []


def test_scanner_hardcoded_keys_are_redacted_and_placeholders_skipped():
    hits = hardcoded_key_hits(f'KEY = "{REAL_LOOKING}"\nEXAMPLE = "sk-xxxxxxxxxxxxxxxxxxxxxxxx"\n'
                              'api_key = "your-api-key-goes-here-please"\n', "cfg.py")
    assert [h.line for h in hits] == [1] and REAL_LOOKING not in hits[0].snippet and "sk-…" in hits[0].snippet


# --- rule files ---------------------------------------------------------------------------------------

GOOD = {"id": "demo-rule", "category": "http", "severity": "info", "title": "demo", "when": {"status_in": [418]},
        "cause": "a teapot", "evidence": "HTTP {status}", "fix": "use coffee"}


def _file(*rules) -> str:
    return json.dumps({"version": 1, "rules": list(rules)})


@pytest.mark.parametrize("change, message", [
    ({"when": {"status_inn": [401]}}, "unknown predicate 'status_inn' (did you mean 'status_in'?)"),
    ({"when": {"network": {"kind": "dns", "extra": 1}}}, "bad arguments for 'network'"),
    ({"when": {"said_matches": "(unclosed"}}, "invalid regex"),
    ({"when": {"all": []}}, "needs a non-empty list"),
    ({"when": {"status_in": [1], "key": "missing"}}, "exactly one key"),
    ({"when": {"status_range": 5}}, "takes several arguments"),
    ({"fix": "set {no_such_fact}"}, "unknown fact {no_such_fact}"),
    ({"severity": "fatal"}, "severity"),
    ({"id": "Bad Id"}, "id"),
    ({"cause": None}, "cause"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_rule_entries_fail_with_clear_errors(change, message):
    rules, problems = parse_rule_file(_file({**GOOD, **change}), "rules_bad.json")
    assert rules == [] and problems and message in problems[0] and "rules_bad.json" in problems[0]


def test_bad_rule_files_fail_loading(tmp_path):
    bad = tmp_path / "rules_bad.json"
    bad.write_text('{"version": 1, "rules": [\n  {"id": "x",}\n]}')
    with pytest.raises(RuleFileError, match=r"rules_bad.json:2:\d+: JSON syntax error"):
        load_rules([bad])
    a, b = tmp_path / "rules_a.json", tmp_path / "rules_b.json"
    a.write_text(_file(GOOD))
    b.write_text(_file(GOOD, {**GOOD, "id": "other", "when": {"nope": True}}))
    with pytest.raises(RuleFileError) as e:
        load_rules([a, b])
    assert "duplicate id" in str(e.value) and "unknown predicate 'nope'" in str(e.value)
    assert len(e.value.problems) == 2


def test_shipped_rules_load_and_a_new_domain_slots_in(tmp_path):
    assert len(load_rules()) == len(CASES) + len([r for r in load_rules() if r.id.startswith("train-")])

    @predicate
    def reward_flat(ev: Evidence, below: float) -> str | None:
        spread = ev.extra.get("metrics", {}).get("reward_spread")
        return f"reward spread {spread} < {below}" if spread is not None and spread < below else None
    try:
        path = tmp_path / "rules_training.json"
        path.write_text(_file({**GOOD, "id": "train-reward-flat", "category": "training",
                               "when": {"reward_flat": {"below": 0.01}}, "evidence": "metrics"}))
        rules = load_rules([path])
        hit = evaluate(Evidence(extra={"metrics": {"reward_spread": 0.001}}), rules)
        assert [f.rule_id for f in hit] == ["train-reward-flat"] and "0.001" in hit[0].evidence[1]
        assert evaluate(Evidence(extra={"metrics": {"reward_spread": 0.5}}), rules) == []
    finally:
        PREDICATES.pop("reward_flat")
