"""Generated sources are in step with their generators."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_wgmma_wrappers_are_generated_from_the_script():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_wgmma.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
