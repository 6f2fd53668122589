"""The recipes of the built-in tiny models: what each cached build is (model size, warm-start phases, stopping
bands), by name. Torch-free, so the config checker can name the valid built-in models; `build.py` builds them.

Names are `builtin:<task>` (the model a run on that task starts from by default) and `builtin:<task>@<variant>`
(other models of the task: earlier versions a recipe starts from, or a demo's deliberately different start,
chosen with `model.builtin`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

BUILTIN_VERSION = 1
"""Bump whenever the tokenizer, architecture or an SFT recipe changes: it is part of the cache folder name."""
@dataclasses.dataclass(frozen=True)
class Phase:
    """A further warm-start phase (after phases 1-2, or after the `start` model): SFT on the task's RL
    distribution with its own learning rate and stopping band, from the task's reference, from a teacher that
    stops after `teacher_lines` lines (`teacher.StopEarlyTeacher`; its band then measures answers given the
    teacher's way), or from one whose lines copy the sign wrong with probability `noise` each
    (`teacher.NoisyTeacher`; its band measures true answers)."""

    name: str
    max_steps: int
    lr: float
    target: tuple[float, float]
    val_buckets: tuple[str, ...] = ()
    eval_every: int = 20
    seed: int = 0
    warmup_steps: int = 20
    teacher_lines: int = 0
    noise: float = 0.0


@dataclasses.dataclass(frozen=True)
class BuildRecipe:
    """Everything that determines a built-in model; values other than the task's recipe in `RECIPES` get
    their own cache folder."""

    seed: int = 0
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    task: str = "builtin:addition"
    max_steps: int = 2000
    batch_size: int = 32
    lr: float = 2e-3
    eval_every: int = 25
    val_size: int = 256
    target_greedy: tuple[float, float] = (0.60, 0.75)
    """Stop at >= the lower bound of greedy accuracy on the validation draw (the warm-start RL needs)."""
    report_size: int = 500
    length_buckets: bool = False
    """Batch problems of similar length together (for tasks whose answers vary in length)."""
    val_buckets: tuple[str, ...] = ()
    """Difficulty buckets of the validation draw that the stopping rule looks at (all when empty)."""
    phase2_max_steps: int = 0
    """A second warm-start phase on the RL distribution (`task.train_batch`) of at most this many steps; 0 = none."""
    phase2_val_buckets: tuple[str, ...] = ()
    """Buckets the second phase's stopping rule looks at."""
    phase2_target: tuple[float, float] = (0.10, 0.20)
    """The second phase stops once greedy accuracy on its buckets reaches the lower bound."""
    phase2_eval_every: int = 20
    """Validation interval of the second phase (fine: accuracy on long chains can jump within 100 steps)."""
    num_threads: int = 0
    """torch threads during the build (0 = all available cores); restored afterwards."""
    version: int = BUILTIN_VERSION
    """Part of the folder name: a task's recipe that changes what it builds gets a new version."""
    start: str = ""
    """Key in `RECIPES` of a model this one continues (built and cached first): phases 1-2 are then skipped."""
    phases: tuple[Phase, ...] = ()
    """Further phases, run in order after phases 1-2 (or on the `start` model)."""

    def folder_name(self) -> str:
        base = next((r for r in RECIPES.values() if (r.task, r.version) == (self.task, self.version)),
                    None) or BuildRecipe(task=self.task, version=self.version)
        changed = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) != getattr(base, f.name) and f.name != "num_threads"}
        name = f"tiny-{self.task.removeprefix('builtin:')}-v{self.version}"
        if not changed:
            return name
        return name + "-" + hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:10]

    def identity(self) -> dict:
        """What determines the built model: every field but `num_threads`, and the start model's hash (a
        changed start changes every model built on it)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "num_threads"}
        return fields | ({"start_hash": RECIPES[self.start].recipe_hash()} if self.start else {})

    def recipe_hash(self) -> str:
        """sha256 of `identity()` as canonical JSON (sorted keys, no spaces): recorded in every build and beside
        every shipped model, so a folder built from another recipe is never taken for this one."""
        text = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


_CHAIN_V1 = BuildRecipe(task="builtin:chain", max_steps=3000, eval_every=100, val_size=96, target_greedy=(0.95, 1.0),
                        val_buckets=("short",), report_size=140, length_buckets=True, phase2_max_steps=3000,
                        phase2_val_buckets=("long",), phase2_target=(0.10, 0.20))
_PLANTED_STOP = BuildRecipe(
    task="builtin:chain", version=2, start="builtin:chain@v1", val_size=96, report_size=140, length_buckets=True,
    phases=(Phase("solve", max_steps=900, lr=2e-4, target=(0.85, 1.0), val_buckets=("long",), eval_every=50, seed=11),
            Phase("stop_early", max_steps=600, lr=2e-4, target=(0.85, 1.0), val_buckets=("long",), eval_every=10,
                  seed=12, warmup_steps=5, teacher_lines=8)))
RECIPES: dict[str, BuildRecipe] = {
    "builtin:addition": BuildRecipe(),
    "builtin:chain@v1": _CHAIN_V1,
    "builtin:chain@planted-stop": _PLANTED_STOP,
    "builtin:chain": BuildRecipe(
        task="builtin:chain", version=3, start="builtin:chain@v1", val_size=96, report_size=140, length_buckets=True,
        phases=(Phase("noisy", max_steps=900, lr=2e-4, target=(0.85, 1.0), val_buckets=("long",), eval_every=50,
                      seed=21, noise=0.1),)),
    "builtin:crates": BuildRecipe(task="builtin:crates", max_steps=1500, eval_every=500, val_size=64,
                                  target_greedy=(0.99, 1.0), report_size=200),
}
"""The recipe of each built-in model (see the module docstring for the names).

- `builtin:chain@v1`: mostly short chains until short ones are solved (≥ 95% greedy), then the RL distribution
  until long chains reach 10% greedy. Its long end fails on a skill (reading a sign from far back in a long
  prompt, bench/experiments/chain_lookup.py) that 160 RL steps did not teach while 200 supervised steps did.
- `builtin:chain` (v3, the default chain model): v1 continued on the RL distribution with a *noisy* teacher
  (`teacher.NoisyTeacher`, p = 0.1: each line's sign copied wrong with probability 0.1) until the greedy answer to
  long chains is right (≥ 85% on the validation draw). Its deficit is deliberate and stated: the right sign is
  the likely one on every line, the wrong one keeps ~10% of the mass, so sampled answers fail at random lines —
  more often the longer the chain — and RL has to push that error rate down, with a critic that can see each
  mistake in the line where it is made.
- `builtin:chain@planted-stop` (v2): v1 continued until long chains are solved (≥ 85% greedy), then taught by a
  teacher that stops after 8 lines (`teacher.StopEarlyTeacher`) until it answers 85% of long chains that way: a
  planted early stop that RL recovers by flipping one decision at a fixed position (the "recovering a planted
  early stop" demo, preset chain-planted-stop).
"""
