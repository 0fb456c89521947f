"""Held-out evaluation: greedy accuracy, and pass@k / mean@k from n samples per problem.

    out = heldout.evaluate(setup, fns, pool, params, key=key)   # the trainer's eval phase
    out, shown = heldout.run(setup, fns, pool, params, key=key)  # + a few greedy samples
    heldout.pass_at_k(n, c_P, k), heldout.mean_at_k(correct_PK)   # the estimators

Notation: a problem has n sampled completions, c of them correct; k <= n.
"""

from __future__ import annotations

import numpy as np

from grpo_jax.envs import episodes
from grpo_jax.infra import distributed
from grpo_jax.models import sampling
from grpo_jax.trainer import build, rollout
from grpo_jax.verifiers import verdicts

# Held-out problems whose greedy completions each evaluation shows (workdir/samples.jsonl
# and TensorBoard's text tab): the first ones, so every evaluation shows the same prompts.
SAMPLES = 4


def _as_counts(name: str, x) -> np.ndarray:
  x = np.asarray(x)
  if x.dtype == bool or not np.issubdtype(x.dtype, np.number):
    raise ValueError(f"{name} must be integer counts, got dtype {x.dtype}.")
  if np.any(x < 0) or np.any(x != np.floor(x)):
    raise ValueError(f"{name} must be non-negative integers, got {x}.")
  return x.astype(np.int64)


def pass_at_k(num_samples_n, num_correct_c, k: int) -> np.ndarray:
  """Unbiased pass@k per problem, the chance that k of the n samples hold a correct one.

      pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i)

  (1 when n − c < k: every k-subset then holds a correct sample). The product form avoids
  the huge binomials. Averaging it over problems estimates the benchmark pass@k without
  the bias of 1 − (1 − c/n)^k. pass@1 = c/n.

  Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (arXiv
  2107.03374), eq. 1 and its numpy estimator (Fig. 3).

  Args:
    num_samples_n: n per problem (int or int array).
    num_correct_c: c per problem, 0 <= c <= n (broadcasts against n).
    k: the budget, 1 <= k <= n for every problem.

  Returns:
    float64 array of the broadcast shape of n and c: pass@k per problem (caller averages).
  """
  n = _as_counts("num_samples_n", num_samples_n)
  c = _as_counts("num_correct_c", num_correct_c)
  n, c = np.broadcast_arrays(n, c)
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"k must be an integer >= 1, got {k!r}.")
  if np.any(c > n):
    raise ValueError(f"num_correct_c must be <= num_samples_n, got c={c}, n={n}.")
  if np.any(k > n):
    raise ValueError(f"k={k} exceeds num_samples_n={n}: pass@k needs k <= n samples.")
  # Column j of the grid is factor i = n − j, j = 0 .. c−1; unused cells are 1.
  j_J = np.arange(int(c.max(initial=0)))
  i_PJ = n[..., None] - j_J
  factor_PJ = np.where(j_J < c[..., None], 1.0 - k / np.maximum(i_PJ, 1), 1.0)
  return np.where(n - c < k, 1.0, 1.0 - np.prod(factor_PJ, axis=-1))


def mean_at_k(correct_PK) -> float:
  """mean@k: accuracy averaged over k samples per problem, then over the P problems.

      mean@k = (1/P) Σ_p (1/k) Σ_j r_pj

  with r_pj in [0, 1] the correctness of sample j of problem p (K = k samples each). It
  estimates the expected single-sample accuracy, E[r], with less variance than one sample
  per problem; for binary r it is the mean over problems of pass_at_k(k, c_p, 1) = c_p/k.

  Source: DeepSeek-R1 (arXiv 2501.12948, §3.1), which reports it as
  pass@1 = (1/k) Σ_i p_i over k samples; DAPO (arXiv 2503.14476) names it avg@32.
  """
  correct_PK = np.asarray(correct_PK, np.float64)
  if correct_PK.ndim != 2 or correct_PK.size == 0:
    raise ValueError(f"correct_PK must be a non-empty [P, K] array, got shape {correct_PK.shape}.")
  return float(correct_PK.mean(axis=1).mean())


