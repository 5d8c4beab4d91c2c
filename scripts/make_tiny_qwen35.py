"""Build the embedded tiny, randomly initialised Qwen3.5 (offline, deterministic for a seed).

    python scripts/make_tiny_qwen35.py OUT_DIR [--seed 0]

Loadable afterwards with ``AutoProcessor.from_pretrained(OUT_DIR)`` and
``AutoModelForImageTextToText.from_pretrained(OUT_DIR)``. Its weights are random: outputs are
meaningless. See ``agent/backends/tiny_model.py`` for what is inside.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.backends.tiny_model import build  # noqa: E402


def main() -> None:
    from agent.cli import done, make_parser

    ap = make_parser("python scripts/make_tiny_qwen35.py", __doc__, [
        "python scripts/make_tiny_qwen35.py .cache/tiny-qwen35",
        "python scripts/make_tiny_qwen35.py /tmp/tiny --seed 1"])
    ap.add_argument("out_dir", help="where to write the model (config, weights, tokenizer, processor, chat template)")
    ap.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    args = ap.parse_args()
    path = build(args.out_dir, seed=args.seed)
    print(f"tiny Qwen3.5 (random weights) written to {path}")
    done([str(path)], f"python -m serving.check --model-dir {path}")


if __name__ == "__main__":
    main()
