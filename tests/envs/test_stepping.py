"""`envs.stepping`: one turn's environment steps, serially or on worker threads, each
within its budget. Environments here sleep, wait on events or raise; the longest wait is
a fraction of a second (tests/envs/test_episodes.py runs the steps inside whole episodes)."""

import threading
import time

import pytest

from grpo_jax.envs import base, stepping


class Env(base.Environment):
  """step(action) runs `act(action)` and returns its value as the reward."""

  def __init__(self, act, *, budget=None):
    super().__init__(tokenizer=None)
    self.act, self.step_budget_s, self.calls = act, budget, 0

  def reset(self, example):
    return ()

  def step(self, action):
    self.calls += 1
    return base.Step(reward=float(self.act(action)), done=True)


@pytest.mark.parametrize(("budget", "seconds"), [(None, None), (2, 2.0), (0.5, 0.5)])
def test_budget_s(budget, seconds):
  """None stays None; a positive number becomes float seconds."""
  assert stepping.budget_s(Env(int, budget=budget)) == seconds


@pytest.mark.parametrize("budget", [0, -1.0, True, float("inf"), float("nan"), "1"])
def test_a_budget_that_is_not_a_positive_number_is_refused(budget):
  """Zero, negative, bool, infinite, NaN and str budgets are errors naming the class."""
  with pytest.raises(ValueError, match=r"Env.step_budget_s must be None or a positive number"):
    stepping.budget_s(Env(int, budget=budget))


def test_workers_must_be_positive():
  """Steps(workers=0) is refused."""
  with pytest.raises(ValueError, match="workers >= 1, got 0"):
    stepping.Steps(workers=0)


@pytest.mark.parametrize("workers", [1, 3])
def test_outcomes_come_back_in_the_order_given(workers):
  """The slowest step first: outcomes are still in the order of the jobs, rewards the
  actions, and a step that raised has its error and no step."""

  def act(action):
    time.sleep(0.02 * (3 - int(action)))
    return action

  def boom(action):
    raise RuntimeError(f"bad {action}")

  jobs = [(Env(act), "0"), (Env(boom), "x"), (Env(act), "2"), (Env(act), "3")]
  got = stepping.Steps(workers=workers).run(jobs)
  assert [o.step.reward if o.step else None for o in got] == [0.0, None, 2.0, 3.0]
  assert isinstance(got[1].error, RuntimeError) and str(got[1].error) == "bad x"
  assert not any(o.late for o in got) and all(o.seconds >= 0 for o in got)
  assert got[0].seconds >= 0.06  # 0.02 * 3: its own wall time.


def test_threads_run_the_steps_at_once():
  """Three steps that each wait for the other two at a barrier pass it only when three
  workers run them at the same time."""
  barrier = threading.Barrier(3)
  jobs = [(Env(lambda a: barrier.wait(timeout=5)), str(k)) for k in range(3)]
  got = stepping.Steps(workers=3).run(jobs)
  assert all(o.error is None for o in got)
  assert sorted(o.step.reward for o in got) == [0.0, 1.0, 2.0]  # Barrier.wait's indices.


def test_a_late_serial_step_is_discarded_after_it_returns():
  """workers=1: the step runs to its end (0.05 s), then is late by its 0.01 s budget: no
  step, no error, seconds = the budget."""
  env = Env(lambda a: time.sleep(0.05) or 1, budget=0.01)
  (got,) = stepping.Steps(workers=1).run([(env, "a")])
  assert got == stepping.Outcome(late=True, seconds=0.01) and env.calls == 1


def test_a_late_threaded_step_is_left_behind_and_its_worker_replaced():
  """With 3 workers, a step stuck past its 0.05 s budget is late without waiting for it;
  the next call's three barrier steps all find a worker (a new thread replaced the stuck
  one), and the stuck step's result, when it comes, reaches no caller."""
  release = threading.Event()
  steps = stepping.Steps(workers=3)
  stuck = Env(lambda a: release.wait(timeout=10) and 7, budget=0.05)
  quick = Env(lambda a: 1)
  t0 = time.monotonic()
  got = steps.run([(stuck, "a"), (quick, "b")])
  assert time.monotonic() - t0 < 5.0
  assert got[0] == stepping.Outcome(late=True, seconds=0.05)
  assert got[1].step.reward == 1.0
  try:
    barrier = threading.Barrier(3)
    jobs = [(Env(lambda a: barrier.wait(timeout=5)), str(k)) for k in range(3)]
    assert all(o.error is None for o in steps.run(jobs))
  finally:
    release.set()
  assert [o.step.reward for o in steps.run([(quick, "c")])] == [1.0]


def test_budgets_are_checked_before_any_step_runs():
  """A bad budget in the second job: an error, and the first job's step never ran."""
  ok = Env(int)
  with pytest.raises(ValueError, match="step_budget_s"):
    stepping.Steps(workers=2).run([(ok, "1"), (Env(int, budget=-1), "2")])
  assert ok.calls == 0


def test_a_worker_reports_an_exception_that_is_not_an_exception():
  """On threads a KeyboardInterrupt in a step comes back as its error (the episode loop
  re-raises it), not lost with the thread."""

  def interrupt(action):
    raise KeyboardInterrupt

  (got,) = stepping.Steps(workers=2).run([(Env(interrupt), "a")])
  assert isinstance(got.error, KeyboardInterrupt) and got.step is None


