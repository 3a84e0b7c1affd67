"""The answers a served run must give (dtlab's load test checks every response against them): the
trainer's own evaluation of the run's newest checkpoint, with the first --reviews test reviews as raw
text, written as JSON. It runs on a node of the cluster, where the checkpoint and the data are.

    python -m trainer.launchers.expected --config C.yml --reviews 256 --out expected.json
"""

import json
from pathlib import Path

from trainer.launchers import _cli
from trainer.serving import Predictor, expected_predictions, test_reviews

PROG = "python -m trainer.launchers.expected"


def add_expected_flags(parser):
    group = parser.add_argument_group("expected answers")
    group.add_argument("--reviews", required=True, type=_cli.at_least(1),
                       help="how many test reviews (from the first) the load test sends")
    group.add_argument("--out", required=True, help="the JSON file to write")
    return parser


def launch(cfg, args) -> None:
    predictor = Predictor(cfg)
    expected = expected_predictions(predictor)
    texts = test_reviews(cfg)[:args.reviews]
    expected |= {"texts": texts, "labels": expected["labels"][:len(texts)]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(expected))
    print(f"expected answers for {len(texts)} reviews from {predictor.checkpoint} (epoch {predictor.epoch}, "
          f"accuracy {expected['accuracy']:.4f} on the test split) in {args.out}", flush=True)


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, add_expected_flags)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
