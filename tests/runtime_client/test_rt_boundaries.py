"""Dependencies point one way: runtime_client imports solver; solver imports neither torch
nor runtime_client (design section 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_solver_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['httpx'] = None\n"
        "import solver.planner, solver.schema, solver.plan_builder, solver.validate\n"
        "assert not any(m.startswith('runtime_client') for m in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_solver_sources_never_name_the_runtime() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "solver").rglob("*.py")
        if "runtime_client" in path.read_text() or "import torch" in path.read_text()
    ]
    assert offenders == []


def test_plan_client_imports_and_fetches_without_torch() -> None:
    """A data-loader worker uses the HTTP client without torch: a finder refuses ``torch``."""
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this process')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from runtime_client.plan_client import PlanClient, PlanClientConfig, layout_digest\n"
        "from solver.schema import PlanRequest\n"
        "cfg = PlanClientConfig(service_url='http://127.0.0.1:9', retries=1, backoff_s=0.0,\n"
        "                       timeout_s=0.5)\n"
        "request = PlanRequest.model_validate({'job_id': 'j', 'step': 0,\n"
        "    'cluster': {'nodes': 1, 'gpus_per_node': 8}, 'lengths': [900, 30, 7]})\n"
        "with PlanClient(cfg) as client:\n"
        "    got = client.get(request)\n"
        "assert got.source == 'fallback' and got.attempts == 2, got\n"
        "assert client.stats.retries == 1\n"
        "assert len(layout_digest(got.plan)) == 32\n"
        "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules)\n"
        "try:\n"
        "    import torch\n"
        "except ImportError:\n"
        "    print('blocked')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "blocked"  # the finder really was in the way
