"""Which calls of a rollout are trained: the filter rules of the paper (section 4), each a config field.

Calls are read in arrival order (`call_index`) into one trie of all ok calls. For each call we note its
*attach point*: the deepest node on its input path where an earlier call's output ended, or began if
the input continues that call but changed its output (the last time the harness heard from the model;
if never, where its input leaves the tree of earlier calls). Then, for an earlier call e, the first later
call that touches e's history decides its fate:
  * a call of any role whose input strictly extends e's input *continues* e (if that input does not
    repeat e's whole output, the harness changed it: a drift call, see `drift_calls`);
  * a main-line call whose input reaches e's attach point but does not extend e's input (the same
    input again, or the last message rewritten) *replaces* e, unless it repeats a run of e's output
    (`FilterConfig.echo_run`): then the harness moved the echoed turn and it continues e (no drift);
  * a call with role "compaction" closes the segment: no later call replaces e (paper: keep the
    longest continuation within each segment between compaction points).
A retry dead leaf is a replaced call whose full output no later input contains. Two retries that
sampled the same output and were continued are both kept; the tree trains the shared tokens once.

Precedence when several rules apply: error, then role (labelled or inferred), then retry.

Limits of role inference (role=null): the first ok call starts the main line, and a compaction call
that extends the main history looks like a main call and is trained; label such calls at the shim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from clawjax.calllog import ROLES, CallRecord
from clawjax.config import Count, Fraction
from clawjax.tree.build import ROOT, CallArrays, CallTree, Trie, build_tree, call_arrays

DROP_REASONS = ("retry", "compaction", "subagent", "auxiliary", "error")
TRAIN = "train"


@dataclasses.dataclass(frozen=True)
class FilterConfig:
  """The filter rules. Defaults follow the paper where it says; the rest is documented here."""
  # Drop retry dead leaves (paper section 4).
  drop_retries: bool = True
  # Roles whose calls are excluded from the loss; their shared prefix stays in the tree via the main
  # calls that contain it (paper: compaction and subagent branches; auxiliary side calls likewise).
  excluded_roles: tuple[str, ...] = ("compaction", "subagent", "auxiliary")
  # For role=null calls, infer main line vs side branch from the token structure.
  infer_roles: bool = True
  # A role=null call is a side branch (counted as "subagent") when the longest prefix its input shares
  # with earlier main-line history is below this fraction of the first main call's input. That input
  # is dominated by the system prompt, tools and task, which every later main call repeats (even after
  # compaction); a subagent or auxiliary call under its own system prompt shares at most a chat header.
  side_branch_shared_frac: Fraction = 0.5
  # A later main-line call that leaves e's input early (so it neither extends nor merely re-sends it)
  # still continues e when its input repeats this many consecutive tokens of e's output: the harness
  # moved or re-serialised the echoed turn (OpenClaw moves its internal-context message to the end
  # of every request and re-serialises tool-call arguments). 8 tokens: a chance repeat of 8 tokens
  # is negligible, and re-serialisation leaves runs of the turn's text that long intact.
  echo_run: Count = 8
  # Over-branching: a rollout whose kept tree has more leaves is dropped whole (the paper's threshold
  # is unpublished). A linear harness has one leaf per compaction segment, but some branch at every
  # call: a template that strips thinking from history, OpenClaw moving its internal-context message
  # (one leaf per call). 64 is twice the ~30 calls of a typical 64K-context rollout, so those pass,
  # while a rollout branching far beyond that (runaway retries, a history rewritten at every turn)
  # is dropped: one reward spread over that many branches says little about any of them.
  max_leaves: Count = 64

  def __post_init__(self):
    bad = set(self.excluded_roles) - set(ROLES) | ({"main"} & set(self.excluded_roles))
    if bad:
      raise ValueError(f"FilterConfig.excluded_roles: cannot exclude {sorted(bad)}; choose from "
                       f"{ROLES[1:]}")
    if not 0.0 <= self.side_branch_shared_frac <= 1.0:
      raise ValueError(f"FilterConfig.side_branch_shared_frac must be in [0, 1], got "
                       f"{self.side_branch_shared_frac}")
    if self.echo_run < 1:
      raise ValueError(f"FilterConfig.echo_run must be >= 1, got {self.echo_run}")
    if self.max_leaves < 1:
      raise ValueError(f"FilterConfig.max_leaves must be >= 1, got {self.max_leaves}")


@dataclasses.dataclass
class FilteredRollout:
  """The outcome of filtering one rollout."""
  rollout_id: str
  calls: list[CallRecord]      # every call, in call_index order
  reasons: dict[int, str]      # call_index -> TRAIN or one of DROP_REASONS
  inferred: dict[int, str]     # call_index -> "main" | "subagent" for role=null calls
  drifted: tuple[int, ...]     # call_index of each drift call (its input diverged inside an earlier output)
  leaves: int                  # leaves of the kept tree (over-branching: of the tree that was dropped)
  over_branching: bool
  tree: CallTree               # the kept tree (empty when nothing is trained)

  @property
  def drift_calls(self) -> int:
    return len(self.drifted)

  @property
  def trained(self) -> list[CallRecord]:
    """The calls whose output enters the loss (none when the rollout is over-branching)."""
    if self.over_branching:
      return []
    return [c for c in self.calls if self.reasons[c.call_index] == TRAIN]


@dataclasses.dataclass
class _Seen:
  """What the classification pass remembers of an earlier ok call."""
  call: CallRecord
  seq: np.ndarray  # input + output
  n_in: int
  in_end: int
  out_end: int
  attach: int
  main_line: bool
  state: str = "pending"  # -> "continued" | "replaced" | "segment_closed"
  merged: bool = False


def _is_matched(node: int, full: set[int]) -> bool:
  return node == ROOT or node in full


def _echoes(later_input: np.ndarray, e: _Seen, run: int) -> bool:
  """Whether `later_input`, past the point where it leaves e's input, repeats `run` consecutive
  tokens of e's output (all of it if shorter)."""
  out = e.seq[e.n_in:]
  n = min(len(later_input), e.n_in)
  diff = np.flatnonzero(later_input[:n] != e.seq[:n])
  region = later_input[int(diff[0]) if len(diff) else n:]
  k = min(run, len(out))
  if k == 0 or len(region) < k:
    return False
  windows = lambda a: {w.tobytes() for w in np.lib.stride_tricks.sliding_window_view(a, k)}
  return not windows(out).isdisjoint(windows(region))


