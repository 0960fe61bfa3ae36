"""Which NeMo Gym servers the catalogue registers, and what their installed files cannot say.

A server is here when it runs on a CPU machine without a network: its verifier is local and deterministic,
its agent ships with NeMo Gym, and anything it needs beyond the NeMo Gym environment is on PyPI (pinned in
nemo-gym-requirements.txt, installed by `make gym`); or when all it needs beyond that is an LLM judge at an
endpoint the operator names. The servers that need web APIs, containers, a GPU or a data download are not
(../shared/reference/nemo-gym-catalog.md, server by server), nor those a dedicated plugin runs (calendar,
math_with_judge, mcqa, reasoning_gym, workplace_assistant). A plugin installed later that registers one of
these names takes it: the catalogue registers after every other plugin and leaves a taken name alone.

`needs` is what an operator must provide beyond the NeMo Gym environment and a text policy (the PyPI
packages a server needs are servers.REQUIRES, listed with these); `skip` is why
none of a server's recorded rollouts can be replayed here (they are still registered: they work in
training, only the machine cannot prove them).
"""

from __future__ import annotations

from typing import Final

from attrs import frozen

OTHER_TASKS: Final = "recorded on tasks not in example.jsonl, without the ground truth its verifier reads"
JUDGED: Final = "its reward is the verdict of the LLM judge it was recorded with, not reproducible here"
VISION: Final = "a vision policy (the prompt holds an image)"
UNSANDBOXED: Final = "runs the model's Python unsandboxed on the server's host"


@frozen(kw_only=True)
class Entry:
    name: str  # the upstream resources server directory, and the environment's name
    config: str | None = None  # the config file's stem under configs/ (default: <name>, else the only one)
    needs: tuple[str, ...] = ()
    skip: str | None = None
    max_concurrency: int = 8
    judge: bool = False  # its verifier asks an LLM judge (its judge_model_server): the operator's endpoint


ENTRIES: Final[tuple[Entry, ...]] = (
    # simple_agent, offline with what the NeMo Gym environment has
    Entry(name="arc_agi"),
    Entry(name="bunsenbench_chemistry_mcq"),
    Entry(name="circle_click", needs=(VISION,)),
    Entry(name="circle_count", needs=(VISION,)),
    Entry(name="code_gen", needs=(UNSANDBOXED,), max_concurrency=2),
    Entry(name="equivalence_rule"),
    Entry(name="example_multi_step"),
    Entry(name="example_session_state_mgmt"),
    Entry(name="example_single_tool_call"),
    Entry(name="example_tool_call_multireward"),
    Entry(name="format_verification", config="citation_format"),
    Entry(name="gpqa_diamond"),
    Entry(name="graphwalks"),
    Entry(name="hotpotqa_qa"),
    Entry(name="imo_gradingbench"),
    Entry(name="indirect_prompt_injection", skip=OTHER_TASKS),
    Entry(name="math_advanced_calculations", skip=OTHER_TASKS),
    Entry(name="math_proof_judgement"),
    Entry(name="math_with_code", needs=(UNSANDBOXED,), max_concurrency=4),
    Entry(name="mrcr"),
    Entry(name="nvarc", config="inductive", needs=(UNSANDBOXED,), max_concurrency=4),
    Entry(name="polymath"),
    Entry(name="proof_genselect"),
    Entry(name="ruler", skip=OTHER_TASKS),
    Entry(name="swerl_llm_judge"),
    Entry(name="xlam_fc"),
    # tool_simulation_agent: one model call, its tool calls compared, never run
    Entry(name="single_step_tool_use_with_argument_comparison"),
    Entry(name="swe_pivot"),
    # gymnasium_agent: /reset, then a model call and a /step per turn
    Entry(name="example_multi_turn_gymnasium"),
    Entry(name="blackjack", skip="its dealer draws from an unseeded random generator"),
    # offline after a CPU-only PyPI install (servers.REQUIRES; nemo-gym-requirements.txt pins them)
    Entry(name="asr_with_pc", needs=("an audio policy (the prompt's audio is in metadata)",)),
    Entry(name="grl_sokoban"),
    Entry(
        name="grl_tetris",
        skip="each piece after the first comes from the process's unseeded random generator",
    ),
    Entry(name="structeval", config="structeval_nonrenderable"),
    Entry(name="structured_outputs", config="structured_outputs_json", skip=OTHER_TASKS),
    Entry(name="terminal_multi_harness", config="terminal_multi_harness_agent006"),
    Entry(name="terminus_judge", config="terminus_judge_string_only"),  # its other configs call an LLM judge
    # verified by an LLM judge: registered for production, where the operator names the judge's endpoint
    # (RELAX_GYM_JUDGE_URL / _MODEL / _API_KEY); upstream's own configs often name the policy itself
    *(
        Entry(name=name, judge=True, skip=JUDGED)
        for name in (
            "aalcr",
            "abstention",
            "equivalence_llm_judge",
            "frontierscience_judge",
            "imo_proofbench_judge",
            "inverse_if",
            "math_with_autograder",
            "multichallenge",
            "omniscience",
            "physics_judge",
            "proof_judge",
            "proof_verification",
            "simpleqa",
            "text_to_sql",
            "ugphysics_judge",
        )
    ),
    # New after 0.4.0 (lc_niah, litmus_agent, ragtruth at the commit Relax pins, a85670eb; the others at main,
    # 0.5.1): a NeMo Gym without one (CI's 0.4.0) leaves it out quietly. The new servers not here, and why:
    # - conversational_tool_use_simulation, toolsandbox: an LLM simulates the user (the former's tools too),
    #   a role the judge does not fill; toolsandbox's search tools call RapidAPI;
    # - iheval: its IFEval checks download NLTK's punkt from GitHub at first use (nltk.download);
    # - rolemrc: BERTScore's roberta-large from Hugging Face (and torch), NLTK's wordnet from GitHub;
    # - deepswe, swebench: a container per task (nemo_gym.sandbox); legal_agent_bench: Harbor on Docker and
    #   a judge; finance_agent_v2: web APIs (Tavily, SEC, Tiingo), a git-only package and a judge.
    Entry(name="citation_if"),  # tools offered; any call is answered "no more results" and scores 0
    Entry(name="gui_coordinate", needs=(VISION,)),
    Entry(name="image_tools", config="image_tools_pivot", needs=(VISION,)),  # tool_simulation_agent
    Entry(name="lc_niah"),
    Entry(
        name="litmus_agent",
        needs=("an OpenSandbox service for rows that offer its Python tool (no example row does)",),
    ),
    Entry(
        name="openair_congestion",  # gymnasium_agent; a deterministic synthetic 5G cell, seeded per row
        skip="recorded by a scripted policy on the server directly: response.output keeps its last move only",
    ),
    Entry(name="ragtruth"),
    Entry(name="ruler2"),  # editdistance (servers.REQUIRES)
    Entry(name="spartqa"),
    Entry(name="string_match"),
    Entry(
        name="bbq",
        judge=True,
        skip=JUDGED,
        needs=("a judge that answers Chat Completions with strict JSON-schema output",),
    ),
    Entry(name="longmemeval", judge=True, skip=JUDGED),
)
