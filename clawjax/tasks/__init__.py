"""ClawGym tasks: loading (task.py), rollout workspaces (workspace.py), checker scoring (scoring.py)
and the rubric judge (judge.py). `python -m clawjax.tasks --help` for the command line."""

from clawjax.tasks.judge import JudgeConfig, JudgeResult, judge_workspace
from clawjax.tasks.scoring import ScoreResult, ScoringConfig, run_checker, score, score_async
from clawjax.tasks.task import (Checker, Rubric, RubricRule, Task, TaskError, TaskFile,
                                bundled_tasks_dir, load_jsonl, load_task_dir, load_tasks,
                                select_tasks, split_loaded)
from clawjax.tasks.workspace import WorkspaceDiff, diff_workspace, make_workspace

__all__ = [
    "Checker", "JudgeConfig", "JudgeResult", "Rubric", "RubricRule", "ScoreResult", "ScoringConfig",
    "Task", "TaskError", "TaskFile", "WorkspaceDiff", "bundled_tasks_dir", "diff_workspace",
    "judge_workspace", "load_jsonl", "load_task_dir", "load_tasks", "make_workspace", "run_checker",
    "score", "score_async", "select_tasks", "split_loaded",
]
