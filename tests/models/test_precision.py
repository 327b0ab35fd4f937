"""Mixed precision of the float32-output matmuls (`layers.einsum_f32`): the forward accumulates and returns
float32, the backward multiplies in the inputs' dtype. With bf16 compute, no matmul of a decoder's gradient
takes a float32 operand (a GPU would run it at half the bf16 rate, with twice the bytes); the gradients
still equal float64 brute force within bf16 rounding."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax.models.config import PRESETS
from clawjax.models.layers import einsum_f32
from clawjax.models.model import Decoder, causal_inputs


def _inputs(dtype):
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.normal(size=(3, 5, 16)), dtype)
  b = jnp.asarray(rng.normal(size=(16, 7)), dtype)
  g = jnp.asarray(rng.normal(size=(3, 5, 7)), jnp.float32)
  return a, b, g


def test_forward_is_float32_and_float32_inputs_keep_the_plain_gradient():
  a, b, g = _inputs(jnp.float32)
  out, vjp = jax.vjp(lambda a, b: einsum_f32("tsd,dv->tsv", a, b), a, b)
  ref_out, ref_vjp = jax.vjp(lambda a, b: jnp.einsum("tsd,dv->tsv", a, b), a, b)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref_out, rtol=1e-6)
  for got, want in zip(vjp(g), ref_vjp(g)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_bf16_gradients_equal_float64_within_bf16_rounding():
  a, b, g = _inputs(jnp.bfloat16)
  out, vjp = jax.vjp(lambda a, b: einsum_f32("tsd,dv->tsv", a, b), a, b)
  a64, b64, g64 = (np.asarray(x, np.float64) for x in (a, b, g))
  np.testing.assert_allclose(out, np.einsum("tsd,dv->tsv", a64, b64), rtol=1e-5, atol=1e-5)
  da, db = vjp(g)
  assert da.dtype == db.dtype == jnp.bfloat16
  # The cotangent rounded to bf16 (relative 2^-8) and the bf16 result: a few bf16 ulps of the largest entry.
  np.testing.assert_allclose(np.asarray(da, np.float64), np.einsum("tsv,dv->tsd", g64, b64), atol=0.03 * np.abs(da).max())
  np.testing.assert_allclose(np.asarray(db, np.float64), np.einsum("tsd,tsv->dv", a64, g64), atol=0.03 * np.abs(db).max())


def _dots(jaxpr) -> list:
  """Every dot_general of a jaxpr, its sub-jaxprs (scan, remat, custom_vjp, pjit) included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      found.append(eqn)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          found += _dots(inner)
  return found


@pytest.mark.parametrize("attention", ["dense", "blocked"])
def test_bf16_decoder_gradient_has_no_float32_matmul(attention):
  cfg = PRESETS["test-tiny"].replace(dtype="bfloat16", param_dtype="float32", attention_impl=attention,
                                     attention_block=8, remat=True, n_layers=2)
  graph, params = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))

  def loss(params, tokens_BT):
    logits_BTV = nnx.merge(graph, params)(*causal_inputs(tokens_BT))
    return jnp.sum(jax.nn.log_softmax(logits_BTV)[..., 0])

  jaxpr = jax.make_jaxpr(jax.grad(loss))(params, jax.ShapeDtypeStruct((1, 32), jnp.int32)).jaxpr
  dots = _dots(jaxpr)
  assert dots  # the walk reaches the model's matmuls
  f32 = [f"{[v.aval.str_short() for v in e.invars]}" for e in dots
         if any(v.aval.dtype == jnp.float32 for v in e.invars)]
  assert not f32, f32
