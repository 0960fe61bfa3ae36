"""The commands of `relax-gym`: serve, up, probe, plugins, convert, mix, and `make demo` (cli.py parses; the
rollout engine behind `relax-gym rollout` and `report` is relax_gym_core.rollout)."""
