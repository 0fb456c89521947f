"""`rl.declared`: a variant's declared array hyperparameters (`Hyper`), collected from a
registry and resolved against a config section. The registry here is a stand-in with the
three things `declared` reads (kind, names(), traits(name).hyper), so nothing is
registered in the package's own registries."""

import types

import jax
import jax.numpy as jnp
import pytest

from grpo_jax.rl import declared


class Registry:
  kind = "advantage"

  def __init__(self, **hypers):
    self._hypers = hypers

  def names(self):
    return sorted(self._hypers)

  def traits(self, name):
    return types.SimpleNamespace(hyper=self._hypers[name])


def test_check_returns_a_float_within_the_range():
  """An int in [low, high] comes back as a float; both ends are inside."""
  h = declared.Hyper(1.0, low=0.0, high=2.0, doc="the scale")
  assert h.check("x", 2) == 2.0 and isinstance(h.check("x", 2), float)
  assert h.check("x", 0.0) == 0.0  # Both ends are allowed.


@pytest.mark.parametrize("value", [2.5, -0.1, float("nan"), "1", None, True, False])
def test_check_refuses_with_the_key_and_the_range(value):
  """Out of range, NaN or not a number (a bool is not one, though Python counts it an
  int): the key, the value, the range and the doc."""
  h = declared.Hyper(1.0, low=0.0, high=2.0, doc="the scale")
  message = f"config.rl.advantage_hyper.s={value!r}: must be a number in [0, 2] (the scale)."
  with pytest.raises(ValueError) as e:
    h.check("config.rl.advantage_hyper.s", value)
  assert str(e.value) == message


def test_an_unbounded_hyper_without_a_doc():
  """The default range is the whole real line; the default doc says who declared it."""
  h = declared.Hyper(0.5)
  assert (h.low, h.high) == (-float("inf"), float("inf"))
  assert h.check("k", -1e30) == -1e30
  with pytest.raises(ValueError, match=r"in \[-inf, inf\] \(declared by its variant\)"):
    h.check("k", "x")


def test_collect_merges_by_name_and_refuses_two_meanings():
  """Equal declarations under one name merge; different ones are an error."""
  tau = declared.Hyper(1.0, low=0.0)
  reg = Registry(a={"tau": tau}, b={"tau": declared.Hyper(1.0, low=0.0), "s": declared.Hyper(2.0)})
  assert declared.collect(reg) == {"tau": tau, "s": declared.Hyper(2.0)}
  assert declared.collect(Registry(a={}, b={})) == {}
  clash = Registry(a={"tau": tau}, b={"tau": declared.Hyper(2.0)})
  with pytest.raises(ValueError, match="advantage hyperparameter 'tau' is declared twice"):
    declared.collect(clash)


def test_values_are_every_declared_one_given_or_default():
  """Variant a declares s (default 1) and t (default 3); b declares u. Given t=5 and u=9:
  s=1 (default), t=5, u=9, whichever variant is chosen (an estimator that calls another,
  distill's base, hands it the same arrays)."""
  reg = Registry(
    a={"s": declared.Hyper(1.0), "t": declared.Hyper(3.0, high=10.0)},
    b={"u": declared.Hyper(0.0)},
  )
  given = {"t": 5, "u": 9}
  assert declared.values(reg, given, section="config.rl.advantage_hyper") == {
    "s": 1.0,
    "t": 5.0,
    "u": 9.0,
  }
  assert declared.values(reg, {}, section="sec") == {"s": 1.0, "t": 3.0, "u": 0.0}
  with pytest.raises(ValueError, match=r"sec.t=11: must be a number in \[-inf, 10\]"):
    declared.values(reg, {"t": 11}, section="sec")


def test_an_undeclared_key_lists_the_declared_ones():
  """A key no variant declares: the error lists the unknown keys and the declared ones, sorted."""
  reg = Registry(a={"s": declared.Hyper(1.0)}, b={"u": declared.Hyper(0.0)})
  with pytest.raises(ValueError) as e:
    declared.values(reg, {"x": 1, "w": 2}, section="sec")
  assert str(e.value) == "sec: ['w', 'x'] are declared by no advantage; declared: ['s', 'u']."
  with pytest.raises(ValueError, match="declared: none"):
    declared.values(Registry(a={}), {"x": 1}, section="sec")


def test_a_rule_beyond_the_range_and_infinities():
  """`valid` narrows [low, high] (an open end, an "off" value) and `rule` words the error;
  an infinite value is refused even inside an unbounded range."""
  tau = declared.Hyper(1.0, low=0.0, high=1.0, valid=lambda t: t > 0, rule="in (0, 1]")
  assert tau.check("k", 1) == 1.0 and tau.check("k", 0.5) == 0.5
  with pytest.raises(
    ValueError, match=r"^k=0.0: must be in \(0, 1\] \(declared by its variant\)\.$"
  ):
    tau.check("k", 0.0)
  with pytest.raises(ValueError, match=r"^k=1.5: must be in \(0, 1\]"):
    tau.check("k", 1.5)  # The range still holds: the rule only narrows it.
  with pytest.raises(ValueError, match=r"k=inf: must be a number in \[-inf, inf\]"):
    declared.Hyper(0.0).check("k", float("inf"))


def test_values_read_by_name_or_attribute_and_cross_jit():
  """hyper.s and hyper["s"] are the same array; an undeclared name says which are
  declared; replace() keeps the names; Values is a pytree (one trace for new values), and
  0.2's hyper.extra[name] still reads, with a DeprecationWarning."""
  v = declared.Values(declared.arrays({"s": 2.0, "t": 3.0}))
  assert float(v.s) == 2.0 and v["t"] is v.t and v.s.dtype == jnp.float32
  assert sorted(v) == ["s", "t"] and len(v) == 2
  with pytest.raises(
    AttributeError, match=r"no hyperparameter 'u' is declared; declared: \['s', 't'\]"
  ):
    v.u  # noqa: B018
  with pytest.raises(KeyError, match="declare it where the variant is registered"):
    v["u"]  # noqa: B018
  with pytest.raises(KeyError):
    v.replace(u=1.0)
  traces = []

  @jax.jit
  def f(hyper):
    traces.append(None)
    return hyper.s * hyper["t"]

  assert float(f(v)) == 6.0 and float(f(v.replace(s=jnp.float32(4.0)))) == 12.0
  assert len(traces) == 1
  with pytest.warns(DeprecationWarning, match=r"hyper.extra\[name\] is deprecated"):
    assert float(v.extra["s"]) == 2.0
