"""`stderr_to_file`: what this process and its children write to stderr goes to a file."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from interlude.ui import stderr_to_file


def test_stderr_of_the_process_and_its_children_goes_to_the_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = os.fstat(2)
    # pytest swaps sys.stderr for its own buffer; the commands write to the real one.
    with capsys.disabled(), stderr_to_file("interlude-test-") as log:
        print("from python", file=sys.stderr)
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('from a child\\n')"])
        os.write(2, b"from fd 2\n")
    text = log.read_text()
    assert "from python" in text and "from a child" in text and "from fd 2" in text
    # Afterwards stderr is what it was.
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    log.unlink()
