"""Sub-scores for toy_sum_numbers (12 + 7 - 3 + 25 = 41)."""
import json
import pathlib
import sys

ws = pathlib.Path(sys.argv[1])
answer = ws / "answer.txt"
text = answer.read_text(encoding="utf-8", errors="replace").strip() if answer.is_file() else ""
print(json.dumps({
    "answer_exists": float(answer.is_file()),
    "answer_correct": float(text in ("41", "41.0")),
}))
