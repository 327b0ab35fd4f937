"""Sub-scores for toy_fix_typo."""
import json
import pathlib
import sys

ws = pathlib.Path(sys.argv[1])
notes = ws / "notes.md"
text = notes.read_text(encoding="utf-8", errors="replace") if notes.is_file() else ""
expected = ("# Meeting notes\n\nWe will receive the new laptops on Monday.\n"
            "Everyone should back up their files first.\n")
print(json.dumps({
    "typo_gone": float(notes.is_file() and "recieve" not in text),
    "word_fixed": float("We will receive the new laptops" in text),
    "rest_unchanged": float(text.strip() == expected.strip()),
}))
