"""Harness runs: install real harnesses (install.py), isolate them (sandbox.py, relay.py), point them
at the shim (adapters.py; mini/ is clawjax's own small harness), and run whole rollouts (rollout.py)."""
