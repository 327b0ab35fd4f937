"""The sharded train step: pi_old pass, then epochs x minibatches optimizer updates with accumulation.

One `Learner.step(packed_batch)` is one jitted call over a Mesh:
  1. pi_old pass (no gradient, micro-batch by micro-batch): logp_old with the current params, V_old and
     log pi_ref where needed, frozen for every update of the step. TIS weights
     w_t = min(exp(logp_old - logp_rollout), c_bar) come from it.
  2. `epochs` passes over the batch (a scan), each a scan over `minibatches` optimizer updates. A
     minibatch is a group of consecutive micro-batches (whole rows: tokens of a tree row share prefixes),
     or with `shuffle` a random deal of whole rows per epoch. Each update: a scan over the minibatch's
     micro-batches, each adding sum(weight * token_loss) / N to the loss and its gradient, N = the weight
     sum over the *minibatch*, so k micro-batches equal one big minibatch; then clip and optimizer update.
     The defaults (1 epoch, 1 minibatch) are one update on the whole batch. A minibatch of padding rows
     only still steps the optimizer with a zero gradient, as an empty batch always did.
  3. Metrics: each loss metric is its weighted mean over the first epoch (every loss token once, seen
     by the params of its minibatch's update: with one minibatch the pre-update values, ratio 1), with
     `<name>_last` over the last epoch when epochs > 1; grad_norm (the policy's) and value_grad_norm
     (the critic's) are means over an epoch's updates; `updates` counts optimizer updates applied and
     `skipped_updates` those skipped. The train state's buffers are donated.
The policy and the critic have an optimizer each (learning rates `lr` and `value.lr`, each clipped by
its own gradient norm). An update whose loss or gradient is not finite is skipped: parameters and
optimizer state are left exactly as they were.
Params and optimizer state are laid out by clawjax.sharding's logical-axis rules; batch rows are split
over the data and fsdp mesh axes. In a run of several processes (clawjax.distributed) the mesh spans
every process's devices and each process prepares only its own rows (`prepare_all`); N is the weight sum
over the global batch, so the step equals the one-process step on the same rows. A caller that splits
one global batch over the processes feeds each process the rows `process_rows` names: the global array
is then the one-process batch, row for row.
`loss(batch)` is the loss at the current params without a gradient (a held-out loss): one forward pass
per micro-batch, whose outputs also stand for pi_old (the same params).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clawjax import distributed, sharding
from clawjax.rl.config import LearnerConfig
from clawjax.rl.device_batch import BatchShape, DeviceBatch, agree_shapes, batch_shape, empty_batch, prepare_batch
from clawjax.rl.logprobs import gather_rows, token_logprobs
from clawjax.rl.losses import TokenInputs, check_loss, tis_weights, value_loss
from clawjax.rl.value import values_at
from clawjax.tree.batch import PackedBatch


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: dict[str, nnx.State]      # "policy", and "value" when the config has a critic
  opt_state: Any
  step: jax.Array                   # int32 scalar: optimizer updates done (epochs x minibatches a step)
  rng: jax.Array                    # uint32[2] raw PRNG key; the step's key goes to the loss
  ref_params: nnx.State | None      # frozen initial policy for the KL term (kl_coef > 0), else None
  value_opt_state: Any = None       # optimizer state of value pretraining (critic params only)


def make_optimizer(cfg: LearnerConfig, lr: float, schedule: optax.Schedule | None = None
                   ) -> optax.GradientTransformation:
  """The optimizer of one parameter group (the policy, or the critic) at peak learning rate `lr` (warmed
  up over `cfg.warmup_steps`), or at `schedule` (the learning rate as a function of the update count)
  when given, with its own gradient-norm clip: one group's large gradients never shrink the other's step."""
  if schedule is None:
    schedule = optax.linear_schedule(0.0, lr, cfg.warmup_steps) if cfg.warmup_steps else lr
  if cfg.optimizer == "adamw":
    opt = optax.adamw(schedule, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
  else:
    opt = optax.sgd(schedule)
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), opt) if cfg.grad_clip else opt


def _masked_mean(x: jax.Array, weight: jax.Array, norm: jax.Array) -> jax.Array:
  return jnp.sum(jnp.where(weight > 0, weight * x, 0.0)) / norm


def _normaliser(batch: DeviceBatch) -> jax.Array:
  """The global weight sum N over all micro-batches (1 for a batch without loss tokens)."""
  norm = jnp.sum(batch.weight)
  return jnp.where(norm > 0, norm, 1.0)


def _grad_norms(grads: dict[str, Any]) -> dict[str, jax.Array]:
  """Global gradient norm of each parameter group before clipping: grad_norm (the policy's) and
  value_grad_norm (the critic's, when there is one)."""
  return {("grad_norm" if name == "policy" else f"{name}_grad_norm"): optax.global_norm(g)
          for name, g in grads.items()}


def _trunk_tokens(batch: DeviceBatch) -> jax.Array:
  """Tokens the trunk runs on (for tokens/s), counted once per step however many updates reuse them."""
  return jnp.sum(batch.segment_ids > 0).astype(jnp.float32)


def _scan_sum(fn, xs: Any) -> Any:
  """The sum of fn(x) (a pytree) over the leading axis of `xs`, in a scan: one micro-batch's activations
  (and gradients) live at a time."""
  x0 = jax.tree.map(lambda a: a[0], xs)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, x0))
  body = lambda carry, x: (jax.tree.map(jnp.add, carry, fn(x)), None)
  return jax.lax.scan(body, zeros, xs)[0]


