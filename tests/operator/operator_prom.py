"""A real Prometheus server for the operator's tests (Debian's `prometheus` package)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from operator_fakes import ADDRESSES

PROMETHEUS = "/usr/bin/prometheus"


class Prometheus:
    """A real Prometheus server scraping every engine address the tests may use.

    Prometheus applies target changes only every 5 s, so instead of announcing each pod the
    tests give it a fixed set of loopback addresses on one port up front (an address with no
    engine is a down target) and each engine labels its series with its namespace and pod,
    which the scrape config honours.

    Side effects: a `prometheus` process on a free port, its TSDB under `workdir`.
    """

    def __init__(self, workdir: Path, port: int, engine_port: int) -> None:
        binary = PROMETHEUS if os.access(PROMETHEUS, os.X_OK) else shutil.which("prometheus")
        if binary is None:
            raise RuntimeError(
                "the operator's tests need a real Prometheus server: `apt-get install "
                "prometheus` (Debian's package puts it at /usr/bin/prometheus)"
            )
        self.url = f"http://127.0.0.1:{port}"
        self.engine_port = engine_port
        targets = [f"{ip}:{engine_port}" for ip in ADDRESSES]
        config = workdir / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
                    "scrape_configs": [
                        {
                            "job_name": "engines",
                            "honor_labels": True,
                            "static_configs": [{"targets": targets}],
                        }
                    ],
                }
            )
        )
        self.log = (workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.process.returncode}")
            # Ready, and past its first target sync (which comes up to 5 s after the start).
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(f"{self.url}/api/v1/query?query=up", timeout=1) as resp,
            ):
                if json.loads(resp.read())["data"]["result"]:
                    return
            time.sleep(0.2)
        raise RuntimeError("prometheus did not get ready in time")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
