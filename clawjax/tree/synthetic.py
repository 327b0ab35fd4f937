"""Synthetic agent rollouts shaped like real harness traces, as lists of `CallRecord`.

Used by the tree property tests, the tree benchmark and the learner benchmark. A rollout is a main tool
loop: every main call's input is the history so far plus a generation prompt, its output is sampled,
and the history grows by that output (as the harness echoes it back) plus a tool result. With a long
prompt and short turns, ~99% of each input repeats the previous call, as in real 64K-context traces.

Patterns (each optional, placed at a random main step):
  retry            a malformed output, then a call with a byte-identical input that replaces it;
  error            a call that failed (status "error", no output), then its identical retry;
  compaction       a summarisation call on the full history; the history restarts as prompt + summary;
  subagent         a few calls of a tool loop under the subagent's own system prompt;
  auxiliary        one small side call (e.g. a title) with its own short prompt, after a main call;
  thinking_stripped every main output opens with a thinking block the harness drops from the history;
  reserialised     one output is echoed back with a few tokens changed (a re-serialised tool call);
  parallel_tools   one output issues several tool calls; several tool results follow it;
  context_last     every main input ends with a fresh context message that the next input drops
                   (OpenClaw's internal-context message), so each call branches off the next.

Ground truth for tests: `extra["synthetic"]` is the call's true kind ("main", "retry", "error",
"compaction", "subagent", "auxiliary"); the tree code never reads `extra`.

Token ids: 1..15 are chat-format markers (below), content tokens are drawn from [16, vocab_size).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from clawjax.calllog import CallRecord, RolloutRecord

IM_START, IM_END, SYSTEM, USER, ASSISTANT, TOOL, THINK, END_THINK = 1, 2, 3, 4, 5, 6, 7, 8
FIRST_CONTENT_TOKEN = 16
PATTERNS = ("retry", "error", "compaction", "subagent", "auxiliary", "thinking_stripped",
            "reserialised", "parallel_tools", "context_last")
GEN_PROMPT = (IM_START, ASSISTANT)


@dataclasses.dataclass
class _Rollout:
  """Accumulates the calls of one rollout in arrival order."""
  rng: np.random.Generator
  rollout_id: str
  task_id: str
  harness: str
  vocab_size: int
  label_roles: bool
  calls: list[CallRecord] = dataclasses.field(default_factory=list)
  clock: float = 1.7e9

  def content(self, n: int) -> list[int]:
    return self.rng.integers(FIRST_CONTENT_TOKEN, self.vocab_size, size=max(n, 1)).tolist()

  def call(self, input_ids: list[int], output_ids: list[int], kind: str, role: str,
           status: str = "ok") -> None:
    logprobs = np.round(-self.rng.exponential(0.5, size=len(output_ids)), 4).tolist()  # short JSON
    t_end = self.clock + 0.01 * (1 + len(output_ids))
    self.calls.append(CallRecord(
        rollout_id=self.rollout_id, task_id=self.task_id, harness=self.harness,
        call_index=len(self.calls), status=status, input_ids=tuple(input_ids),
        output_ids=tuple(output_ids), output_logprobs=tuple(logprobs),
        role=role if self.label_roles else None,
        finish_reason="stop" if status == "ok" else None, model="synthetic", t_start=self.clock,
        t_end=t_end, extra={"synthetic": kind}))
    self.clock = t_end + 0.1


def _turn(r: _Rollout, n_output: int, thinking: bool) -> tuple[list[int], list[int]]:
  """One sampled assistant turn: (output as sampled, output as the harness echoes it back)."""
  body = r.content(n_output) + [IM_END]
  if not thinking:
    return body, body
  return [THINK] + r.content(max(2, n_output // 2)) + [END_THINK] + body, body


def _tool_results(r: _Rollout, n_tokens: int, n_results: int) -> list[int]:
  out: list[int] = []
  for _ in range(n_results):
    out += [IM_START, TOOL] + r.content(n_tokens // n_results) + [IM_END]
  return out


def _side_loop(r: _Rollout, kind: str, n_calls: int, prompt_len: int, tokens_per_call: int) -> list[int]:
  """A side conversation under its own system prompt; returns its final answer's content tokens."""
  history = [IM_START, SYSTEM] + r.content(prompt_len) + [IM_END, IM_START, USER] + r.content(16) + [IM_END]
  output: list[int] = []
  for i in range(n_calls):
    inp = history + list(GEN_PROMPT)
    output = r.content(max(4, tokens_per_call // 4)) + [IM_END]
    r.call(inp, output, kind, kind)
    history = inp + output + _tool_results(r, tokens_per_call, 1)
  return output[:-1]


def task_prompt(rng: np.random.Generator, n_tokens: int, vocab_size: int = 32000) -> list[int]:
  """A random initial prompt: a system message of `n_tokens` content tokens and a short user task."""
  content = lambda n: rng.integers(FIRST_CONTENT_TOKEN, vocab_size, size=n).tolist()
  return [IM_START, SYSTEM] + content(n_tokens) + [IM_END, IM_START, USER] + content(32) + [IM_END]


def agent_rollout(rng: np.random.Generator, *, rollout_id: str, task_id: str = "task-0",
                  harness: str = "synthetic", prompt_ids: list[int] | None = None,
                  prompt_len: int = 2000, n_calls: int = 30, tokens_per_call: int = 200,
                  output_frac: float = 0.3, patterns: tuple[str, ...] = (),
                  vocab_size: int = 32000, label_roles: bool = True,
                  compact_every: int | None = None) -> list[CallRecord]:
  """One rollout's calls in arrival order (`call_index` 0, 1, ...).

  Args:
    rng: the only source of randomness.
    prompt_ids: the initial prompt (system + tools + task), e.g. shared by a GRPO group; default a
      random one of `prompt_len` tokens wrapped in system/user markers.
    n_calls: main-loop calls; patterns add their own calls on top.
    tokens_per_call: tokens each main step adds to the history (its output plus the tool result).
    output_frac: the share of those tokens that the model sampled (at least 16 per turn).
    patterns: names from `PATTERNS`.
    label_roles: False writes role=null everywhere (what a proxy without role hints records).
    compact_every: also compact after every this many main steps (a harness on a tight context
      budget); each compaction restarts the history, so every segment is its own branch.
  """
  unknown = set(patterns) - set(PATTERNS)
  if unknown:
    raise ValueError(f"unknown patterns {sorted(unknown)}; known: {PATTERNS}")
  if n_calls < 1:
    raise ValueError(f"n_calls must be >= 1, got {n_calls}")
  r = _Rollout(rng, rollout_id, task_id, harness, vocab_size, label_roles)
  prompt = list(prompt_ids) if prompt_ids is not None else task_prompt(rng, prompt_len, vocab_size)
  n_output = max(16, int(tokens_per_call * output_frac))  # runs of 8 survive re-serialisation
  n_result = max(4, tokens_per_call - n_output)
  # Each once-only pattern fires at its own main step; the last step is the final answer.
  events = {p: int(rng.integers(0, max(n_calls - 1, 1))) for p in patterns}
  history = prompt
  for step in range(n_calls):
    context = [IM_START, USER] + r.content(4) + [IM_END] if "context_last" in patterns else []
    inp = history + context + list(GEN_PROMPT)
    if events.get("error") == step:
      r.call(inp, [], "error", "main", status="error")
    if events.get("retry") == step:
      r.call(inp, r.content(n_output // 2), "retry", "main")
    sampled, echoed = _turn(r, n_output, "thinking_stripped" in patterns)
    r.call(inp, sampled, "main", "main")
    if events.get("auxiliary") == step:
      _side_loop(r, "auxiliary", 1, 64, 32)
    if events.get("reserialised") == step:
      echoed = list(echoed)
      k = len(echoed) // 2
      n_content = vocab_size - FIRST_CONTENT_TOKEN
      echoed[k] = FIRST_CONTENT_TOKEN + (echoed[k] + 1 - FIRST_CONTENT_TOKEN) % n_content  # surely differs
    n_results = 3 if events.get("parallel_tools") == step else 1
    if events.get("subagent") == step:
      answer = _side_loop(r, "subagent", 3, prompt_len // 4 + 8, tokens_per_call)
      result = [IM_START, TOOL] + answer + [IM_END]
    else:
      result = _tool_results(r, n_result, n_results)
    history = history + list(GEN_PROMPT) + echoed + result
    compact = events.get("compaction") == step or (compact_every and (step + 1) % compact_every == 0)
    if compact and step < n_calls - 1:
      request = history + [IM_START, USER] + r.content(8) + [IM_END] + list(GEN_PROMPT)
      summary = r.content(max(8, tokens_per_call // 2)) + [IM_END]
      r.call(request, summary, "compaction", "compaction")
      history = prompt + [IM_START, USER] + summary[:-1] + [IM_END]
  return r.calls


def agent_group(rng: np.random.Generator, *, task_id: str, harness: str = "synthetic",
                n_rollouts: int = 8, prompt_len: int = 4000, rewards: list[float] | None = None,
                **rollout_kwargs) -> tuple[list[CallRecord], list[RolloutRecord]]:
  """A GRPO group: `n_rollouts` rollouts of one (task, harness) sharing one prompt, with outcomes.

  `rewards` default: uniform in [0, 1). Other keyword arguments go to `agent_rollout`.
  """
  prompt = task_prompt(rng, prompt_len, rollout_kwargs.get("vocab_size", 32000))
  if rewards is None:
    rewards = rng.random(n_rollouts).tolist()
  if len(rewards) != n_rollouts:
    raise ValueError(f"got {len(rewards)} rewards for {n_rollouts} rollouts")
  calls: list[CallRecord] = []
  outcomes: list[RolloutRecord] = []
  for i, reward in enumerate(rewards):
    rid = f"{task_id}/{harness}/{i}"
    calls += agent_rollout(rng, rollout_id=rid, task_id=task_id, harness=harness, prompt_ids=prompt,
                           **rollout_kwargs)
    outcomes.append(RolloutRecord(rollout_id=rid, task_id=task_id, harness=harness,
                                  reward=float(reward), status="ok"))
  return calls, outcomes
