"""Sub-scores for toy_rename_file."""
import json
import pathlib
import sys

ws = pathlib.Path(sys.argv[1])
done = ws / "done.txt"
print(json.dumps({
    "old_name_gone": float(not (ws / "todo.txt").exists()),
    "new_name_exists": float(done.is_file()),
    "content_kept": float(done.is_file() and done.read_text(encoding="utf-8", errors="replace")
                          == "buy milk\ncall the plumber\n"),
}))
