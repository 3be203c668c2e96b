"""What ``import grader`` offers: the API, the settings, and the types its records come in."""

import subprocess
import sys


def test_every_exported_name_resolves_to_its_home_without_torch_or_vllm():
    script = (
        "import sys, grader, grader.records as r, grader.io.dataset as d, grader.status as s\n"
        "assert all(getattr(grader, n) is not None for n in grader.__all__)\n"
        "assert grader.RubricRecord is r.RubricRecord and issubclass(grader.RubricRecord, grader.Record)\n"
        "assert grader.Item is d.Item and grader.Status is s.Status\n"
        "assert 'torch' not in sys.modules and 'vllm' not in sys.modules\n"
        "print(len(grader.__all__))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 15
