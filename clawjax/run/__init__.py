"""The run layer shared by training, cold start and evaluation: which policy a run samples from
(settings.py, the `config.model` and `config.engine` sections of every run config) and the session
that serves it behind the shim and drives harness rollouts through it (session.py)."""
