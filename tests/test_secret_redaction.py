"""Secrets the user typed in the wrong place never come back out: `user:pass@` in a base URL (config check,
run snapshots), a key pasted into `api.api_key_env` that passes as an identifier, secret-looking `--set` values
and tags (run.json, config.json, settings.json, the registry's tags), keys with no prefix in what is given to
`diagnose_error`. Plus the heuristics and the echo-aware scrubbing those rest on."""
from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import quote

import pytest
from fake_openai import FakeOpenAI, key_traces

from server.cli import main
from tests.conftest import ROOT
from tools.diagnose import diagnose_error
from vapo_engine.config import Settings, load_config, load_settings, redact, resolve_channel
from vapo_engine.config.secrets import looks_like_secret, redact_identifier, redact_tokens
from vapo_engine.diagnostics import gather_evidence
from vapo_engine.providers import scrub
from vapo_engine.runs import create_run, load_run

HEX_KEY = "5b17154d7b400463f7da47f4a77182e07a348074"
ID_KEY = "Tk_8fJ2mQ9xLp4R7vNc3WbZ6yHd1sGe5uA0"
"""A key that is a valid identifier (letters, digits, underscore): passes the `api_key_env` name check."""
PLAIN_KEY = "4lpdSukDf984vWQeepvPy2z2WWAYDwm90sdP3FfD"
SK_KEY = "sk-zk9a0x86YsqZrefeHIFkO98YBDCHIcmarebYeG1aT3lWl8vk"
PASSWORDS = ("S3cr3tPassw0rd", "Hunter2Hunter2x", "EnvPr0xyPassw0rd")


def leaks(text: str, *secrets: str) -> dict[str, list[str]]:
    return {s: key_traces(text, s) for s in secrets if key_traces(text, s)}


def files_text(root: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in root.rglob("*") if p.is_file())


# --- heuristics and scrubbing -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [PLAIN_KEY, HEX_KEY, ID_KEY, SK_KEY, "AKIAIOSFODNN7EXAMPLE",
                                   "ABCD1234EFGH5678IJKL9", f'"{HEX_KEY}"'])
def test_looks_like_secret_catches_keys_without_context(value):
    assert looks_like_secret(value)


@pytest.mark.parametrize("value", ["TAOTOKEN_API_KEY", "OPENAI_API_KEY", "openai_api_key_2", "MY_PROVIDER_KEY_V2_2024",
                                   "experiment20240315", "abl-1a2b3c4d", "20240101-120000-abc123",
                                   "qwen2.5-32b-instruct", "builtin:addition", "vapo_engine.providers.client",
                                   "123e4567-e89b-12d3-a456-426614174000", f"/models/snapshots/{HEX_KEY}",
                                   redact(PLAIN_KEY), redact_identifier(ID_KEY), "aaaa1111aaaa1111aaaa", "short1"])
def test_looks_like_secret_spares_names_ids_paths_and_redacted_values(value):
    assert not looks_like_secret(value)


def test_scrub_finds_partial_cased_and_encoded_echoes_of_the_key():
    special = "r4Nd+0m/K3y=W1th&Sp3c1al#Ch4rs!x9Q2"
    for key, text in [(PLAIN_KEY, f"first twenty: {PLAIN_KEY[:20]}"), (PLAIN_KEY, PLAIN_KEY[15:35]),
                      (PLAIN_KEY, PLAIN_KEY.upper()), (SK_KEY, f"x-ratelimit-{SK_KEY.lower()}"),
                      (PLAIN_KEY, "Basic " + base64.b64encode(f"user:{PLAIN_KEY}".encode()).decode()),
                      (PLAIN_KEY, base64.b64encode(PLAIN_KEY.encode()).decode()),
                      (special, f"GET /v1/models?k={quote(special, safe='')}"), (special, json.dumps(special))]:
        out = scrub(text, [key])
        assert not key_traces(out, key) and not key_traces(out, quote(key, safe="")), (text, out)
        assert redact(key) in out


def test_scrub_without_a_known_key_redacts_credential_pairs_and_keeps_prose():
    for text in [f'{{"api_key": "{HEX_KEY}"}}', f'{{"key": "{HEX_KEY}"}}', f"x-api-key: {HEX_KEY}",
                 f"GET https://h/v1/models?key={HEX_KEY}&x=1", f"Incorrect API key provided: {HEX_KEY}.",
                 f"Authorization: Basic {base64.b64encode(f'u:{HEX_KEY}'.encode()).decode()}",
                 f"password={HEX_KEY[:12]}"]:
        out = scrub(text)
        assert not key_traces(out, HEX_KEY[:12]) and "…" in out, (text, out)
    prose = '"max_tokens": 256, token_mean, api_key=os.environ["X"], key_source: env, the key: required'
    assert scrub(prose) == prose


# --- base URL credentials ---------------------------------------------------------------------------------

