"""Registry of estimators/losses, and the module contract: torch + stdlib only, documented, small."""
from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest
import torch

from vapo_engine import algo
from vapo_engine.algo import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    compute_gae,
    decoupled_gae,
    get_advantage_estimator,
    get_policy_loss,
    grpo_advantages,
    policy_loss_clip_higher,
)

ALGO_DIR = Path(algo.__file__).parent


def batch():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)
    rewards = torch.zeros(4, 4)
    rewards[0, 2], rewards[2, 3] = 1.0, 1.0
    values = torch.tensor([[0.2, 0.4, 0.6, 9.0], [0.1, 0.3, 7.0, 7.0], [0.5, 0.5, 0.5, 0.5], [0.3, 1, 1, 1]])
    return {"token_rewards": rewards, "values": values, "mask": mask,
            "scores": torch.tensor([1.0, 0.0, 1.0, 0.0]), "group_size": 2, "lam_policy": 0.6,
            "lam_critic": 1.0, "gamma": 1.0}


def test_registry_names_and_lookup():
    assert set(ADVANTAGE_ESTIMATORS) == {"decoupled_gae", "gae", "grpo"}
    assert set(POLICY_LOSSES) == {"clip_higher", "ppo_clip", "none"}
    assert get_policy_loss("clip_higher") is policy_loss_clip_higher
    for name in ADVANTAGE_ESTIMATORS:
        assert get_advantage_estimator(name) is ADVANTAGE_ESTIMATORS[name]


@pytest.mark.parametrize("getter,valid", [(get_advantage_estimator, ["decoupled_gae", "gae", "grpo"]),
                                          (get_policy_loss, ["clip_higher", "none", "ppo_clip"])])
def test_unknown_name_error_lists_valid_names(getter, valid):
    for exc in (KeyError, ValueError):
        with pytest.raises(exc) as info:
            getter("vapo_magic")
        message = str(info.value)
        assert "vapo_magic" in message and all(name in message for name in valid)
        assert not message.startswith("'")


def test_all_estimators_share_one_keyword_signature():
    expected = ["token_rewards", "values", "mask", "scores", "group_size", "lam_policy", "lam_critic", "gamma"]
    for fn in ADVANTAGE_ESTIMATORS.values():
        params = inspect.signature(fn).parameters.values()
        assert [p.name for p in params] == expected
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    sig = inspect.signature(policy_loss_clip_higher)
    assert all(inspect.signature(fn) == sig for fn in POLICY_LOSSES.values())


def test_estimators_compute_what_their_names_say():
    kw = batch()
    adv, ret = get_advantage_estimator("decoupled_gae")(**kw)
    ref = decoupled_gae(kw["token_rewards"], kw["values"], kw["mask"], lam_policy=0.6, lam_critic=1.0)
    assert torch.equal(adv, ref[0]) and torch.equal(ret, ref[1])
    adv_g, ret_g = get_advantage_estimator("gae")(**kw)  # vanilla PPO: λ_policy for both
    ref_g = compute_gae(kw["token_rewards"], kw["values"], kw["mask"], lam=0.6)
    assert torch.equal(adv_g, ref_g[0]) and torch.equal(ret_g, ref_g[1])
    assert not torch.allclose(ret_g, ret)
    adv_r, ret_r = get_advantage_estimator("grpo")(**kw)
    assert ret_r is None and torch.equal(adv_r, grpo_advantages(kw["scores"], kw["mask"], 2))
    adv_r2, _ = get_advantage_estimator("grpo")(**{**kw, "scores": None, "values": None})
    assert torch.equal(adv_r2, adv_r)  # scores default to the summed token rewards
    with pytest.raises(ValueError, match="values"):
        get_advantage_estimator("decoupled_gae")(**{**kw, "values": None})


def test_per_sequence_lambda_passes_through_the_registry():
    kw = batch()
    lam = torch.tensor([0.0, 0.5, 0.9, 1.0])
    adv, _ = get_advantage_estimator("decoupled_gae")(**{**kw, "lam_policy": lam})
    for b in range(4):
        row, _ = compute_gae(kw["token_rewards"][b:b + 1], kw["values"][b:b + 1], kw["mask"][b:b + 1],
                             lam=float(lam[b]))
        assert torch.equal(adv[b:b + 1], row)


def _module_files():
    return sorted(ALGO_DIR.glob("*.py"))


def test_algo_imports_only_torch_and_the_standard_library():
    """... and the project's one registry helper (dependency-free: vapo_engine/registry.py)."""
    allowed = set(sys.stdlib_module_names) | {"torch"}
    for path in _module_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "vapo_engine.registry":
                continue
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            else:
                continue
            assert set(roots) <= allowed, f"{path.name} imports {roots}"


def test_every_public_function_documents_shapes_and_the_equation():
    for name in algo.__all__:
        obj = getattr(algo, name)
        if inspect.isfunction(obj):
            doc = inspect.getdoc(obj) or ""
            assert "Shapes:" in doc and "Implements:" in doc, name


def test_files_and_functions_stay_small():
    for path in _module_files():
        source = path.read_text()
        assert len(source.splitlines()) <= 400, path.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef):
                assert node.end_lineno - node.lineno + 1 <= 60, f"{path.name}:{node.name}"