def classify(calls: Sequence[CallRecord], config: FilterConfig = FilterConfig(),
             arrays: Mapping[int, CallArrays] | None = None
             ) -> tuple[dict[int, str], dict[int, str], tuple[int, ...]]:
  """(reason per call_index, inferred roles, the drift calls' call_index) for one rollout's calls.

  `arrays`: `call_arrays` of each ok call by call_index, when the caller already has them.
  """
  reasons: dict[int, str] = {}
  inferred: dict[int, str] = {}
  drifted_calls: list[int] = []
  trie, main_trie = Trie(), Trie()
  out_ends: set[int] = set()
  seen: list[_Seen] = []
  first_main_len: int | None = None
  for c in sorted(calls, key=lambda c: c.call_index):
    if c.status != "ok":
      reasons[c.call_index] = "error"
      continue
    seq = arrays[c.call_index][0] if arrays is not None else call_arrays(c)[0]
    n_in = len(c.input_ids)
    full_list, _ = trie.walk(seq[:n_in])
    full = set(full_list)
    role = c.role
    if role is None and config.infer_roles:
      if first_main_len is None:
        role = "main"
      else:
        shared = main_trie.walk(seq[:n_in])[1]
        role = "subagent" if shared < config.side_branch_shared_frac * first_main_len else "main"
      inferred[c.call_index] = role
    main_line = role not in config.excluded_roles
    if main_line and first_main_len is None:
      first_main_len = n_in
    drifted = False
    heard = set(out_ends)  # nodes where this call's history last met a model output
    for e in seen:
      if _is_matched(e.out_end, full):
        e.merged = True
      extends = _is_matched(e.in_end, full) and n_in > e.n_in
      if extends:
        heard.add(e.in_end)
      if e.state != "pending":
        continue
      if extends:
        e.state = "continued"
        drifted |= not _is_matched(e.out_end, full)
      elif main_line and e.main_line and _is_matched(e.attach, full):
        e.state = "continued" if _echoes(seq[:n_in], e, config.echo_run) else "replaced"
      elif role == "compaction":
        e.state = "segment_closed"
    if drifted:
      drifted_calls.append(c.call_index)
    # Without model output in its history (a first call), a call attaches where its input leaves
    # the earlier tree: only a re-send of that input can replace it.
    attach = next((n for n in reversed(full_list) if n in heard), full_list[-1] if full_list else ROOT)
    in_end, out_end = trie.insert(seq, cuts=(n_in, len(seq)))
    out_ends.add(out_end)
    if main_line:
      main_trie.insert(seq)
    seen.append(_Seen(c, seq, n_in, in_end, out_end, attach, main_line))
    reasons[c.call_index] = TRAIN if main_line else (role if role in DROP_REASONS else "subagent")
  for e in seen:
    if config.drop_retries and e.main_line and e.state == "replaced" and not e.merged:
      reasons[e.call.call_index] = "retry"
  return reasons, inferred, tuple(drifted_calls)


def ok_call_arrays(calls: Sequence[CallRecord]) -> dict[int, CallArrays]:
  """`call_arrays` of each ok call by call_index: the calls a tree can hold."""
  return {c.call_index: call_arrays(c) for c in calls if c.status == "ok"}


def filter_rollout(rollout_id: str, calls: Sequence[CallRecord], config: FilterConfig = FilterConfig(),
                   arrays: Mapping[int, CallArrays] | None = None) -> FilteredRollout:
  """Classifies the calls of one rollout and builds the tree of the trained ones. `arrays`: the calls'
  `ok_call_arrays`, when the caller already has them."""
  calls = sorted(calls, key=lambda c: c.call_index)
  arrays = ok_call_arrays(calls) if arrays is None else arrays
  reasons, inferred, drifted = classify(calls, config, arrays)
  tree = build_tree(rollout_id, [c for c in calls if reasons[c.call_index] == TRAIN], arrays)
  leaves = len(tree.leaves_L)
  over = leaves > config.max_leaves
  if over:
    tree = build_tree(rollout_id, [])
  return FilteredRollout(rollout_id=rollout_id, calls=calls, reasons=reasons, inferred=inferred,
                         drifted=drifted, leaves=leaves, over_branching=over, tree=tree)
