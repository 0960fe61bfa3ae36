"""The data this plugin knows without the reasoning-gym library (which lives in the NeMo Gym environment,
not here): the task names of the pinned reasoning-gym, and the bundled example rows.

The example rows (examples/*.jsonl, package data) were written once by this plugin's generator
(relax-gym-reasoning-gym-generate, see generate.py and the README) with reasoning-gym 0.1.25; they are the
rows of the verifier probes, hence also what `relax-gym rollout --policy oracle` and the demo run.
A test checks TASKS against the installed library.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from relax_gym_core.errors import ConfigError

# Every task reasoning-gym 0.1.25 registers, except "composite" (a mixer of the others: its rows carry
# the mixed task's own name as source_dataset). A row naming another task scores 0.0 whatever the answer.
_TASK_NAMES = """
    ab acre advanced_geometry aiw arc_1d arc_agi base_conversion basic_arithmetic bf binary_alternation
    binary_matrix bitwise_arithmetic boxnet caesar_cipher calendar_arithmetic chain_sum circuit_logic codeio
    coin_flip color_cube_rotation complex_arithmetic count_bits count_primes countdown course_schedule
    cryptarithm decimal_arithmetic decimal_chain_sum dice emoji_mystery family_relationships figlet_font
    fraction_simplification futoshiki game_of_life game_of_life_halting gcd graph_color group_anagrams
    gsm_symbolic intermediate_integration isomorphic_strings jugs kakurasu knight_swap knights_knaves
    largest_island lcm leg_counting letter_counting letter_jumble list_functions mahjong_puzzle
    manipulate_matrix maze mini_sudoku modulo_grid n_queens needle_haystack number_filtering number_format
    number_sequence number_sorting palindrome_generation palindrome_partitioning path_star
    polynomial_equations polynomial_multiplication pool_matrix power_function prime_factorization products
    propositional_logic puzzle24 quantum_lock ransom_note rearc rectangle_count rotate_matrix rotten_oranges
    rubiks_cube rush_hour self_reference sentence_reordering shortest_path simple_equations simple_geometry
    simple_integration sokoban spell_backward spiral_matrix string_insertion string_manipulation
    string_splitting string_synthesis sudoku survo syllogism time_intervals tower_of_hanoi tsumego
    word_ladder word_sequence_reversal word_sorting zebra_puzzles
    """
TASKS: frozenset[str] = frozenset(_TASK_NAMES.split())

EXAMPLE_FILE = "examples/reasoning_gym_examples.jsonl"


def example_rows() -> list[dict[str, Any]]:
    """The bundled raw example rows (fresh objects on every call)."""
    resource = files("relax_gym_reasoning_gym_cc").joinpath(EXAMPLE_FILE)
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(resource.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict):
            raise ConfigError(f"{EXAMPLE_FILE}:{number}: a row must be a JSON object")
        rows.append(row)
    return rows
