"""Sub-scores for write_forest_tasks: tasks.txt holds the word forest."""
import json
import pathlib
import sys

answer = pathlib.Path(sys.argv[1]) / "tasks.txt"
text = answer.read_text(encoding="utf-8", errors="replace") if answer.is_file() else ""
print(json.dumps({"right_word": float(text.strip() == "forest")}))
