"""GRPO on multi-turn calculator episodes: the model calls a tool, then answers.

  prompt "Q:7*(12+34)\n" -> episode "T:12+34=" [46;] "T:7*46=" [322;] "A:322."

Bracketed text is the calculator environment's observation (grpo_jax/envs/calculator.py):
in the context, never trained. Reward 1 when the final answer is the expression's value.
Problems nest two + or * operations on 1-2 digit operands (grpo_jax/tasks/calculator.py).

Command (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/calculator.py:tiny --workdir=/tmp/calculator

Variants:
  tiny (default): a ~0.3M-parameter Qwen3-shaped model, 200 supervised warm-start steps
    on reference transcripts, then 200 GRPO iterations of 32 prompts x G=8 episodes (at
    most 4 actions of at most 12 tokens, observations of at most 8 tokens, 40 tokens per
    episode in all).
  full: a ~40M-parameter model, three nested operations, 64 prompts x G=8 (not measured:
    hours on CPU).
  quick: tiny on a 1-layer, d_model 32 model (`config.QUICK_MODEL`), for tests and smoke
    runs.
  openenv: tiny with the calculator served by an OpenEnv server, one WebSocket session
    per episode (`grpo_jax/envs/openenv_env.py`; `pip install -e ".[openenv]"`). Start
    the server first, in another shell:
      python -m grpo_jax.envs.openenv_calculator --port 8000
      grpo-jax --config=configs/calculator.py:openenv --workdir=/tmp/calculator_openenv
    The same rules over the network: the same seed trains to the same numbers as tiny
    (tests/envs/test_openenv.py checks it bit for bit); another server is
    `--config.env.kwargs.url=http://host:port`.
  verifiers: tiny with the calculator as a verifiers environment (`pip install -e
    ".[verifiers]"`; grpo_jax/envs/vf_calculator.py, a `verifiers.MultiTurnEnv` with the
    same rules): task "vf:grpo_jax.envs.vf_calculator" draws its dataset's rows (4,096
    training problems, 256 held out), and each episode is the environment's own rollout,
    its rubric's reward the episode's (grpo_jax/envs/vf_env.py). Another verifiers
    environment: `--config.task.name=vf:<module>` with its load_environment arguments in
    config.task.kwargs.env_args. Measured (seed 0, 2026-12-05, 2-core AMD EPYC, quiet;
    experiments/results/verifiers/calculator_tiny.md): 89.1% after the warm start -> 96.9%
    after GRPO (+7.8 points, 128 held-out problems; 100% at iteration 175), 1.76 s per
    iteration against 0.83 s with the same rows in process (the adapter: 0.89 s of
    environment time per iteration of 256 episodes), every untimed metric identical. The
    warm start's 12,800 draws are three epochs of the 4,096 rows, which this tiny model fits
    far better than tiny's fresh problems (38.3% with tiny's stream; 14.8% with 16,384
    rows, no repeats): the two variants' figures are not comparable.

Expected result (tiny, measured on a 2-core CPU shared with other jobs, load average 4-6):
greedy accuracy on 128 held-out problems goes from 36.7% after the warm start to 60.2%
after GRPO (+23.4 points; 43.0% at iteration 50, 48.4% at 100, 51.6% at 150), in 365 s
wall (1.5 s per iteration: 0.30 s in the jitted turns of the 256 episodes, 0.01 s in the
environment's steps, 1.2 s prepare and update). Episodes take 2.98 actions on average and
99.8% are ended by the environment (an answer line, or an action it cannot read). At 80 iterations (tests/envs/test_episodes.py) it is 47.7% (+10.9), and
the same run trained on -A collapses to 0.0%. Float rounding differs between CPU models,
and so may the trajectory. summary.json holds warmstart_accuracy, final_accuracy,
wall_seconds.
"""

from grpo_jax import config
from grpo_jax.rl import presets

VARIANTS = ("tiny", "full", "quick", "openenv", "verifiers")
OPENENV_URL = "http://127.0.0.1:8000"  # `python -m grpo_jax.envs.openenv_calculator`.


def get_config(arg: str = "tiny"):
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/calculator.py variant {arg!r}; allowed: {', '.join(map(repr, VARIANTS))}."
    )
  c = config.default_config()
  c.task.name = "calculator"
  c.task.kwargs = dict(steps=2, ops="+*", max_digits=2)
  c.env.update(name="calculator", max_turns=4, turn_tokens=12, observation_tokens=8)
  c.model.update(d_model=96, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=24, mlp_dim=288)
  c.model.qk_norm = True
  c.sampler.update(max_new_tokens=40, group_size=8, max_prompt_len=16, prompt_buckets=(16,))
  c.rl.update(presets.get("grpo"))
  c.rl.kl_coef = 0.0
  c.rl.aggregation = "token_mean"
  c.update(prompts_per_step=32, iterations=200, learning_rate=3e-4, grad_clip=1.0)
  c.update(warmstart_steps=200, warmstart_batch=64, warmstart_lr=3e-3)
  c.update(eval_every=25, eval_size=128, eval_samples=0, checkpoint_every=50)
  if arg == "quick":
    c.model.update(config.QUICK_MODEL)
  if arg == "openenv":
    c.env.update(name="openenv", kwargs=dict(url=OPENENV_URL, stop_text=("=",)))
  if arg == "verifiers":
    c.task.name = "vf:grpo_jax.envs.vf_calculator"
    c.task.kwargs = dict(env_args=dict(steps=2, ops="+*", max_digits=2))
    c.env.update(name="verifiers", kwargs=dict(stop_text=("=",)))
  if arg == "full":
    c.task.kwargs.update(steps=3)
    c.env.update(max_turns=5)
    c.model.update(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=64, mlp_dim=1536)
    c.sampler.update(max_new_tokens=64, max_prompt_len=24, prompt_buckets=(24,))
    c.update(prompts_per_step=64, learning_rate=1e-5, warmstart_steps=1000, warmstart_lr=3e-4)
  return c
