"""The main job: `relax-gym rollout` and `relax-gym report`.

engine.py runs the rows of a data file as real trials (data.py reads and routes them, policy.py picks the
policy: an endpoint or the oracle, gateway.py starts the command's own gateway, run.py drives one trial,
store.py keeps trials.jsonl and run.json, summary.py computes the figures, live.py shows progress);
report.py and plots.py turn a run directory into its report.
"""
