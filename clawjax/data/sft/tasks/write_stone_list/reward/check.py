"""Sub-scores for write_stone_list: list.txt holds the word stone."""
import json
import pathlib
import sys

answer = pathlib.Path(sys.argv[1]) / "list.txt"
text = answer.read_text(encoding="utf-8", errors="replace") if answer.is_file() else ""
print(json.dumps({"right_word": float(text.strip() == "stone")}))