def _deal_rows(perm: jax.Array, x: jax.Array) -> jax.Array:
  """[M, r, ...] -> the same shape with its M x r rows reordered by `perm` (rows stay whole)."""
  rows = x.reshape(-1, *x.shape[2:])
  return jnp.take(rows, perm, axis=0).reshape(x.shape)


def _placed_shape(x: Any, placed: NamedSharding) -> jax.ShapeDtypeStruct:
  """The shape and dtype of `x` laid out by `placed` (an abstract Learner's state)."""
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed)


class Learner:
  """Owns the train state of a policy (and optional critic) on a mesh, and the jitted steps."""

  def __init__(self, cfg: LearnerConfig, policy: nnx.Module, *, value: nnx.Module | None = None,
               mesh: Mesh | None = None, rules: Sequence[tuple[str, Any]] = sharding.DEFAULT_RULES,
               policy_schedule: optax.Schedule | None = None, abstract: bool = False):
    """`policy_schedule`: the policy's learning rate as a function of its update count, in place of
    `cfg.lr` warmed up over `cfg.warmup_steps` (the SFT stage's warm-up and cosine decay).
    `abstract`: the models hold shapes only (`nnx.eval_shape`); the state is then ShapeDtypeStructs with
    their shardings, nothing is allocated, and the jitted steps can only be lowered and compiled for the
    mesh's devices (clawjax/aot: compiling a config for an accelerator from a CPU host)."""
    self.cfg = cfg
    self.loss_spec = check_loss(cfg, where="LearnerConfig")
    if (value is None) != (cfg.value.kind == "none"):
      raise ValueError(f"LearnerConfig.value.kind={cfg.value.kind!r} but value model "
                       f"{'missing' if value is None else 'given'}")
    self.mesh = mesh or sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
    self.policy_def, policy_params, self.policy_rest = nnx.split(policy, nnx.Param, ...)
    params = {"policy": policy_params}
    self.value_def = self.value_rest = None
    if value is not None:
      self.value_def, params["value"], self.value_rest = nnx.split(value, nnx.Param, ...)
    self._loss_slots = cfg.logits_chunk
    # One optimizer per parameter group; the critic's pretraining has one of its own (its own state).
    self.txs = {name: make_optimizer(cfg, cfg.lr, policy_schedule) if name == "policy"
                else make_optimizer(cfg, cfg.value.lr) for name in params}
    self.value_tx = make_optimizer(cfg, cfg.value.pretrain_lr)

    def init_state(params: dict[str, nnx.State]) -> TrainState:
      return TrainState(params=params, opt_state={name: tx.init(params[name]) for name, tx in self.txs.items()},
                        step=jnp.zeros((), jnp.int32), rng=jax.random.PRNGKey(cfg.seed),
                        ref_params=jax.tree.map(jnp.copy, params["policy"]) if cfg.kl_coef else None,
                        value_opt_state=self.value_tx.init(params["value"]) if value is not None else None)

    state = jax.eval_shape(init_state, params) if abstract else init_state(params)
    param_sh = {k: sharding.state_shardings(v, self.mesh, rules) for k, v in params.items()}
    replicated = NamedSharding(self.mesh, P())
    # Adam's moments are laid out like their parameters (found structurally from each optimizer).
    self.state_sharding = TrainState(
        params=param_sh,
        opt_state={name: sharding.optimizer_shardings(tx, state.opt_state[name], param_sh[name], self.mesh)
                   for name, tx in self.txs.items()},
        step=replicated, rng=replicated,
        ref_params=param_sh["policy"] if cfg.kl_coef else None,
        value_opt_state=None if value is None else sharding.optimizer_shardings(
            self.value_tx, state.value_opt_state, param_sh["value"], self.mesh))
    rest = (self.policy_rest, self.value_rest)
    if abstract:
      self.state: TrainState = jax.tree.map(_placed_shape, state, self.state_sharding)
      self.rest = jax.tree.map(lambda x: _placed_shape(x, replicated), rest)
    else:
      self.state = jax.device_put(state, self.state_sharding)
      self.rest = jax.device_put(rest, replicated)

    batch_sh = DeviceBatch(*[sharding.batch_sharding(self.mesh, 3, leading=1)] * len(dataclasses.fields(DeviceBatch)))
    self.batch_sharding = batch_sh
    self._row_shards = sharding.local_row_shards(self.mesh)  # the row shards this process feeds
    traced = lambda fn: sharding.under_mesh(fn, self.mesh, rules)  # activation constraints active
    self._train = jax.jit(traced(self._train_fn), in_shardings=(self.state_sharding, batch_sh, None),
                          out_shardings=(self.state_sharding, replicated), donate_argnums=0)
    self._loss_and_grads = jax.jit(traced(self._loss_and_grads_fn),
                                   in_shardings=(self.state_sharding, batch_sh, None),
                                   out_shardings=(replicated, param_sh, replicated))
    self._loss = jax.jit(traced(self._loss_fn), in_shardings=(self.state_sharding, batch_sh, None),
                         out_shardings=replicated)
    self._pretrain = jax.jit(traced(self._pretrain_fn), in_shardings=(self.state_sharding, batch_sh, None),
                             out_shardings=(self.state_sharding, replicated), donate_argnums=0)

  # ---- host API -------------------------------------------------------------------------------------

  def prepare(self, batch: PackedBatch) -> DeviceBatch:
    """Host-side: compact, pad and split a PackedBatch, then place it on the mesh. The loss slots per
    row only grow, to the most any batch so far needed (in logits_chunk steps), so that the step
    compiles for a few shapes, not one per batch. With several processes every process calls it at the
    same point, each with its own rows (`prepare_all`)."""
    return self.prepare_all([batch])[0]

  def prepare_all(self, batches: Sequence[PackedBatch]) -> list[DeviceBatch]:
    """`prepare` for a list of batches: one learner step each, all in one shape of loss slots.

    With several processes, every process calls it once per RL step with its own batches (its groups'
    rows; any number, none included) and gets the same number back: the most any process passed. Batch
    i of the global step is every process's batch i, each padded with empty rows to the rows, row length
    and loss slots that the largest needs; a process with fewer batches contributes empty rows only. No
    process holds the others' rows; each global array is assembled from the processes' own parts
    (`jax.make_array_from_process_local_data`)."""
    cfg = self.cfg
    layout = dict(normalisation=cfg.normalisation, micro_batches=cfg.micro_batches,
                  row_multiple=len(self._row_shards))
    own = [batch_shape(b, chunk=cfg.logits_chunk, **layout) for b in batches]
    everyone = distributed.allgather_json([dataclasses.astuple(s) for s in own])
    shapes = agree_shapes([[BatchShape(*s) for s in shapes] for shapes in everyone])
    self._loss_slots = max([self._loss_slots] + [s.loss_slots for s in shapes])
    shapes = [dataclasses.replace(s, loss_slots=self._loss_slots) for s in shapes]
    local = [prepare_batch(b, chunk=cfg.logits_chunk, shape=shape, **layout) for b, shape in zip(batches, shapes)]
    local += [empty_batch(shape, cfg.micro_batches) for shape in shapes[len(batches):]]
    return [jax.make_array_from_process_local_data(self.batch_sharding, b) for b in local]

  def process_rows(self, rows: int) -> list[int]:
    """The rows of a global batch of `rows` rows that this process feeds, in the order it passes them to
    `prepare`: the global array the processes assemble is then the one-process batch of those rows, row
    for row. The rows are padded with empty ones (indices >= rows) to a multiple of micro-batches x row
    shards; micro-batch m is every row shard's m-th slice, and a process holds its row shards' slices.
    With one process: 0 .. the padded count - 1."""
    micro, shards = self.cfg.micro_batches, sharding.batch_shards(self.mesh)
    per_shard = -(-rows // (micro * shards))  # rows of one micro-batch on one row shard
    return [(m * shards + s) * per_shard + o for m in range(micro) for s in self._row_shards for o in range(per_shard)]

  def step(self, batch: PackedBatch | DeviceBatch) -> dict[str, float]:
    """One step (epochs x minibatches updates); returns the metrics (host floats) including grad_norm,
    updates and tokens_per_s (batch tokens per second of the whole step)."""
    batch = self.prepare(batch) if isinstance(batch, PackedBatch) else batch
    start = time.perf_counter()
    self.state, metrics = self._train(self.state, batch, self.rest)
    metrics = jax.device_get(metrics)
    seconds = time.perf_counter() - start
    out = {k: float(v) for k, v in metrics.items()}
    out["step_seconds"] = seconds
    out["tokens_per_s"] = out["tokens"] / seconds
    return out

  def loss_and_grads(self, batch: PackedBatch | DeviceBatch) -> tuple[float, dict, dict[str, float]]:
    """Loss, gradient and metrics of one update on the whole batch at the current params, without
    updating (the step's update with the default 1 epoch x 1 minibatch; for checks and benchmarks)."""
    batch = self.prepare(batch) if isinstance(batch, PackedBatch) else batch
    loss, grads, metrics = self._loss_and_grads(self.state, batch, self.rest)
    return float(loss), grads, {k: float(v) for k, v in jax.device_get(metrics).items()}

  def loss(self, batch: PackedBatch | DeviceBatch) -> dict[str, float]:
    """The loss of the whole batch at the current params and its metrics, forward passes only, with
    `loss_weight` (the weight sum N of every process's rows) and `tokens`."""
    batch = self.prepare(batch) if isinstance(batch, PackedBatch) else batch
    return {k: float(v) for k, v in jax.device_get(self._loss(self.state, batch, self.rest)).items()}

  def pretrain_value_step(self, batch: PackedBatch | DeviceBatch) -> dict[str, float]:
    """One critic update on 0.5 (V - R)^2 alone, the policy frozen (for "shared" only the head moves),
    at ValueConfig.pretrain_lr: the paper pretrains the value model before RL."""
    if self.value_def is None:
      raise ValueError("pretrain_value_step needs LearnerConfig.value.kind != 'none'")
    batch = self.prepare(batch) if isinstance(batch, PackedBatch) else batch
    self.state, metrics = self._pretrain(self.state, batch, self.rest)
    return {k: float(v) for k, v in jax.device_get(metrics).items()}

  def policy_model(self) -> nnx.Module:
    """The current policy as an NNX module over the learner's own arrays (e.g. to export weights)."""
    return nnx.merge(self.policy_def, self.state.params["policy"], self.policy_rest)

  def policy_copy(self) -> nnx.Module:
    """The current policy with buffers of its own: the learner donates its state at every update, so
    anything that outlives a step (the rollout engine's weights) must not hold the learner's arrays."""
    return nnx.merge(self.policy_def, jax.tree.map(jnp.copy, self.state.params["policy"]), self.policy_rest)

  # ---- traced functions -----------------------------------------------------------------------------

  def _policy_tokens(self, policy_params: nnx.State, rest, mb: DeviceBatch):
    model = nnx.merge(self.policy_def, policy_params, rest[0])
    hidden = model.hidden(mb.tokens, mb.positions, mb.segment_ids, mb.subtree_end)
    h_RKD = gather_rows(hidden, mb.pred_index)
    logp, entropy = token_logprobs(model.logits, h_RKD, mb.targets, self.cfg.temperature, self.cfg.logits_chunk)
    return logp, entropy, h_RKD

  def _values(self, value_params: nnx.State, rest, mb: DeviceBatch, h_RKD: jax.Array) -> jax.Array:
    value_model = nnx.merge(self.value_def, value_params, rest[1])
    return values_at(value_model, h_RKD, mb.tokens, mb.positions, mb.segment_ids, mb.subtree_end, mb.pred_index)

  def _outputs(self, params: dict, rest, mb: DeviceBatch) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """(log-prob, entropy, value or None) of the micro-batch's loss tokens, [r, K] each."""
    logp, entropy, h = self._policy_tokens(params["policy"], rest, mb)
    values = self._values(params["value"], rest, mb, h) if self.value_def is not None else None
    return logp, entropy, values

  def _old_of(self, state: TrainState, rest, mb: DeviceBatch, logp: jax.Array, values: jax.Array | None
              ) -> dict[str, jax.Array]:
    """pi_old (and V_old, pi_ref) of a micro-batch, from the current params' outputs (gradient stopped)."""
    out = {"logp_old": logp}
    if values is not None:
      out["values_old"] = values
    if self.cfg.kl_coef:
      out["logp_ref"] = self._policy_tokens(state.ref_params, rest, mb)[0]
    return jax.lax.stop_gradient(out)

  def _old_pass(self, state: TrainState, batch: DeviceBatch, rest) -> dict[str, jax.Array]:
    """pi_old (and V_old, pi_ref) for every micro-batch, [M, r, K] each, before any update."""

    def one(mb: DeviceBatch) -> dict[str, jax.Array]:
      logp, _, values = self._outputs(state.params, rest, mb)
      return self._old_of(state, rest, mb, logp, values)

    return jax.lax.map(one, batch)

  def _micro_loss(self, params: dict, rest, mb: DeviceBatch, old: dict, norm: jax.Array, rng: jax.Array):
    return self._token_loss(self._outputs(params, rest, mb), mb, old, norm, rng)

  def _token_loss(self, outputs: tuple, mb: DeviceBatch, old: dict, norm: jax.Array, rng: jax.Array):
    logp, entropy, values = outputs
    w_tis, _ = tis_weights(old["logp_old"], mb.logp_rollout, self.cfg.c_bar)
    x = TokenInputs(logp=logp, logp_old=old["logp_old"], logp_rollout=mb.logp_rollout, advantages=mb.advantages,
                    returns=mb.returns, mask=mb.weight > 0, entropy=entropy, values=values,
                    values_old=old.get("values_old"), logp_ref=old.get("logp_ref"), rng=rng)
    terms = self.loss_spec.fn(x, self.cfg)
    token_loss = w_tis * terms.policy + terms.extra
    metrics = {k: _masked_mean(v, mb.weight, norm) for k, v in terms.metrics.items()}
    metrics["entropy"] = _masked_mean(entropy, mb.weight, norm)
    return _masked_mean(token_loss, mb.weight, norm), metrics

  def _accumulate(self, loss_fn, params: Any, batch: DeviceBatch, old: dict, norm: jax.Array):
    """sum over micro-batches of (loss, grad, metrics) of loss_fn(params, mb, old_mb), in a scan."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, metrics), grads = _scan_sum(lambda xs: grad_fn(params, *xs, norm), (batch, old))
    return loss, grads, metrics

  def _loss_fn(self, state: TrainState, batch: DeviceBatch, rest) -> dict[str, jax.Array]:
    norm = _normaliser(batch)
    _, step_rng = jax.random.split(state.rng)

    def one(mb: DeviceBatch):
      outputs = self._outputs(state.params, rest, mb)
      old = self._old_of(state, rest, mb, outputs[0], outputs[2])  # pi_old: these very params
      return self._token_loss(outputs, mb, old, norm, step_rng)

    loss, metrics = _scan_sum(one, batch)
    return dict(metrics, loss=loss, loss_weight=jnp.sum(batch.weight), tokens=_trunk_tokens(batch))

  def _loss_and_grads_fn(self, state: TrainState, batch: DeviceBatch, rest):
    old = self._old_pass(state, batch, rest)
    norm = _normaliser(batch)
    _, step_rng = jax.random.split(state.rng)
    loss_fn = lambda p, mb, o, n: self._micro_loss(p, rest, mb, o, n, step_rng)
    loss, grads, metrics = self._accumulate(loss_fn, state.params, batch, old, norm)
    metrics.update(self._tis_metrics(batch, old, norm))
    metrics["loss"] = loss
    metrics.update(_grad_norms(grads))
    metrics["tokens"] = _trunk_tokens(batch)
    return loss, grads, metrics

  def _tis_metrics(self, batch: DeviceBatch, old: dict, norm: jax.Array) -> dict[str, jax.Array]:
    _, truncated = tis_weights(old["logp_old"], batch.logp_rollout, self.cfg.c_bar)
    diff = jnp.abs(old["logp_old"] - batch.logp_rollout)
    return {"tis_truncated_fraction": _masked_mean(truncated.astype(jnp.float32), batch.weight, norm),
            "mean_abs_logp_old_minus_rollout": _masked_mean(diff, batch.weight, norm),
            "max_abs_logp_old_minus_rollout": jnp.max(jnp.where(batch.weight > 0, diff, 0.0))}

  def _train_fn(self, state: TrainState, batch: DeviceBatch, rest):
    cfg = self.cfg
    micro = batch.tokens.shape[0]
    if micro % cfg.minibatches:
      raise ValueError(f"the DeviceBatch has {micro} micro-batches: LearnerConfig.minibatches="
                       f"{cfg.minibatches} must divide it (prepare it with this learner's config)")
    old = self._old_pass(state, batch, rest)
    norm = _normaliser(batch)
    rng, step_rng = jax.random.split(state.rng)
    n = cfg.epochs * cfg.minibatches
    # Update u's loss key is fold_in(step key, u), except that update 0 keeps the step key itself (what a
    # one-update step has always used); epoch e's shuffle key is fold_in(step key, n + e).
    keys = jax.vmap(jax.random.fold_in, (None, 0))(step_rng, jnp.arange(n + cfg.epochs)).at[0].set(step_rng)
    update_keys = keys[:n].reshape(cfg.epochs, cfg.minibatches, *keys.shape[1:])

    def update(carry, xs):
      params, opt_state = carry
      mb_batch, mb_old, key = xs
      mb_norm = _normaliser(mb_batch)
      loss_fn = lambda p, mb, o, mb_n: self._micro_loss(p, rest, mb, o, mb_n, key)
      loss, grads, metrics = self._accumulate(loss_fn, params, mb_batch, mb_old, mb_norm)
      norms = _grad_norms(grads)  # before clipping
      # A non-finite loss or gradient (a broken batch) must not reach the weights: the update is skipped,
      # parameters and optimizer state stay bit for bit, and it is counted.
      finite = jnp.isfinite(loss) & jnp.all(jnp.isfinite(jnp.stack(list(norms.values()))))
      new_params, new_opt_state = {}, {}
      for name, tx in self.txs.items():
        updates, new_opt_state[name] = tx.update(grads[name], opt_state[name], params[name])
        new_params[name] = optax.apply_updates(params[name], updates)
      keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
      share = mb_norm / norm  # rescales minibatch means so that an epoch's sum is the batch mean
      metrics = {k: v * share for k, v in dict(metrics, loss=loss).items()}
      metrics.update({name: v / cfg.minibatches for name, v in norms.items()})
      metrics["skipped"] = 1.0 - finite.astype(jnp.float32)
      return (keep(new_params, params), keep(new_opt_state, opt_state)), metrics

    def epoch(carry, xs):
      shuffle_key, keys_e = xs
      data = (batch, old)
      if cfg.shuffle:
        perm = jax.random.permutation(shuffle_key, batch.tokens.shape[0] * batch.tokens.shape[1])
        data = jax.tree.map(functools.partial(_deal_rows, perm), data)
      minibatches = jax.tree.map(lambda x: x.reshape(cfg.minibatches, -1, *x.shape[1:]), data)
      return jax.lax.scan(update, carry, (*minibatches, keys_e))

    (params, opt_state), per_update = jax.lax.scan(epoch, (state.params, state.opt_state),
                                                   (keys[n:], update_keys))
    skipped = jnp.sum(per_update.pop("skipped"))
    metrics = {k: jnp.sum(v[0]) for k, v in per_update.items()}
    if cfg.epochs > 1:
      metrics.update({f"{k}_last": jnp.sum(v[-1]) for k, v in per_update.items()})
    metrics.update(self._tis_metrics(batch, old, norm))
    metrics["tokens"] = _trunk_tokens(batch)
    metrics["updates"] = n - skipped
    metrics["skipped_updates"] = skipped
    new = dataclasses.replace(state, params=params, opt_state=opt_state,
                              step=state.step + n - skipped.astype(jnp.int32), rng=rng)
    return new, metrics

  def _pretrain_fn(self, state: TrainState, batch: DeviceBatch, rest):
    norm = _normaliser(batch)
    policy = jax.lax.stop_gradient(state.params["policy"])

    def loss_fn(value_params, mb, _, n):
      _, _, h = self._policy_tokens(policy, rest, mb)
      v = self._values(value_params, rest, mb, h)
      return _masked_mean(value_loss(v, v, mb.returns, None), mb.weight, n), {}

    loss, grads, _ = self._accumulate(loss_fn, state.params["value"], batch, {}, norm)
    updates, value_opt_state = self.value_tx.update(grads, state.value_opt_state, state.params["value"])
    params = dict(state.params, value=optax.apply_updates(state.params["value"], updates))
    return dataclasses.replace(state, params=params, value_opt_state=value_opt_state), {
        "value_loss": loss, "grad_norm": optax.global_norm(grads)}
