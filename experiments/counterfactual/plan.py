"""Every number of the counterfactual study (registration.md), in one place: the runner, the
analysis, the tests and the registration read them from here."""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRESS = HERE / "progress"                  # committed: per-episode results, small
RESULTS = HERE / "results"                    # committed: summary.json / summary.md per game
CACHE = Path("~/jaxsal-runs/counterfactual")  # not committed: nothing that a resume needs

# ---- games, agents, moved objects: the games jaxsal_agents.interventions can move an object in
GAMES = ("breakout", "pong", "spaceinvaders")
AGENTS = {"breakout": "breakout", "pong": "pong", "spaceinvaders": "spaceinvaders"}
MOVED = {"breakout": "ball", "pong": "ball", "spaceinvaders": "player"}
# (dx, dy) raw-screen pixels, every one tried at every state
MOVES = {"breakout": ((8, 0), (-8, 0), (0, 8), (0, -8)),
         "pong": ((8, 0), (-8, 0), (0, 8), (0, -8)),
         "spaceinvaders": ((16, 0), (-16, 0))}
KEEP = ("ok",)                                # statuses that enter the statistics

# ---- episodes and states
EPISODES = 20                 # full games per game, at least
STATES = 500                  # states per game, at least
STATES_PER_EPISODE = STATES // EPISODES      # 25, spread over each episode's eligible steps
EPSILON = 0.01                # the shipped agents' final training epsilon (as the Paper B re-run)
MAX_EPISODE_STEPS = 27_000    # EnvPool's evaluation cap
NOOP_MAX = 30                 # EnvPool's 0..29 no-op start, drawn from the episode's seed
SEED_BASE = 3000              # episode e of the study plays with seed SEED_BASE + e
DEV_SEED = 9_000              # the cost pilot and the tests: never one of the study's seeds
FRAME_STACK = 4


def episode_seed(e: int) -> int:
    """The seed of study episode e (env, no-op start and exploration): 3000 + e."""
    return SEED_BASE + int(e)


# ---- methods: every registered method at its defaults (jaxsal.methods() at the run; the run records the list)
TARGET = "q_chosen"
METHOD_KEY = 0                # stochastic methods (RISE masks, LIME samples): jax.random.PRNGKey(0) in every call
SHARE = "absolute"            # object shares of |map|: defined for signed and unsigned maps alike
REMOVAL = {"fill": "ring", "frames": "all"}          # primary removal; "newest" is reported too
REMOVAL_SECONDARY = {"fill": "ring", "frames": "newest"}

# ---- statistics
LEVEL = 0.95                  # cluster-bootstrap percentile intervals over episodes
N_RESAMPLES = 10_000
BOOT_SEED = 0
ALPHA = 0.05                  # family-wise, Holm over every test of the study
STATS = ("removal", "displacement", "follow")       # the three tests per method and game
FOLLOW_CHANCE = 0.5           # follow rate of a map whose change is unrelated to the move
EXACT_FLIPS_UP_TO = 22        # sign-flip tests enumerate all 2^n sign patterns up to n episodes
MC_FLIPS = 200_000            # Monte Carlo sign flips beyond that
REGISTERED_METHODS = 18       # len(jaxsal.methods()) at registration
MIN_EPISODES_PER_TEST = 12    # fewer contributing episodes: "not estimable" (2^-12 is the first 2^-n below
                              # Holm's strictest threshold ALPHA / 3 / (3 * 18) = 3.1e-4: fewer could never reject)
POWER_EFFECT_SD = 1.0         # the planted effect of the power check: episode mean / between-episode SD
POWER_SIMULATIONS = 2_000


def n_tests(n_methods: int, games=GAMES) -> int:
    """How many tests the Holm family holds: 3 per method and game."""
    return len(STATS) * n_methods * len(games)
