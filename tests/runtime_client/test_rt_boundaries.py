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