def _workers() -> set[threading.Thread]:
  return {t for t in threading.enumerate() if t.name == "env-step"}


def test_a_collected_steps_dismisses_its_workers():
  """Runs started one after another in a process leave no idle threads behind: once a
  Steps is collected, its 3 waiting workers leave, and so does the thread a late step
  held once that step returns (its replacement was one of the 3)."""
  import gc  # noqa: PLC0415

  before = _workers()
  release = threading.Event()
  steps = stepping.Steps(workers=3)
  stuck = Env(lambda a: release.wait(timeout=10) and 7, budget=0.05)
  assert steps.run([(stuck, "a"), (Env(lambda a: 1), "b")])[0].late
  mine = _workers() - before
  assert len(mine) == 4  # Three in the pool, one still in the late step.
  del steps
  gc.collect()
  release.set()
  for thread in mine:
    thread.join(timeout=5)
  assert not any(t.is_alive() for t in mine)


# ----------------------------------------------------------------------------
# Flights: steps given out one at a time, outcomes taken as they are ready.
# ----------------------------------------------------------------------------


def test_a_flight_gives_back_each_outcome_when_it_is_ready_sorted_by_key():
  """Key 7 waits for an event, keys 3 and 1 return at once: a blocking take gives the
  two done ones (sorted by key) and not 7; a non-blocking take before 7 is released
  gives nothing; after the release, 7."""
  gate = threading.Event()
  flight = stepping.Steps(workers=4).flight()
  flight.submit(7, Env(lambda a: gate.wait(5) and 7), "a")
  flight.submit(3, Env(lambda a: 3), "b")
  flight.submit(1, Env(lambda a: 1), "c")
  got = []
  while len(got) < 2:
    got += flight.take(block=True)
  assert [k for k, _ in sorted(got)] == [1, 3] and [o.step.reward for _, o in sorted(got)] == [1, 3]
  assert flight.pending == 1 and flight.take(block=False) == []
  gate.set()
  ((k, outcome),) = flight.take(block=True)
  assert (k, outcome.step.reward, flight.pending) == (7, 7.0, 0)
  assert flight.take(block=True) == []  # Nothing pending: no wait.


def test_a_late_step_in_a_flight_is_late_at_its_deadline_and_close_abandons_the_rest():
  """A step past its 0.2 s budget comes back late at the deadline (its thread's result
  never does); closing the flight abandons a queued step, which never runs."""
  gate, ran = threading.Event(), []
  steps = stepping.Steps(workers=2)
  flight = steps.flight()
  t0 = time.monotonic()
  flight.submit(0, Env(lambda a: gate.wait(5), budget=0.2), "slow")
  ((k, outcome),) = flight.take(block=True)
  assert k == 0 and outcome.late and 0.15 < time.monotonic() - t0 < 2.0
  blocker = threading.Event()
  flight.submit(1, Env(lambda a: blocker.wait(5)), "x")
  flight.submit(2, Env(lambda a: blocker.wait(5)), "y")
  flight.submit(3, Env(lambda a: ran.append(3) or 3), "queued")  # Behind two busy workers.
  flight.close()
  blocker.set()
  gate.set()
  time.sleep(0.2)
  assert ran == [] and flight.pending == 0


def test_a_blocking_take_also_takes_every_other_step_done_by_then():
  """Three quick steps done before the take: one blocking take gives all three (a take
  that returned the first alone would let the episode loop append one observation a
  segment)."""
  flight = stepping.Steps(workers=4).flight()
  for k in range(3):
    flight.submit(k, Env(lambda a: 1), "a")
  time.sleep(0.3)
  assert [k for k, _ in flight.take(block=True)] == [0, 1, 2]


def test_with_one_worker_a_flight_runs_each_step_when_it_is_submitted():
  flight, order = stepping.Steps(workers=1).flight(), []
  flight.submit(2, Env(lambda a: order.append(a) or 2), "first")
  flight.submit(1, Env(lambda a: order.append(a) or 1), "second")
  assert order == ["first", "second"]
  assert [k for k, _ in flight.take(block=False)] == [1, 2]


def test_a_blocking_take_with_a_timeout_returns_empty_when_nothing_is_done_by_then():
  """A step held for its gate: take(block=True, timeout=0.05) comes back empty after about
  0.05 s (not at the step's 5 s budget), and the step is still pending; released, it is
  taken; a step's budget shorter than the timeout still makes it late at its deadline."""
  gate = threading.Event()
  flight = stepping.Steps(workers=2).flight()
  flight.submit(0, Env(lambda a: gate.wait(5) and 1, budget=5), "held")
  t0 = time.monotonic()
  assert flight.take(block=True, timeout=0.05) == []
  assert 0.04 < time.monotonic() - t0 < 1.0 and flight.pending == 1
  gate.set()
  ((k, outcome),) = flight.take(block=True, timeout=5)
  assert (k, outcome.step.reward, flight.pending) == (0, 1.0, 0)
  flight.submit(1, Env(lambda a: threading.Event().wait(5), budget=0.1), "slow")
  ((k, outcome),) = flight.take(block=True, timeout=3)
  assert k == 1 and outcome.late
  flight.close()