# The bootstrap of `interval`: resamples and their seed (reported with each eval table).
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def interval(values_P, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED):
  """(mean, [low, high]): the mean over problems and its 95% percentile-bootstrap interval
  (`resamples` resamplings of the problems, seeded: the same values give the same
  interval). The eval command's figures (`eval_figures`) and the trainer's
  eval/greedy_accuracy_low/high use it.

  A task that draws its problems (`Task.problem_key`) can draw one twice: 128 held-out
  word problems of configs/smollm2.py hold 72-79 distinct ones. That needs no correction
  here. The draws are independent draws from the task's problem distribution, so the mean
  over them estimates the accuracy on a problem drawn from it with variance Var(r)/P, copies
  included, and resampling the draws is the right bootstrap. Resampling distinct problems
  with their copies (a cluster bootstrap) would not be: on a 150-problem population drawn
  128 times, 400 times over, this interval covered the truth 95.3% of the time and the
  cluster one 99.5%, 48% wider (tests/trainer/test_eval_figures.py keeps that property). What repeats
  cost is precision: eval/distinct_problems says how many problems a run really saw."""
  v = np.asarray(values_P, np.float64)
  if v.ndim != 1 or v.size == 0:
    raise ValueError(f"values_P must be a non-empty [P] array, got shape {v.shape}.")
  mean = float(v.mean())
  if v.size == 1:
    return mean, [mean, mean]
  idx = np.random.default_rng(seed).integers(0, v.size, (resamples, v.size))
  means = v[idx].mean(axis=1)
  low, high = np.percentile(means, [2.5, 97.5])
  return mean, [float(low), float(high)]


def distinct(groups_P) -> int:
  """How many distinct problems `groups_P` (one key per scored problem) holds."""
  return len(set(map(str, groups_P)))


def pass_ks(n: int) -> list[int]:
  """1, 2, 4, ... up to n, and n itself: the k of the logged eval/pass@k."""
  ks = [1 << i for i in range(n.bit_length()) if (1 << i) <= n]
  return ks + ([n] if ks[-1] != n else [])


def evaluate(setup: build.Setup, fns, pool, params, *, key) -> dict:
  """Held-out metrics on the first eval_size test problems, scored through `pool`.

  Greedy decoding gives eval/greedy_accuracy and eval/format_rate. With eval_samples = n
  > 0, n samples per problem (the training sampling params) give the unbiased pass@k for
  k = 1, 2, 4, ..., n (`pass_at_k`) and mean@n (`mean_at_k`).
  """
  return run(setup, fns, pool, params, key=key, show=0)[0]


def run(setup: build.Setup, fns, pool, params, *, key, show: int = SAMPLES):
  """(`evaluate`'s metrics, the first `show` held-out problems' greedy completions as
  `sample_records`)."""
  task, loop = setup.task, setup.loop
  n, size = loop.eval_samples, loop.eval_size
  rows = set(rollout.needed_rows(fns, size, 1))
  rows |= set(rollout.needed_rows(fns, size, n)) if n else set()
  keyed = {
    i: task.keyed_example("test", i, seed=loop.seed) for i in sorted(rows | set(range(size)))
  }
  examples = {i: keyed[i][1] for i in sorted(rows)}
  keys_P = [keyed[i][0] for i in range(size)]  # Every problem's, for the distinct count.
  prompts = rollout.host_prompts(setup, fns, examples, size)
  if setup.episodes is not None:
    listed = [examples.get(i) for i in range(size)]  # None: another process's problem.
    return evaluate_episodes(setup, fns, params, listed, prompts, key, keys_P=keys_P, show=show)
  greedy = fns.samplers.greedy(params, prompts, key, sampling.sampling_params(greedy=True))
  if n:  # Dispatched now: the device samples while the host scores the greedy answers.
    sampled = fns.samplers.eval(params, prompts, key, setup.sampling_hyper)
  scores = rollout.score(setup, pool, examples, greedy.tokens_NT, group=1)

  def more():
    scored = rollout.score(setup, pool, examples, sampled.tokens_NT, group=n)
    return scored.correct_N.reshape(size, n), scored.errors

  return _metrics(
    setup,
    examples,
    greedy.tokens_NT,
    reward_N=scores.correct_N,
    format_N=scores.format_N,
    scorable_N=scores.scorable_N,
    errors=scores.errors,
    messages=scores.messages,
    where="the held-out greedy evaluation",
    sampled=more if n else None,
    keys_P=keys_P,
    show=show,
  )


