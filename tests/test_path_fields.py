"""Every path field of config.toml is confined for HTTP clients (tools.access over vapo_engine/config/path_fields.py,
docs/security.md). The reproduction: `critic.model_path` escaped the confinement — over HTTP a run loaded a model
from outside the allowed roots, the answer told whether a path existed, and a Hub-shaped value (`Org/model`) made
the worker fetch from the Hub. Now the path fields are listed once (every field typed PathText) and each is
checked; a relative value is frozen to an absolute path under the project, never a Hub id."""
from __future__ import annotations

import json

import pytest
from mcp import Client

from tests.mcp_helpers import slot_held, text

pytestmark = pytest.mark.anyio
PATH_LIKE = ("_path", "_dir", "_file", "_root")
FIELDS = ("model.local_path", "model.value_path", "data.train", "data.data_dir", "eval.benchmark", "critic.model_path",
          "rollout.weights_dir")
SPECS = ("data.train", "eval.benchmark")


def test_every_field_that_names_a_path_is_typed_as_one():
    """A field whose name says path must be typed PathText, or path_fields() (and with it every check) misses it."""
    from vapo_engine.config import TrainConfig
    from vapo_engine.config.path_fields import TASK_SPECS, path_fields
    named = [f"{s}.{n}" for s, info in TrainConfig.model_fields.items() for n in info.annotation.model_fields
             if n.endswith(PATH_LIKE)]
    assert set(named) <= set(path_fields()), set(named) - set(path_fields())
    assert path_fields() == FIELDS and TASK_SPECS == SPECS  # a new one: add it to FIELDS, the test below covers it


async def test_every_path_field_is_confined_for_http_clients(proj, tmp_path):
    from server.app import build_server
    from tools.access import Policy
    outside = tmp_path / "outside"
    (outside / "model").mkdir(parents=True)
    (outside / "model" / "config.json").write_text("{}")
    with slot_held(proj / "logs"):
        async with Client(build_server(Policy("http"))) as c:
            for key in FIELDS:
                answers = []
                for target in (outside / "model", outside / "missing"):  # one exists, one does not
                    value = f"{target}.jsonl" if key in SPECS else str(target)
                    res = await c.call_tool("start_training", {"preset": "cpu-demo",
                                                               "overrides": [f"{key}={json.dumps(value)}"]})
                    assert res.is_error and "outside the allowed roots" in text(res), (key, text(res)[:300])
                    assert str(tmp_path) not in text(res).replace(value, "") and str(proj) not in text(res)
                    answers.append(text(res).replace(value, "PATH"))
                assert answers[0] == answers[1], key  # the same refusal whether or not the path exists


async def test_a_hub_shaped_critic_path_stays_a_local_folder(proj):
    from server.app import build_server
    from tools.access import Policy
    with slot_held(proj / "logs"):
        async with Client(build_server(Policy("http"))) as c:
            res = await c.call_tool("start_training", {"preset": "cpu-demo",
                                                       "overrides": ['critic.model_path="Org/some-model"']})
            assert not res.is_error, text(res)
            run_dir = res.structured_content["run"]["run_dir"]
    frozen = json.loads((proj / "logs").joinpath(run_dir).joinpath("config.json").read_text())
    assert frozen["critic"]["model_path"] == str(proj.resolve() / "Org" / "some-model")
