"""Regenerate docs/config.md from the config dataclasses:  python scripts/gen_config_docs.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from charlm.config.reference import reference_markdown

target = Path(__file__).resolve().parents[1] / "docs" / "config.md"
target.write_text(reference_markdown(), encoding="utf-8")
print(f"wrote {target}")