def _metrics(
  setup,
  examples,
  tokens_NT,
  *,
  reward_N,
  format_N,
  scorable_N,
  errors,
  messages,
  where,
  sampled,
  keys_P,
  show,
):
  """(metrics, shown) of one evaluation, single-turn or episodes: stop if too many greedy
  rows were unscorable (`verdicts.check_failures`), eval/greedy_accuracy (mean reward)
  with its 95% percentile-bootstrap interval over the eval/problems problems (`interval`,
  as `grpo-jax eval` reports it), of which eval/distinct_problems are distinct (keys_P,
  each problem's `Task.problem_key`), eval/format_rate, eval/reward_errors, the
  first `show` greedy rows (`sample_records`); and with `sampled` (a callable ->
  (correctness [P, n], errors), called last, so the device keeps sampling while the
  greedy rows are scored) pass@k and mean@n."""
  verdicts.check_failures(~scorable_N, messages, limit=setup.loop.max_unscorable_frac, where=where)
  accuracy, (low, high) = interval(reward_N)
  out = {
    "eval/greedy_accuracy": accuracy,
    "eval/greedy_accuracy_low": low,
    "eval/greedy_accuracy_high": high,
    "eval/problems": int(np.size(reward_N)),
    "eval/distinct_problems": distinct(keys_P),
    "eval/format_rate": float(format_N.mean()),
    "eval/reward_errors": errors,
  }
  shown = sample_records(
    setup.tokenizer,
    examples,
    tokens_NT,
    reward_N=reward_N,
    format_N=format_N,
    scorable_N=scorable_N,
    show=show,
  )
  if sampled is not None:
    correct_PK, more_errors = sampled()
    out.update(sampled_metrics(correct_PK))
    out["eval/reward_errors"] += more_errors
  return out, shown


def verdict(reward: float, format_reward: float, scorable: bool) -> str:
  """A row's verdict in a word: correct (reward 1), partial, wrong, wrong format (not even
  the answer template), unscorable (the reward could not be computed)."""
  if not scorable:
    return "unscorable"
  if reward >= 1.0:
    return "correct"
  if reward > 0.0:
    return "partial"
  return "wrong" if format_reward > 0.0 else "wrong format"


def sample_records(
  tok, examples: dict, tokens_NT, *, reward_N, format_N, scorable_N, show: int
) -> list[dict]:
  """The first `show` held-out rows this process holds (one per problem): prompt,
  completion (decoded), answer, reward, format reward and `verdict`."""
  if not show:
    return []
  if isinstance(tokens_NT, np.ndarray):  # Episodes' tokens come back to the host.
    rows, local = slice(0, len(tokens_NT)), tokens_NT[:show]
  else:
    rows = distributed.local_rows(tokens_NT.sharding, tokens_NT.shape[0])
    local = distributed.fetch_local(tokens_NT)[:show]
  out = []
  for i, ids in zip(range(rows.start, rows.stop), local):
    r, f, ok = float(reward_N[i]), float(format_N[i]), bool(scorable_N[i])
    e = examples[i]
    out.append(
      dict(
        kind="eval", index=i, prompt=e.prompt, completion=tok.decode(ids), answer=e.answer,
        reward=r, format_reward=f, verdict=verdict(r, f, ok),
      )
    )  # fmt: skip
  return out


