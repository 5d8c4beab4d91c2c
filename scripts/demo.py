"""The embedded demo: tiny random Qwen3.5: one generation with an image, then the entropy probe end to end.

    python -m scripts.demo            # or: bash scripts/demo.sh (sets up the venv first)

Every number it prints comes from a randomly initialised model and means nothing; the point is
that every code path a GPU user hits (chat template, image processor, vision tower, top-20
logprobs, think segmentation, grouped vs exact entropy) runs for real.
"""
import sys

from serving.check import main as check_main

BANNER = """\
==========================================================================================
 mmcf-toolkit demo on the EMBEDDED DEFAULT: a tiny, RANDOMLY INITIALISED Qwen3.5.
 Its tokens, logprobs and entropies are meaningless; they only show that the pipeline runs.
 Point the same commands at a served Qwen3.5 (see README) for real numbers.
=========================================================================================="""


def main() -> int:
    print(BANNER, flush=True)
    print("\n[1/2] one image+text generation with top-20 logprobs (T = think token):\n", flush=True)
    rc = check_main(["--max-tokens", "24", *sys.argv[1:]])
    if rc:
        return rc
    print("\n[2/2] the entropy probe end to end: python -m probes.entropy (no arguments)\n", flush=True)
    from probes.entropy import main as entropy_main

    return entropy_main([])  # it ends by saying that its numbers are meaningless


if __name__ == "__main__":
    sys.exit(main())
