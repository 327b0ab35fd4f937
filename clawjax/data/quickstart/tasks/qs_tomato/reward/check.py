"""Sub-scores for qs_tomato: tomato.txt holds the one right word."""
import json
import pathlib
import sys

answer = pathlib.Path(sys.argv[1]) / "tomato.txt"
text = answer.read_text(encoding="utf-8", errors="replace") if answer.is_file() else ""
print(json.dumps({"right_word": float(text.strip().lower() == "red")}))
