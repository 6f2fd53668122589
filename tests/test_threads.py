"""The worker's thread environment (vapo_engine/jobs/threads.py): a run with the cores to itself gets every
core and OpenMP's default (spinning) wait; passive waiting and a split budget only where runs can share cores."""
from __future__ import annotations

from vapo_engine.jobs.threads import MAX_CONCURRENT_ENV, shares_cores, usable_cores, worker_env

CLEAN = {"PATH": "/usr/bin"}


def test_a_run_alone_gets_every_core_and_the_default_wait():
    env = worker_env(nprocs=1, base=dict(CLEAN))
    assert env["OMP_NUM_THREADS"] == str(usable_cores())
    assert "OMP_WAIT_POLICY" not in env


def test_concurrent_runs_split_the_cores_and_wait_passively():
    env = worker_env(nprocs=1, base=dict(CLEAN, **{MAX_CONCURRENT_ENV: "2"}))
    assert env["OMP_NUM_THREADS"] == str(max(1, usable_cores() // 2))
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_more_processes_than_cores_wait_passively():
    env = worker_env(nprocs=usable_cores() + 1, base=dict(CLEAN))
    assert env["OMP_NUM_THREADS"] == "1" and env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_the_users_values_win():
    env = worker_env(base=dict(CLEAN, OMP_NUM_THREADS="7", OMP_WAIT_POLICY="ACTIVE"))
    assert env["OMP_NUM_THREADS"] == "7" and env["OMP_WAIT_POLICY"] == "ACTIVE"
    # more threads than cores set by the user: their threads share cores, so waiting is passive
    env = worker_env(base=dict(CLEAN, OMP_NUM_THREADS=str(usable_cores() + 1)))
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_shares_cores():
    assert not shares_cores(1, 1, 2, cores=2)
    assert not shares_cores(2, 1, 1, cores=2)
    assert shares_cores(1, 2, 1, cores=2)
    assert shares_cores(2, 1, 2, cores=2)
