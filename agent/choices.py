"""The names and defaults a user chooses among on the command line, in the standard library alone.

Every command's parser reads its choices and defaults from here, and the code that implements each imports it from
here too (one definition). A parser built from this module answers ``--help`` and a usage error before numpy,
pydantic, pyarrow or an HTTP client loads (issue 82; tests/test_startup.py).
"""
from __future__ import annotations

from enum import Enum

__all__ = ["METHODS", "PROTOCOLS", "Variant", "VARIANTS", "HISTORY_REASONING", "WEBWATCHER_OBSERVATION_IMAGES",
           "DEFAULT_THRESHOLD", "DEFAULT_PATIENCE", "CACHE_MODES", "DEFAULT_TOP_LOGPROBS", "EMBEDDED_MAX_TOKENS",
           "SERVED_MAX_TOKENS", "PROCESS_CONCURRENCY", "AUTO_TOKENS", "UNLOAD_SIGNALS"]

#: The agents (docs/usage.md: Agents); the protocols MM-ContextFold runs under (docs/fidelity.md).
METHODS = ("direct", "react", "mmcontextfold", "agentfold", "contextfold")
PROTOCOLS = ("paper", "release")


class Variant(str, Enum):
    """MM-ContextFold's ablations (paper §4.3, Table 3), as ``--variant`` spells them; ``FULL`` ("") is the method
    itself. A ``str``: the record holds the spelling."""

    FULL = ""
    IMAGE_CAPTION = "image-caption"        # the images as captions only: no pixels, no Lens (Image Caption)
    NO_INIT = "no-init"                    # no initial perception cycle (w/o Init)
    NO_IMAGE_IN_BRANCH = "no-image-in-branch"  # branches see no pixels (w/o Image in Branch)
    IMAGE_IN_MAIN = "image-in-main"        # the main state holds every query image (image in main)

    @property
    def branch_sees_pixels(self) -> bool:
        """Whether a branch is shown its assigned images' pixels."""
        return self in (Variant.FULL, Variant.NO_INIT, Variant.IMAGE_IN_MAIN)


VARIANTS = tuple(v.value for v in Variant)

#: How an assistant turn goes back into the history: ``keep`` its reasoning as ``reasoning_content``
#: (the chat template decides what it renders; Qwen3.5 renders it for turns after the last real user
#: message — paper B.3: "the main-state reasoning ... [is] retained"), or ``drop`` it (visible text only).
HISTORY_REASONING = ("keep", "drop")

#: How many result images of a lens_search go into the observation, as in WebWatcher's released agent
#: (paper C.1: observations are appended "including retrieved images"): its VLSearchImage tool keeps the
#: top 5 results (Alibaba-NLP/DeepResearch, WebAgent/WebWatcher/infer/vl_search_r1/qwen-agent-o1_search/
#: qwen_agent/tools/vl_search_image.py, ``search_data[:5]``) and its loop puts each result's image into
#: the tool response (WebAgent/WebWatcher/infer/scripts_eval/agent_eval.py).
WEBWATCHER_OBSERVATION_IMAGES = 5

#: Adaptive unloading's signals: kl = mean KL(with || without) over think tokens; dH = how much the images lower the
#: think entropy, max(0, -ΔH_t) (agent/methods/unload.py).
UNLOAD_SIGNALS = ("kl", "dH")
#: Adaptive unloading's ε per signal, in nats (ours, uncalibrated: "the images move each think token's distribution
#: by less than 0.05 nats on average" / "lower its entropy by less than 0.05 nats"); calibrate per model.
DEFAULT_THRESHOLD = {"kl": 0.05, "dH": 0.05}
#: M (ours, uncalibrated): two low steps in a row, so that one quiet step (e.g. a correction) does not unload.
DEFAULT_PATIENCE = 2

#: The tool cache's modes: replay = exact replays (a miss is an error).
CACHE_MODES = ("readwrite", "replay", "off")

#: The paper asks every backend for the top-20 alternatives of each token (B.1).
DEFAULT_TOP_LOGPROBS = 20

#: The tiny random model never closes its think block on its own; cap its outputs so the embedded
#: default finishes in seconds.
EMBEDDED_MAX_TOKENS = 48
#: Served models: the paper's release sends ``max_completion_tokens=8192`` (iLearn-Lab/MM26-MMContextFold,
#: mmcontextfold/utils/search_backbone_model.py); 4096 cut Qwen3.5's thinking and forced corrections.
SERVED_MAX_TOKENS = 8192

#: Samples in flight one runner process serves (ours, scripts/bench_runner.py, docs/performance.md: one process
#: keeps 0.95 of the ideal call rate at 64 in flight and falls to ~0.7 at 256, where two do better).
PROCESS_CONCURRENCY = 128

#: The viewer's ``--tokens auto`` embeds the coloured think tokens for runs up to this many trajectories (ours: at
#: ~1,000 think tokens per call a trajectory's token columns take ~50-100 KB in its page, its messages ~10 KB).
AUTO_TOKENS = 300
