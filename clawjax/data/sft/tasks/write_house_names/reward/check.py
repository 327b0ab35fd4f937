"""Sub-scores for write_house_names: names.txt holds the word house."""
import json
import pathlib
import sys

answer = pathlib.Path(sys.argv[1]) / "names.txt"
text = answer.read_text(encoding="utf-8", errors="replace") if answer.is_file() else ""
print(json.dumps({"right_word": float(text.strip() == "house")}))
