"""What a loss author relies on: options declared and checked, the aggregation named and checked (the old
`normalisation` still read), a loss's own aggregation, the entropy's gradient only where asked for, a
sequence-level loss refused on a batch that splits a rollout."""
from __future__ import annotations

import pytest

from clawjax.config import ConfigError
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.rl.loss_check import example_batch, example_trees, tiny_policy
from clawjax.rl.losses import LOSSES, LossTerms, check_loss, register_loss
from clawjax.tree.pack import pack_paths
from clawjax.train.config import train_config
from tests.train.test_configs import QUICKSTART, _load


def _config(*overrides: str):
  return train_config(_load(QUICKSTART).get_config(), list(overrides))


@pytest.mark.parametrize("overrides, message", [
    (["learner.loss_kwargs.advantage_sdt=False"],
     r"^config\.learner\.loss_kwargs\.advantage_sdt: unknown field; did you mean advantage_std\?$"),
    (["learner.loss_kwargs.advantage_std='no'"], r"^config\.learner\.loss_kwargs\.advantage_std: expected bool"),
    (["learner.loss=cispo", "learner.loss_kwargs.eps_hgh=0.3"],
     r"^config\.learner\.loss_kwargs\.eps_hgh: unknown field; did you mean eps_high\?$"),
    (["learner.loss=gspo", "learner.loss_kwargs.tis=seq"], r"^config\.learner\.loss_kwargs: .*tis='seq'"),
    (["learner.loss=sft", "learner.loss_kwargs.beta=0.1"],
     r"^config\.learner\.loss_kwargs: loss 'sft' declares no options, got \['beta'\]$"),
    (["learner.aggregation=tokens"],
     r"^config\.learner: LearnerConfig\.aggregation='tokens': use one of \('token', 'paths', 'rollout', "
     r"'constant'\); did you mean 'token'\?$"),
    (["learner.normalisation=path"], r"^config\.learner: LearnerConfig\.normalisation='path': .*did you mean 'paths'"),
    (["learner.aggregation=constant"], r"^config\.learner: .*'constant' needs aggregation_tokens"),
    (["learner.normalisation=unique", "learner.aggregation=rollout"], r"contradicts aggregation='rollout'"),
])
def test_bad_loss_options_and_aggregations_are_one_line_errors(overrides, message):
  with pytest.raises(ConfigError, match=message) as err:
    _config(*overrides)
  assert "\n" not in str(err.value)


def test_options_and_aggregations_are_read_as_given():
  cfg = _config("learner.loss_kwargs.advantage_std=False")
  assert LOSSES["grpo"].options_of(cfg.learner).advantage_std is False
  cfg = _config("learner.loss=gspo", "learner.loss_kwargs={'eps_high': 1e-3, 'weight': 'paths'}")
  opt = LOSSES["gspo"].options_of(cfg.learner)
  assert (opt.eps_low, opt.eps_high, opt.weight, opt.tis) == (3e-4, 1e-3, "paths", "token")
  # Unset, a loss's own aggregation applies (gspo: the paper's per-rollout mean), else "token"; a named
  # one always does; the old field names the old two.
  assert check_loss(_config("learner.loss=gspo").learner).aggregation_of(_config("learner.loss=gspo").learner) == "rollout"
  for overrides, want in ((["learner.loss=gspo", "learner.aggregation=token"], "token"), ([], "token"),
                          (["learner.normalisation=paths"], "paths"), (["learner.normalisation=unique"], "token"),
                          (["learner.aggregation=constant", "learner.aggregation_tokens=4096"], "constant")):
    learner = _config(*overrides).learner
    assert check_loss(learner).aggregation_of(learner) == want, overrides


def test_an_entropy_bonus_moves_the_policy_only_where_its_gradient_is_asked_for():
  for name, grad in (("test_entropy_bonus", True), ("test_entropy_bonus_constant", False)):
    if name not in LOSSES:
      register_loss(name, entropy_grad=grad)(lambda x, cfg: LossTerms(policy=-0.01 * x.entropy))
  batch = example_batch()
  norms = {name: Learner(LearnerConfig(loss=name, logits_chunk=64), tiny_policy()).loss_and_grads(batch)[2]["grad_norm"]
           for name in ("test_entropy_bonus", "test_entropy_bonus_constant")}
  assert norms["test_entropy_bonus"] > 0 and norms["test_entropy_bonus_constant"] == 0


def test_a_sequence_level_loss_refuses_a_batch_that_splits_a_rollout():
  trees, scores = example_trees(0)
  paths = pack_paths(trees, scores, row_len=max(int(t.depth_T.max()) + 1 for t in trees) + 8)
  assert any(len({r for r in range(paths.shape[0]) if (paths.rollout_index_RT[r][paths.loss_mask_RT()[r]] == i).any()})
             > 1 for i in range(len(trees)))
  with pytest.raises(ValueError, match=r"rollout '.*' has loss tokens in rows \d+ and \d+: a sequence-level loss"):
    Learner(LearnerConfig(loss="gspo", logits_chunk=64), tiny_policy()).prepare(paths)
  Learner(LearnerConfig(loss="grpo", logits_chunk=64), tiny_policy()).prepare(paths)  # a token-level loss takes it
