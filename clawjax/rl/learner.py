"""The sharded train step: pi_old pass, then epochs x minibatches optimizer updates with accumulation.

One `Learner.step(packed_batch)` is two jitted calls over a Mesh:
  1. pi_old pass (`old_pass`, no gradient, micro-batch by micro-batch): logp_old with the current params,
     V_old and log pi_ref where needed, frozen for every update of the step. TIS weights
     w_t = min(exp(logp_old - logp_rollout), c_bar) come from it. An RL step of several packed batches
     passes each batch the pass made before its first update (`step(batch, old)`,
     clawjax.train.steps.update): pi_old is the policy the step started from, as in verl, slime and AReaL.
  2. `epochs` passes over the batch (a scan), each a scan over `minibatches` optimizer updates. A
     minibatch is a run of the batch's rows (whole rows: tokens of a tree row share prefixes; each
     process's rows split evenly, clawjax.rl.device_batch.RowLayout) laid out as consecutive
     micro-batches, or with `shuffle` a random deal of whole rows per epoch keyed by the rows' places in
     the batch: neither depends on `micro_batches` or the row shards. Each update: a scan over the
     minibatch's micro-batches, each adding sum(weight * token_loss) / N to the loss and its gradient,
     N = the sum of the slots' normaliser shares (`norm`; the weight sum, except for the "constant"
     aggregation) over the *minibatch*, so k micro-batches equal one big minibatch; then clip and
     optimizer update. The defaults (1 epoch, 1 minibatch) are one update on the whole batch. A
     minibatch without loss tokens (padding rows only) is not an update: AdamW would still move the
     weights (moments, weight decay), so parameters and optimizer state are left as they were and it is
     not counted.
  3. Metrics: each loss metric is its weighted mean over the first epoch (every loss token once, seen
     by the params of its minibatch's update: with one minibatch the step's first params), with
     `<name>_last` over the last epoch when epochs > 1; grad_norm (the policy's) and value_grad_norm
     (the critic's) are means over an epoch's updates with loss tokens; `updates` counts optimizer
     updates applied and `skipped_updates` those skipped. The train state's buffers are donated.
The policy and the critic have an optimizer each (learning rates `lr` and `value.lr`, each clipped by
its own gradient norm). An update whose loss or gradient is not finite is skipped: parameters and
optimizer state are left exactly as they were.
Params and optimizer state are laid out by clawjax.sharding's logical-axis rules; batch rows are split
over the data and fsdp mesh axes. In a run of several processes (clawjax.distributed) the mesh spans
every process's devices and each process prepares only its own rows (`prepare_all`); N is the weight sum
over the global batch, so the step equals the one-process step on the same rows (up to float32
summation order). A caller that splits one global batch over the processes feeds each process the rows
`process_rows` names: every minibatch then holds the rows of the one-process step.
`loss(batch)` is the loss at the current params without a gradient (a held-out loss): one forward pass
per micro-batch, whose outputs also stand for pi_old (the same params).
Routing replay (`LearnerConfig.routing_replay`, clawjax.models.routing): a MoE policy's batches carry the
engine's expert ids (`prepare` picks the MoE layers' out of what the engine logged), and every trunk pass
forces them: pi_old, pi_ref, each update's forward and backward, a MoE critic trunk with the policy's
routing shape. The pi_old pass counts, per row, the positions the loss depends on (all but padding and
each leaf's last token), those replayed, and the (token, MoE layer) pairs where the policy's own top-k
differs: the step's `routing/replayed_frac`, `routing/disagree_frac` and `routing/tokens_any_disagree`
(the share of replayed tokens with a differing layer).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clawjax import distributed, sharding
from clawjax.models.routing import Replay
from clawjax.rl.config import LearnerConfig
from clawjax.rl.device_batch import (BatchShape, DeviceBatch, RowLayout, agree_shapes, batch_shape, empty_batch,
                                     prepare_batch, process_share)
from clawjax.rl.logprobs import gather_rows, token_logprobs
from clawjax.rl.replay import ReplaySetup, routing_metrics, routing_stats
from clawjax.rl.losses import TokenInputs, check_loss, tis_weights, value_loss
from clawjax.rl.value import values_at
from clawjax.tree.batch import PackedBatch


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: dict[str, nnx.State]      # "policy", and "value" when the config has a critic
  opt_state: Any
  step: jax.Array                   # int32 scalar: optimizer updates applied (epochs x minibatches a step at most)
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


def _normaliser(batch: DeviceBatch) -> dict[str, jax.Array]:
  """The loss's normaliser N (the sum of the slots' `norm`) and the metrics' (the weight sum) over all
  micro-batches (1 for a batch without loss tokens)."""
  nonzero = lambda n: jnp.where(n > 0, n, 1.0)
  return {"loss": nonzero(jnp.sum(batch.norm)), "metrics": nonzero(jnp.sum(batch.weight))}


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


def _flat_rows(x: jax.Array) -> jax.Array:
  """[M, r, ...] -> [M x r, ...]."""
  return x.reshape(-1, *x.shape[2:])


def _shuffled_rows(key: jax.Array, row_order: jax.Array) -> jax.Array:
  """An epoch's deal of whole rows into minibatches, as indices into the [M x r] rows: the rows sorted by
  a uniform draw keyed by their place in the global order (fold_in(key, place)) take the places in that
  order, so the slot of place g gets the row drawn g-th; empty padding rows stay where they are. The
  deal depends on the key and the rows' places only, not on micro-batches or row shards."""
  order = row_order.reshape(-1)
  real = order >= 0
  place = jnp.maximum(order, 0)
  draw = jax.vmap(lambda g: jax.random.uniform(jax.random.fold_in(key, g)))(place)
  drawn = jnp.argsort(jnp.where(real, draw, jnp.inf))  # the rows in draw order, padding last
  return jnp.where(real, drawn[place], jnp.arange(order.size))


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
    self.aggregation = self.loss_spec.aggregation_of(cfg)
    self.replay = ReplaySetup(cfg.routing_replay, getattr(policy, "cfg", None),
                              getattr(getattr(value, "trunk", None), "cfg", None))
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

    ndim = {"row_order": 2, "routes": 5}
    batch_sh = DeviceBatch(**{f.name: sharding.batch_sharding(self.mesh, ndim.get(f.name, 3), leading=1)
                              for f in dataclasses.fields(DeviceBatch)})
    self.batch_sharding = batch_sh
    old_sh = sharding.batch_sharding(self.mesh, 3, leading=1)  # pi_old and the like: [M, r, K] as the batch's
    self._row_shards = sharding.local_row_shards(self.mesh)  # the row shards this process feeds
    traced = lambda fn: sharding.under_mesh(fn, self.mesh, rules)  # activation constraints active
    self._old = jax.jit(traced(self._old_pass), in_shardings=(self.state_sharding, batch_sh, None),
                        out_shardings=old_sh)
    self._train = jax.jit(traced(self._train_fn), in_shardings=(self.state_sharding, batch_sh, None, old_sh),
                          out_shardings=(self.state_sharding, replicated), donate_argnums=0)
    self._loss_and_grads = jax.jit(traced(self._loss_and_grads_fn),
                                   in_shardings=(self.state_sharding, batch_sh, None, old_sh),
                                   out_shardings=(replicated, param_sh, replicated))
    self._loss = jax.jit(traced(self._loss_fn), in_shardings=(self.state_sharding, batch_sh, None),
                         out_shardings=replicated)
    self._pretrain = jax.jit(traced(self._pretrain_fn), in_shardings=(self.state_sharding, batch_sh, None),
                             out_shardings=(self.state_sharding, replicated), donate_argnums=0)

  # ---- host API -------------------------------------------------------------------------------------

  def prepare(self, batch: PackedBatch) -> DeviceBatch:
    """Host-side: compact and lay out a PackedBatch, then place it on the mesh. The loss slots per
    row only grow, to the most any batch so far needed (in logits_chunk steps), so that the step
    compiles for a few shapes, not one per batch. With several processes every process calls it at the
    same point, each with its own rows (`prepare_all`)."""
    return self.prepare_all([batch])[0]

  def prepare_all(self, batches: Sequence[PackedBatch]) -> list[DeviceBatch]:
    """`prepare` for a list of batches: one learner step each, all in one shape of loss slots.

    With several processes, every process calls it once per RL step with its own batches (its groups'
    rows; any number, none included) and gets the same number back: the most any process passed. Batch
    i of the global step is every process's batch i, laid out by `RowLayout` (each process's rows split
    evenly over the minibatches) and padded to the row length and loss slots that the largest needs; a
    process with fewer batches contributes empty rows only. No process holds the others' rows; each
    global array is assembled from the processes' own parts (`jax.make_array_from_process_local_data`)."""
    cfg = self.cfg
    batches = [self.replay.routes_of(b) for b in batches]
    own = [batch_shape(b, chunk=cfg.logits_chunk) for b in batches]
    everyone = distributed.allgather_json([dataclasses.astuple(s) for s in own])
    shapes = agree_shapes([[BatchShape(*s) for s in shapes] for shapes in everyone])
    self._loss_slots = max([self._loss_slots] + [s.loss_slots for s in shapes])
    process = distributed.process_index()
    weighting = dict(aggregation=self.aggregation, aggregation_tokens=cfg.aggregation_tokens,
                     whole_rollouts=self.loss_spec.sequence, chunk=cfg.logits_chunk)
    local = []
    for i, shape in enumerate(shapes):
      layout, size = self._layout(shape.counts), dict(length=shape.length, loss_slots=self._loss_slots,
                                                      routes=self.replay.layout(shape.route_bytes))
      local.append(prepare_batch(batches[i], layout, process=process, **weighting, **size) if i < len(batches)
                   else empty_batch(layout, process, **size))
    # (A batch without routes has no routes arrays: its sharding has none either.)
    placed = lambda b: self.batch_sharding if b.routes is not None else dataclasses.replace(
        self.batch_sharding, routes=None, routed=None)
    return [jax.make_array_from_process_local_data(placed(b), b) for b in local]

  def _layout(self, counts: Sequence[int]) -> RowLayout:
    """The layout of a global batch whose processes have `counts` rows."""
    return RowLayout(tuple(counts), minibatches=self.cfg.minibatches, micro_batches=self.cfg.micro_batches,
                     local_shards=len(self._row_shards))

  def process_rows(self, rows: int) -> list[int]:
    """The rows of a global batch of `rows` rows that this process feeds, in the order it passes them to
    `prepare`: its share (`process_share`), chosen so that every minibatch holds the rows it holds in a
    one-process run (exactly so when minibatches x processes divides `rows`). With one process: 0 .. rows - 1."""
    processes = distributed.process_count()
    layout = self._layout([process_share(rows, processes, p) for p in range(processes)])
    return layout.order()[distributed.process_index()].tolist()

  def old_pass(self, batch: PackedBatch | DeviceBatch) -> dict[str, jax.Array]:
    """pi_old (and V_old, log pi_ref where needed) of the batch's loss tokens at the current params, for
    `step`: a step of several batches computes each one's before the first update."""
    batch = self.prepare(batch) if isinstance(batch, PackedBatch) else batch
    return self._old(self.state, batch, self.rest)

  def step(self, batch: PackedBatch | DeviceBatch, old: dict[str, jax.Array] | None = None) -> dict[str, float]:
    """One step (epochs x minibatches updates) against `old` (`old_pass`; default: at the current params);
    returns the metrics (host floats) including grad_norm, updates and tokens_per_s (batch tokens per
    second of the step, the pi_old pass included only when it is not passed in)."""
    batch = self.prepare(batch) if isinstance(batch, PackedBatch) else batch
    start = time.perf_counter()
    old = self._old(self.state, batch, self.rest) if old is None else old
    self.state, metrics = self._train(self.state, batch, self.rest, old)
    metrics = jax.device_get(metrics)
    seconds = time.perf_counter() - start
    out = {k: float(v) for k, v in metrics.items()}
    out["step_seconds"] = seconds
    out["tokens_per_s"] = out["tokens"] / seconds
    return out

  def loss_and_grads(self, batch: PackedBatch | DeviceBatch, old: dict[str, jax.Array] | None = None
                     ) -> tuple[float, dict, dict[str, float]]:
    """Loss, gradient and metrics of one update on the whole batch at the current params, without
    updating (the step's update with the default 1 epoch x 1 minibatch; for checks and benchmarks),
    against `old` (`old_pass`, of this learner or another; default: at the current params, where every
    ratio pi_theta / pi_old is 1)."""
    batch = self.prepare(batch) if isinstance(batch, PackedBatch) else batch
    old = self._old(self.state, batch, self.rest) if old is None else old
    loss, grads, metrics = self._loss_and_grads(self.state, batch, self.rest, old)
    return float(loss), grads, {k: float(v) for k, v in jax.device_get(metrics).items()}

  def loss(self, batch: PackedBatch | DeviceBatch) -> dict[str, float]:
    """The loss of the whole batch at the current params and its metrics, forward passes only, with
    `loss_weight` (the loss's normaliser N over every process's rows) and `tokens`."""
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

  @staticmethod
  def _replay_of(mb: DeviceBatch) -> Replay | None:
    return None if mb.routes is None else Replay(mb.routes, mb.routed & (mb.segment_ids > 0))

  def _policy_tokens(self, policy_params: nnx.State, rest, mb: DeviceBatch):
    """(log-prob, entropy, hidden state of the loss tokens, routing stats per row [r, 4] or None)."""
    model = nnx.merge(self.policy_def, policy_params, rest[0])
    replay, stats = self._replay_of(mb), None
    if replay is None:
      hidden = model.hidden(mb.tokens, mb.positions, mb.segment_ids, mb.subtree_end)
    else:
      hidden, disagree = model.routed_hidden(mb.tokens, mb.positions, mb.segment_ids, mb.subtree_end, replay)
      stats = routing_stats(mb.segment_ids, mb.subtree_end, replay.replay_BT, disagree)
    h_RKD = gather_rows(hidden, mb.pred_index)
    logp, entropy = token_logprobs(model.logits, h_RKD, mb.targets, self.cfg.temperature, self.cfg.logits_chunk,
                                   entropy_grad=self.loss_spec.entropy_grad)
    return logp, entropy, h_RKD, stats

  def _values(self, value_params: nnx.State, rest, mb: DeviceBatch, h_RKD: jax.Array) -> jax.Array:
    value_model = nnx.merge(self.value_def, value_params, rest[1])
    replay = self._replay_of(mb) if self.replay.critic else None
    return values_at(value_model, h_RKD, mb.tokens, mb.positions, mb.segment_ids, mb.subtree_end, mb.pred_index,
                     replay)

  def _outputs(self, params: dict, rest, mb: DeviceBatch) -> tuple[jax.Array, jax.Array, jax.Array | None, Any]:
    """(log-prob, entropy, value or None, routing stats or None) of the micro-batch's loss tokens, [r, K]
    each (the stats [r, 4])."""
    logp, entropy, h, stats = self._policy_tokens(params["policy"], rest, mb)
    values = self._values(params["value"], rest, mb, h) if self.value_def is not None else None
    return logp, entropy, values, stats

  def _old_of(self, state: TrainState, rest, mb: DeviceBatch, logp: jax.Array, values: jax.Array | None,
              routing: jax.Array | None = None) -> dict[str, jax.Array]:
    """pi_old (and V_old, pi_ref, the routing stats) of a micro-batch, from the current params' outputs
    (gradient stopped)."""
    out = {"logp_old": logp}
    if values is not None:
      out["values_old"] = values
    if routing is not None:
      out["routing"] = routing
    if self.cfg.kl_coef:
      out["logp_ref"] = self._policy_tokens(state.ref_params, rest, mb)[0]
    return jax.lax.stop_gradient(out)

  def _old_pass(self, state: TrainState, batch: DeviceBatch, rest) -> dict[str, jax.Array]:
    """pi_old (and V_old, pi_ref, the routing stats) for every micro-batch, [M, r, K] each, before any update."""

    def one(mb: DeviceBatch) -> dict[str, jax.Array]:
      logp, _, values, routing = self._outputs(state.params, rest, mb)
      return self._old_of(state, rest, mb, logp, values, routing)

    return jax.lax.map(one, batch)

  def _token_loss(self, outputs: tuple, mb: DeviceBatch, old: dict, norm: dict[str, jax.Array], rng: jax.Array):
    logp, entropy, values, _ = outputs
    w_tis, _ = tis_weights(old["logp_old"], mb.logp_rollout, self.cfg.c_bar)
    x = TokenInputs(logp=logp, logp_old=old["logp_old"], logp_rollout=mb.logp_rollout, advantages=mb.advantages,
                    returns=mb.returns, mask=mb.weight > 0, entropy=entropy, values=values,
                    values_old=old.get("values_old"), logp_ref=old.get("logp_ref"), rng=rng, tis=w_tis,
                    baselines=mb.baselines, rollout=mb.rollout, unique_weight=mb.unique_weight,
                    path_weight=mb.path_weight)
    terms = self.loss_spec(x, self.cfg)
    token_loss = (terms.policy if terms.owns_tis else w_tis * terms.policy) + terms.extra
    metrics = {k: _masked_mean(v, mb.weight, norm["metrics"]) for k, v in terms.metrics.items()}
    metrics["entropy"] = _masked_mean(entropy, mb.weight, norm["metrics"])
    return _masked_mean(token_loss, mb.weight, norm["loss"]), metrics

  def _micro_grads(self, params: dict, rest, mb: DeviceBatch, old: dict, norm: dict[str, jax.Array], rng: jax.Array):
    """((loss, metrics), grads) of one micro-batch's loss.

    With `value.two_pass` (a critic with its own trunk) the critic's gradient is taken after the policy's
    backward, from a second forward of its trunk: taken jointly, both trunks' saved activations are live
    from the forward to the backward, twice a trunk's memory for the price of one critic forward."""
    if not self.cfg.value.two_pass:
      loss_fn = lambda p: self._token_loss(self._outputs(p, rest, mb), mb, old, norm, rng)
      return jax.value_and_grad(loss_fn, has_aux=True)(params)
    critic = lambda value_params: self._values(value_params, rest, mb, None)

    def loss_of(policy_params: nnx.State, values: jax.Array):
      logp, entropy, _, _ = self._policy_tokens(policy_params, rest, mb)
      return self._token_loss((logp, entropy, values, None), mb, old, norm, rng)

    out, (policy_grads, values_grad) = jax.value_and_grad(loss_of, argnums=(0, 1), has_aux=True)(
        params["policy"], critic(params["value"]))
    # The barrier orders the critic's second forward after the policy's backward: XLA may neither start it
    # earlier nor merge it with the first forward (its parameters come out of the barrier).
    policy_grads, values_grad, value_params = jax.lax.optimization_barrier(
        (policy_grads, values_grad, params["value"]))
    _, critic_vjp = jax.vjp(critic, value_params)
    return out, {"policy": policy_grads, "value": critic_vjp(values_grad)[0]}

  @staticmethod
  def _accumulate(grad_fn, batch: DeviceBatch, old: dict, norm: dict[str, jax.Array]):
    """sum over micro-batches of (loss, grad, metrics), grad_fn(mb, old_mb, norm) giving each
    ((loss, metrics), grads), in a scan."""
    (loss, metrics), grads = _scan_sum(lambda xs: grad_fn(*xs, norm), (batch, old))
    return loss, grads, metrics

  def _loss_fn(self, state: TrainState, batch: DeviceBatch, rest) -> dict[str, jax.Array]:
    norm = _normaliser(batch)
    _, step_rng = jax.random.split(state.rng)

    def one(mb: DeviceBatch):
      outputs = self._outputs(state.params, rest, mb)
      old = self._old_of(state, rest, mb, outputs[0], outputs[2])  # pi_old: these very params
      return self._token_loss(outputs, mb, old, norm, step_rng)

    loss, metrics = _scan_sum(one, batch)
    return dict(metrics, loss=loss, loss_weight=jnp.sum(batch.norm), tokens=_trunk_tokens(batch))

  def _loss_and_grads_fn(self, state: TrainState, batch: DeviceBatch, rest, old: dict[str, jax.Array]):
    norm = _normaliser(batch)
    _, step_rng = jax.random.split(state.rng)
    grad_fn = lambda mb, o, n: self._micro_grads(state.params, rest, mb, o, n, step_rng)
    loss, grads, metrics = self._accumulate(grad_fn, batch, old, norm)
    metrics.update(self._tis_metrics(batch, old, norm))
    metrics["loss"] = loss
    metrics.update(_grad_norms(grads))
    metrics["tokens"] = _trunk_tokens(batch)
    return loss, grads, metrics

  def _tis_metrics(self, batch: DeviceBatch, old: dict, norm: dict[str, jax.Array]) -> dict[str, jax.Array]:
    _, truncated = tis_weights(old["logp_old"], batch.logp_rollout, self.cfg.c_bar)
    diff = jnp.abs(old["logp_old"] - batch.logp_rollout)
    out = {"tis_truncated_fraction": _masked_mean(truncated.astype(jnp.float32), batch.weight, norm["metrics"]),
           "mean_abs_logp_old_minus_rollout": _masked_mean(diff, batch.weight, norm["metrics"]),
           "max_abs_logp_old_minus_rollout": jnp.max(jnp.where(batch.weight > 0, diff, 0.0))}
    if "routing" in old:
      out.update(routing_metrics(old["routing"], self.replay.moe_layers))
    return out

  def _train_fn(self, state: TrainState, batch: DeviceBatch, rest, old: dict[str, jax.Array]):
    cfg = self.cfg
    micro = batch.tokens.shape[0]
    if micro % cfg.minibatches:
      raise ValueError(f"the DeviceBatch has {micro} micro-batches: LearnerConfig.minibatches="
                       f"{cfg.minibatches} must divide it (prepare it with this learner's config)")
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
      grad_fn = lambda mb, o, mb_n: self._micro_grads(params, rest, mb, o, mb_n, key)
      loss, grads, metrics = self._accumulate(grad_fn, mb_batch, mb_old, mb_norm)
      norms = _grad_norms(grads)  # before clipping
      # A minibatch without loss tokens (padding rows only) has nothing to learn from, but AdamW would
      # still move the weights (its moments and weight decay): it is not an update. A non-finite loss or
      # gradient (a broken batch) must not reach the weights either: that update is skipped, and counted.
      # Either way parameters and optimizer state stay bit for bit.
      trained = jnp.sum(mb_batch.weight) > 0
      finite = jnp.isfinite(loss) & jnp.all(jnp.isfinite(jnp.stack(list(norms.values()))))
      new_params, new_opt_state = {}, {}
      for name, tx in self.txs.items():
        updates, new_opt_state[name] = tx.update(grads[name], opt_state[name], params[name])
        new_params[name] = optax.apply_updates(params[name], updates)
      keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(trained & finite, a, b), new, old)
      # Rescales minibatch means so that an epoch's sum is the batch mean.
      share = {k: mb_norm[k] / norm[k] for k in norm}
      metrics = {k: v * share["metrics"] for k, v in metrics.items()}
      metrics["loss"] = loss * share["loss"]
      metrics.update({name: jnp.where(trained, v, 0.0) for name, v in norms.items()})
      metrics["skipped"] = (trained & ~finite).astype(jnp.float32)
      metrics["empty"] = 1.0 - trained.astype(jnp.float32)
      return (keep(new_params, params), keep(new_opt_state, opt_state)), metrics

    def epoch(carry, xs):
      shuffle_key, keys_e = xs
      data = (batch, old)
      if cfg.shuffle:
        rows = _shuffled_rows(shuffle_key, batch.row_order)
        data = jax.tree.map(lambda x: jnp.take(_flat_rows(x), rows, axis=0).reshape(x.shape), data)
      minibatches = jax.tree.map(lambda x: x.reshape(cfg.minibatches, -1, *x.shape[1:]), data)
      return jax.lax.scan(update, carry, (*minibatches, keys_e))

    (params, opt_state), per_update = jax.lax.scan(epoch, (state.params, state.opt_state),
                                                   (keys[n:], update_keys))
    skipped, empty = jnp.sum(per_update.pop("skipped")), per_update.pop("empty")
    applied = n - skipped - jnp.sum(empty)
    counted = jnp.maximum(jnp.sum(1.0 - empty, axis=1), 1.0)  # [epochs] minibatches with loss tokens
    norm_names = [k for k in per_update if k.endswith("grad_norm")]
    metrics = self._epoch_metrics(per_update, norm_names, counted, 0, "")
    if cfg.epochs > 1:
      metrics.update(self._epoch_metrics(per_update, norm_names, counted, -1, "_last"))
    metrics.update(self._tis_metrics(batch, old, norm))
    metrics["tokens"] = _trunk_tokens(batch)
    metrics["updates"] = applied
    metrics["skipped_updates"] = skipped
    new = dataclasses.replace(state, params=params, opt_state=opt_state,
                              step=state.step + applied.astype(jnp.int32), rng=rng)
    return new, metrics

  @staticmethod
  def _epoch_metrics(per_update: dict[str, jax.Array], norm_names: list[str], counted: jax.Array, e: int,
                     suffix: str) -> dict[str, jax.Array]:
    """Epoch e's metrics: loss metrics summed (they are shares of the batch mean), gradient norms averaged
    over the minibatches that had loss tokens."""
    return {f"{k}{suffix}": jnp.sum(v[e]) / (counted[e] if k in norm_names else 1.0) for k, v in per_update.items()}

  def _pretrain_fn(self, state: TrainState, batch: DeviceBatch, rest):
    norm = _normaliser(batch)
    policy = jax.lax.stop_gradient(state.params["policy"])

    def loss_fn(value_params, mb, _, n):
      # A critic with its own trunk reads nothing of the policy's: no policy pass (nor vocab projection).
      h = None if self.cfg.value.kind == "separate" else self._policy_tokens(policy, rest, mb)[2]
      v = self._values(value_params, rest, mb, h)
      return _masked_mean(value_loss(v, v, mb.returns, None), mb.weight, n["metrics"]), {}

    grad_fn = lambda mb, o, n: jax.value_and_grad(loss_fn, has_aux=True)(state.params["value"], mb, o, n)
    loss, grads, _ = self._accumulate(grad_fn, batch, {}, norm)
    updates, value_opt_state = self.value_tx.update(grads, state.value_opt_state, state.params["value"])
    params = dict(state.params, value=optax.apply_updates(state.params["value"], updates))
    return dataclasses.replace(state, params=params, value_opt_state=value_opt_state), {
        "value_loss": loss, "grad_norm": optax.global_norm(grads)}
