"""mini: a small black-box agent harness shipped with clawjax (see agent.py); run it as a process."""