def _write_urls(project: Path) -> None:
    settings = json.loads((project / "settings.json").read_text())
    settings["api"]["base_url"] = f"https://alice:{PASSWORDS[0]}@gw.example/api"
    (project / "settings.json").write_text(json.dumps(settings))
    cfg = (project / "config.toml").read_text()
    cfg = cfg.replace('base_url = "https://taotoken.net/api"', f'base_url = "https://bob:{PASSWORDS[1]}@gw.example/api"')
    (project / "config.toml").write_text(cfg)


def test_url_credentials_are_stripped_with_or_without_scheme_or_password():
    cases = {f"https://alice:{PASSWORDS[0]}@gw.example/api": "https://alice:***@gw.example/api",
             f"https://{HEX_KEY}@gw.example/v1": "https://***@gw.example/v1",
             f"https://{HEX_KEY}:x@gw.example/v1": "https://***:***@gw.example/v1",
             f"alice:{PASSWORDS[0]}@gw.example/api": "alice:***@gw.example/api",
             f"base URL 'u:{PASSWORDS[1]}@h/v1' has no scheme": "base URL 'u:***@h/v1' has no scheme"}
    for raw, shown in cases.items():
        assert scrub(raw) == shown
    assert scrub("write to bob@example.com") == "write to bob@example.com"


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_config_check_hides_base_url_credentials(project, clean_env, capsys, as_json):
    _write_urls(project)
    files = ["--config", str(project / "config.toml"), "--settings", str(project / "settings.json")]
    assert main(["config", "check", *files, *(["--json"] if as_json else [])]) == 0
    out = capsys.readouterr()
    clean_env.setenv("TAOTOKEN_BASE_URL", f"https://carol:{PASSWORDS[2]}@env.example/v1")
    assert main(["config", "check", *files, *(["--json"] if as_json else [])]) == 0
    out2 = capsys.readouterr()
    assert not leaks(out.out + out.err + out2.out + out2.err, *PASSWORDS)
    assert "alice:***@gw.example" in out.out and "bob:***@gw.example" in out.out  # the cross-file warning
    assert "carol:***@env.example" in out2.out


# --- a key pasted into api.api_key_env --------------------------------------------------------------------

def test_key_pasted_into_api_key_env_is_never_printed(project, clean_env, capsys):
    settings = json.loads((project / "settings.json").read_text())
    with FakeOpenAI() as srv:
        settings["api"].update({"api_key_env": ID_KEY, "base_url": srv.base_url})
        (project / "settings.json").write_text(json.dumps(settings))
        files = ["--config", str(project / "config.toml"), "--settings", str(project / "settings.json")]
        assert main(["config", "check", *files]) == 0
        text = capsys.readouterr()
        outputs = [text.out + text.err]
        for argv in (["config", "check", "--json", *files], ["check", *files], ["check", "--json", *files],
                     ["diagnose", "--json", *files]):
            main(argv)
            out = capsys.readouterr()
            outputs.append(out.out + out.err)
    channel, warnings = resolve_channel(load_settings(project / "settings.json"), env={})
    assert not leaks("\n".join(outputs) + repr(channel) + json.dumps(channel.public()) + str(warnings), ID_KEY)
    assert "looks like an API key" in outputs[0] and redact(ID_KEY) in outputs[0]
    assert channel.api_key_env == redact(ID_KEY) and any("looks like an API key" in str(w) for w in warnings)


# --- run snapshots: base URL, pasted key, --set values, tags ----------------------------------------------

def test_run_snapshot_redacts_credentials_pasted_keys_overrides_and_tags(tmp_path):
    overrides = [f"model.name={HEX_KEY}", f"api.api_key_env={ID_KEY}", "vapo.alpha=0.5",
                 f'api.base_url="https://bob:{PASSWORDS[1]}@gw.example/api"']
    config = load_config(ROOT / "config.toml", overrides)
    settings = Settings.model_validate({
        "api": {"base_url": f"https://alice:{PASSWORDS[0]}@gw.example/api", "api_key_env": ID_KEY,
                "default_headers": {"Content-Type": "application/json", "X-Api-Key": "HdrSecret1234567890ab",
                                    "X-Trace": PLAIN_KEY}},
        "experiment": {"name": "leaky", "tags": ["vapo", PLAIN_KEY, f"run-{SK_KEY}"], "seed": 1}})
    channel, _ = resolve_channel(settings, config, env={})
    info = create_run(config, settings, tmp_path, channel_public=channel.public(), overrides=overrides,
                      run_id="r1")
    written = files_text(info.run_dir)
    assert not leaks(written + str(info.tags), HEX_KEY, ID_KEY, PLAIN_KEY, SK_KEY, "HdrSecret1234567890ab", *PASSWORDS)
    assert info.tags[0] == "vapo" and info.tags[1] == redact(PLAIN_KEY)
    meta = json.loads((info.run_dir / "run.json").read_text())
    assert "vapo.alpha=0.5" in meta["overrides"] and meta["tags"] == list(info.tags)
    _, frozen = load_run(info.run_dir)  # the redacted snapshot still validates
    assert frozen.vapo.alpha == 0.5 and frozen.api.base_url == "https://bob:***@gw.example/api"


