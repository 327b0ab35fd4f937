"""Sub-scores for toy_count_errors (3 ERROR lines)."""
import json
import pathlib
import sys

ws = pathlib.Path(sys.argv[1])
out = ws / "errors.txt"
text = out.read_text(encoding="utf-8", errors="replace").strip() if out.is_file() else ""
print(json.dumps({"errors_exists": float(out.is_file()), "errors_correct": float(text == "3")}))