def training_rows(setup: build.Setup, got: rollout.Collected, batch, *, groups: int) -> list[dict]:
  """The first `groups` groups of a training batch as rows to show ("kind": "train"):
  prompt and completion (decoded), reward and format reward (the verifier's), advantage
  (the mean over the row's loss tokens: a sequence-level estimator's A_i; a per-token
  one's row mean) and `verdict`. This process's rows only (the primary holds group 0);
  none when the batch's rows are not the scored rows (IBPO's counterfactual rows)."""
  s, G = got.scores, setup.train_group
  rows = distributed.local_rows(got.rollouts.tokens_NT.sharding, got.rollouts.tokens_NT.shape[0])
  if batch.adv_NT.shape[0] != got.rollouts.tokens_NT.shape[0] or rows.start != 0:
    return []
  n = min(groups * G, rows.stop, len(s.completions))  # rows.start is 0.
  prompts_NP = distributed.fetch_local(got.rollouts.prompt_tokens_NP)[:n]
  adv_NT, m_NT = (distributed.fetch_local(x)[:n] for x in (batch.adv_NT, batch.loss_mask_NT))
  adv_N = (adv_NT * m_NT).sum(1) / np.maximum(m_NT.sum(1), 1)
  out = []
  for i in range(n):
    r, f, ok = float(s.correct_N[i]), float(s.format_N[i]), bool(s.scorable_N[i])
    out.append(
      dict(
        kind="train", group=i // G, prompt=setup.tokenizer.decode(prompts_NP[i]),
        completion=s.completions[i], reward=r, format_reward=f, advantage=float(adv_N[i]),
        verdict=verdict(r, f, ok),
      )
    )  # fmt: skip
  return out


def sampled_metrics(correct_PK) -> dict:
  """eval/pass@k (k = 1, 2, 4, ..., n; `pass_at_k`) and eval/mean@n of n samples per
  problem, from their correctness [P, n]."""
  n = correct_PK.shape[1]
  c_P = (correct_PK > 0).sum(axis=1)
  out = {f"eval/pass@{k}": float(np.mean(pass_at_k(n, c_P, k))) for k in pass_ks(n)}
  out[f"eval/mean@{n}"] = float(mean_at_k(correct_PK))
  return out


def evaluate_episodes(
  setup: build.Setup, fns, params, examples: list, prompts, key, *, keys_P, show: int = 0
):
  """`run` with the environment (config.env): greedy episodes give eval/greedy_accuracy
  (mean episode reward) and eval/format_rate (the share the environment ended,
  `episodes.END_REASONS` "done"); with eval_samples = n, n sampled episodes per problem
  give pass@k and mean@n. Environment errors count as reward errors. Returns (metrics,
  the first `show` greedy episodes as `sample_records`: the whole episode's text)."""
  loop = setup.loop
  greedy = fns.episodes.greedy.run(
    params, prompts, examples, key, sampling.sampling_params(greedy=True)
  )

  def more():
    sampled = fns.episodes.eval.run(params, prompts, examples, key, setup.sampling_hyper)
    errors = int((~sampled.scorable_N).sum())
    return sampled.reward_N.reshape(len(examples), loop.eval_samples), errors

  return _metrics(
    setup,
    dict(enumerate(examples)),
    greedy.rollouts.tokens_NT,
    reward_N=greedy.reward_N,
    format_N=(greedy.end_N == episodes.DONE).astype(np.float64),
    scorable_N=greedy.scorable_N,
    errors=int((~greedy.scorable_N).sum()),
    messages=greedy.messages,
    where="the held-out greedy episodes",
    sampled=more if loop.eval_samples else None,
    keys_P=keys_P,
    show=show,
  )
