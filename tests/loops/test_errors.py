"""Errors of ``retrograde.scan`` / ``retrograde.fori_loop``: raised at trace time, with messages
that name the problem (nothing here compiles)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import retrograde
from retrograde import schedules as rs


def _step(c, x):
    return c, None


class _DummyOnline(rs.OnlineSchedule):
    def start(self):  # pragma: no cover - never called
        raise AssertionError

    def levels(self):  # pragma: no cover
        return (rs.Level(3),)

    def max_slots(self, n_steps):  # pragma: no cover
        return (3,)


def test_string_leaf_in_init():
    with pytest.raises(TypeError, match=r"init.*str.*'hello'"):
        retrograde.scan(_step, {"u": jnp.ones(2), "tag": "hello"}, length=3)


def test_string_leaf_in_xs():
    with pytest.raises(TypeError, match=r"xs.*str.*'abc'"):
        retrograde.scan(_step, jnp.ones(2), {"x": jnp.ones(3), "name": "abc"})


def test_length_disagrees_with_xs():
    with pytest.raises(ValueError, match=r"length=4.*leading size 3"):
        retrograde.scan(_step, jnp.ones(2), jnp.ones((3, 2)), length=4)


def test_xs_leaves_with_different_leading_sizes():
    with pytest.raises(ValueError, match=r"different leading sizes \[3, 5\]"):
        retrograde.scan(_step, jnp.ones(2), (jnp.ones(3), jnp.ones((5, 2))))


def test_scalar_xs_leaf():
    with pytest.raises(ValueError, match="leading"):
        retrograde.scan(_step, jnp.ones(2), jnp.float64(1.0))


def test_no_xs_and_no_length():
    with pytest.raises(ValueError, match="pass length"):
        retrograde.scan(_step, jnp.ones(2))


@pytest.mark.parametrize("length", [-1, 2.5, "3"])
def test_bad_length(length):
    with pytest.raises((TypeError, ValueError), match="length"):
        retrograde.scan(_step, jnp.ones(2), length=length)


@pytest.mark.parametrize(
    "schedule",
    [_DummyOnline(), rs.Online(3)],
    ids=lambda s: type(s).__name__,
)
def test_online_schedule_is_rejected(schedule):
    with pytest.raises(ValueError, match=r"online schedule.*offline schedule"):
        retrograde.scan(_step, jnp.ones(2), length=3, schedule=schedule)
    with pytest.raises(ValueError, match="offline schedule"):
        retrograde.fori_loop(0, 3, lambda i, v: v, jnp.ones(2), schedule=schedule)


@pytest.mark.parametrize("schedule", [10, "revolve", object()], ids=["int", "str", "object"])
def test_non_schedule(schedule):
    with pytest.raises(TypeError, match="schedule must be"):
        retrograde.scan(_step, jnp.ones(2), length=3, schedule=schedule)


def test_carry_changes_shape():
    with pytest.raises(
        TypeError,
        match=r"c\['u'\] goes in as float64\[2\] and comes out as "
        r"float64\[3\] \(the shapes differ\)",
    ):
        retrograde.scan(lambda c, x: ({"u": jnp.ones(3)}, None), {"u": jnp.ones(2)}, length=3)


def test_carry_changes_dtype():
    with pytest.raises(TypeError, match=r"c goes in as int32\[2\] and comes out as float64\[2\]"):
        retrograde.scan(lambda c, x: (c * jnp.float64(1.5), None), jnp.ones(2, jnp.int32), length=3)
    with pytest.raises(TypeError, match=r"c\[1\] goes in as float32\[2\] .* float64\[2\]"):
        retrograde.scan(
            lambda c, x: ((c[0], c[1].astype(jnp.float64)), None),
            (jnp.ones(2), jnp.ones(2, jnp.float32)),
            length=3,
        )


def test_narrower_dtype_is_not_cast_back():
    """A float32 result for a float64 carry leaf is an error, as in jax.lax.scan (it used to be
    cast back silently)."""
    with pytest.raises(TypeError, match=r"carry\['u'\] goes in as float64\[\] .* float32\[\]"):
        retrograde.scan(
            lambda carry, x: ({"u": x}, None), {"u": jnp.float64(0.0)}, jnp.ones(3, jnp.float32)
        )


def test_int_carry_weak_float_update():
    """An int carry times a Python float is a float: an error (as in jax.lax.scan), not a
    silent truncation back to int."""
    with pytest.raises(TypeError, match=r"c goes in as int32\[2\] and comes out as float64\[2\]"):
        retrograde.scan(lambda c, x: (c * 1.5, None), jnp.ones(2, jnp.int32), length=3)


def test_carry_changes_structure():
    with pytest.raises(
        TypeError, match=r"same pytree structure.*c is an array in the input carry but a tuple"
    ):
        retrograde.scan(lambda c, x: ((c, c), None), jnp.ones(2), length=3)
    with pytest.raises(
        TypeError,
        match=r"c\['a'\] is a dict with children \['u'\] in the input "
        r"carry but a dict with children \['u'\], \['v'\]",
    ):
        retrograde.scan(
            lambda c, x: ({"a": {"u": 1.0, "v": 2.0}}, None), {"a": {"u": 0.0}}, length=3
        )


def test_step_must_return_a_pair():
    with pytest.raises(TypeError, match="pair"):
        retrograde.scan(lambda c, x: c, jnp.ones(2), length=3)


def test_step_must_be_callable():
    with pytest.raises(TypeError, match="callable"):
        retrograde.scan("not a function", jnp.ones(2), length=3)


def test_fori_loop_traced_bounds_need_an_online_schedule():
    def f(n):
        return retrograde.fori_loop(0, n, lambda i, v: v * 2.0, jnp.ones(2), schedule=rs.Revolve(3))

    with pytest.raises(ValueError, match=r"traced bounds.*online schedule.*Revolve"):
        jax.jit(f)(3)


@pytest.mark.parametrize(
    "bounds,match",
    [
        ((0.0, 3), r"equal dtypes"),  # a float and an int bound: jax.lax refuses them too
        ((0, "3"), r"upper must be a real scalar"),
        ((0, True), r"upper must be a real scalar"),
        ((jnp.zeros(2, int), 3), r"lower must be a real scalar"),
    ],
    ids=["float_and_int", "str", "bool", "vector"],
)
def test_fori_loop_bad_bounds(bounds, match):
    with pytest.raises(TypeError, match=match):
        retrograde.fori_loop(*bounds, lambda i, v: v, jnp.ones(2))


def test_fori_loop_bounds_of_different_dtypes():
    with pytest.raises(TypeError, match=r"equal dtypes.*int32 and int64"):
        retrograde.fori_loop(jnp.int32(0), jnp.int64(3), lambda i, v: v, jnp.ones(2))


def test_fori_loop_names_the_val_leaf():
    with pytest.raises(TypeError, match=r"retrograde.fori_loop: body_fun .* state\['u'\] goes in"):
        retrograde.fori_loop(
            0, 3, lambda i, state: {"u": state["u"].astype(jnp.float32)}, {"u": jnp.ones(2)}
        )


def test_weak_typed_carry_update_is_accepted():
    """A Python-scalar (weakly typed) update keeps the carry's dtype rather than erroring."""
    c, _ = retrograde.scan(lambda c, x: (c + 1, None), jnp.ones(2, jnp.float32), length=2)
    assert c.dtype == jnp.float32
