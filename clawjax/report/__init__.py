"""What a run did, as one self-contained HTML page (run.py), with its curves (charts.py) and the rollout
trees of its last step (clawjax/tree/view.py). Reads a run directory's files only, so training and
evaluation both call it at their end (`write_report(workdir)`) and `experiments/report.py` redraws it."""
