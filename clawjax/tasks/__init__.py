"""ClawGym and PinchBench tasks: the records (records.py), one loader per on-disk layout
(clawgym_dir.py, clawgym_jsonl.py, pinchbench.py) and the dispatch and selection over them
(loader.py), rollout workspaces (workspace.py), checker scoring (scoring.py) and the rubric judge
(judge.py). Import from here: `from clawjax.tasks import Task, select_tasks, score`.
`python -m clawjax.tasks --help` for the command line."""

from clawjax.tasks.clawgym_dir import load_task_dir
from clawjax.tasks.clawgym_jsonl import load_jsonl, parse_jsonl_line, parse_jsonl_task
from clawjax.tasks.judge import JudgeConfig, JudgeResult, judge_workspace
from clawjax.tasks.loader import bundled_tasks_dir, load_tasks, select_tasks, split_loaded
from clawjax.tasks.pinchbench import load_markdown_task
from clawjax.tasks.records import Checker, Rubric, RubricRule, Task, TaskError, TaskFile
from clawjax.tasks.scoring import ScoreResult, ScoringConfig, run_checker, score, score_async
from clawjax.tasks.workspace import WorkspaceDiff, diff_workspace, make_workspace

__all__ = [
    "Checker", "JudgeConfig", "JudgeResult", "Rubric", "RubricRule", "ScoreResult", "ScoringConfig",
    "Task", "TaskError", "TaskFile", "WorkspaceDiff", "bundled_tasks_dir", "diff_workspace",
    "judge_workspace", "load_jsonl", "load_markdown_task", "load_task_dir", "load_tasks",
    "make_workspace", "parse_jsonl_line", "parse_jsonl_task", "run_checker", "score", "score_async",
    "select_tasks", "split_loaded",
]
