"""What plays the model when no model runs: scripted replies in the real wire formats of the three APIs
Relax serves (formats.py, replies.py), a policy server that answers with them (server.py, on real uvicorn
in a thread: threaded.py), and the oracle that replays each environment's verifier probes (oracle.py:
`relax-gym rollout --policy oracle`, `make demo`). Tests use the same pieces through relax_gym_core.testing.
"""
