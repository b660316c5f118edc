"""`python -m interlude_operator`: run the operator (kopf) against the current cluster.

In a pod it logs in with its service account, elsewhere with the kubeconfig. It watches the
EnginePools of the namespaces given (`--namespace`, repeatable) or of all (`--all-namespaces`)
and serves kopf's liveness probe on `--liveness` (the chart probes /healthz on port 8080) and,
with `--metrics-port`, its own metrics (`telemetry`; the chart uses 8081).

With `--peering NAME` replicas coordinate through kopf's peering object of that name (a
KopfPeering in the watched namespace, a ClusterKopfPeering with --all-namespaces) and only the
oldest acts (`peering`); without it the operator runs standalone, and must be the only one.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from collections.abc import Sequence

import kopf

from interlude_operator.peering import JITTER, seniority
from interlude_operator.spec import PROMETHEUS_URL_ENV

LEVELS = ("debug", "info", "warning", "error")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m interlude_operator", description=__doc__)
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", "-n", action="append", help="watch this namespace")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    p.add_argument("--log-level", type=str.lower, choices=LEVELS, default="info")
    p.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf's liveness endpoint; empty for none",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the operator's own Prometheus metrics on this port; 0 for none",
    )
    p.add_argument(
        "--peering",
        default="",
        help="kopf peering object the replicas coordinate through (it must exist); "
        "empty: standalone, for a single replica",
    )
    p.add_argument(
        "--prometheus-url",
        default=None,
        help=f"Prometheus for pools that name none (default: ${PROMETHEUS_URL_ENV})",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.prometheus_url is not None:
        os.environ[PROMETHEUS_URL_ENV] = args.prometheus_url
    kopf.configure(debug=args.log_level == "debug", quiet=args.log_level in ("warning", "error"))
    logging.getLogger().setLevel(args.log_level.upper())
    # Registers the handlers with kopf's default registry.
    from interlude_operator import handlers  # noqa: F401
    from interlude_operator.telemetry import serve

    serve(args.metrics_port)

    kopf.run(
        standalone=not args.peering,
        peering_name=args.peering or None,
        # Not a secret, only a tie-break between replicas started in the same millisecond.
        priority=seniority(time.time_ns(), random.randrange(JITTER)),
        clusterwide=bool(args.all_namespaces),
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
