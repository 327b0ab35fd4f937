"""Sub-scores for write_river_summary: summary.txt holds the word river."""
import json
import pathlib
import sys

answer = pathlib.Path(sys.argv[1]) / "summary.txt"
text = answer.read_text(encoding="utf-8", errors="replace") if answer.is_file() else ""
print(json.dumps({"right_word": float(text.strip() == "river")}))