# --- diagnose_error with keys that have no prefix ---------------------------------------------------------

B64 = base64.b64encode(f"user:{HEX_KEY}".encode()).decode()


@pytest.mark.parametrize("given", [
    {"status": 500, "body": f'{{"error": {{"message": "internal error", "key": "{HEX_KEY}"}}}}'},
    {"status": 401, "body": f'{{"error": {{"message": "Incorrect API key provided: {HEX_KEY}"}}}}'},
    {"status": 404, "body": f'{{"error": {{"message": "The model `{HEX_KEY}` does not exist"}}}}'},
    {"text": f"httpx.HTTPStatusError: Client error '401 Unauthorized' for url "
             f"'https://api.example/v1/models?key={HEX_KEY}'"},
    {"status": 403, "headers": [f"x-request-id: {HEX_KEY}", f"X-Goog-Api-Key: {HEX_KEY}"]},
    {"text": f"request headers: {{'Authorization': 'Basic {B64}', 'x-api-key': '{HEX_KEY[:24]}'}}"},
], ids=["json-key-field", "api-key-provided", "as-model-id", "url-query", "headers", "basic-auth"])
def test_diagnose_error_redacts_keys_without_a_prefix(given):
    diagnosis = diagnose_error(**given).model_dump_json()
    evidence = gather_evidence(**given).model_dump_json()
    assert not leaks(diagnosis + evidence, HEX_KEY, HEX_KEY[:24])
    assert "…" in evidence


def test_redact_tokens_keeps_ordinary_tags_and_values():
    assert redact_tokens("vapo") == "vapo" and redact_tokens("abl-1a2b3c4d") == "abl-1a2b3c4d"
    assert redact_tokens(f"tag {HEX_KEY} x") == f"tag {redact(HEX_KEY)} x"


@pytest.mark.parametrize("name", ["builtin:chain@v9", "builtin:chain@planted-stop", "builtin:chain@v1",
                                  "org:model@v1.2"])
def test_a_model_name_with_an_at_tag_is_not_taken_for_url_credentials(name):
    """`x:y@tag` is a model's name (the built-in ones are `builtin:<task>@<variant>`), not `user:pass@host`."""
    assert scrub(f"model {name} is not built") == f"model {name} is not built"
    assert redact_tokens(f"unknown model '{name}'") == f"unknown model '{name}'"


@pytest.mark.parametrize("raw, shown", [
    ("https://bob:hunter2@gw.example/v1", "https://bob:***@gw.example/v1"),
    ("postgres://bob:hunter2@db/x", "postgres://bob:***@db/x"),
    ("(bob:hunter2@db.local)", "(bob:***@db.local)"),
    ("bob:hunter2@10.0.0.7", "bob:***@10.0.0.7"),
    ("bob:hunter2@dbhost:5432", "bob:***@dbhost:5432"),
    ("bob:hunter2@localhost", "bob:***@localhost"),
    ("builtin:chain@v9 then https://bob:hunter2@h/x", "builtin:chain@v9 then https://bob:***@h/x"),
])
def test_real_url_credentials_are_still_masked(raw, shown):
    assert scrub(raw) == shown


@pytest.mark.anyio
async def test_run_status_scrubs_the_log_tail(proj, capsys):
    """A worker log can hold the key (a provider echoing it, a traceback with headers): run_status — the tool and
    `vapo-mcp runs status` — returns it scrubbed, like the vapo://runs resources."""
    from mcp import Client

    from server.app import build_server
    from tests.fake_openai import CANARY
    from tests.mcp_helpers import slot_held, text
    from tools import training
    from tools.paths import files
    other = "sk-proj-Q9w8E7r6T5y4U3i2O1p0A9s8D7f6"
    with slot_held(proj / "logs"):
        rid = training.start_training(files(), preset="cpu-demo").run.run_id
        rd = training.views_for(files()).get(rid).rundir
        rd.file("worker.log").write_text(f"step 1\nError code: 401 - Incorrect API key {CANARY}\n"
                                         f"Authorization: Bearer {other}\nproxy https://bob:hunter22pass@proxy.lan:3128\n")
        async with Client(build_server()) as c:
            res = await c.call_tool("run_status", {"run_id": rid, "log_lines": 10})
        out = text(res) + json.dumps(res.structured_content)
        assert not res.is_error and "Incorrect API key" in out and "step 1" in out, out
        assert CANARY not in out and other not in out and "hunter22pass" not in out, out
        assert main(["runs", "status", rid]) == 0
        printed = capsys.readouterr().out
        assert "Incorrect API key" in printed and CANARY not in printed and other not in printed
