"""Runs a `grade(transcript, workspace_path) -> dict` checker in its own process.

Executed by path (`python3 grade_runner.py ENTRY WORKSPACE TRANSCRIPT_JSON`), never imported, so the
checker's interpreter needs nothing from clawjax. Prints the dict as the last line of stdout; anything
the checker prints itself comes before it.
"""

import importlib.util
import json
import sys


def main() -> None:
  entry, workspace, transcript_path = sys.argv[1:4]
  with open(transcript_path, encoding="utf-8") as fh:
    transcript = json.load(fh)
  spec = importlib.util.spec_from_file_location("clawjax_task_checker", entry)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  grade = getattr(module, "grade", None)
  if not callable(grade):
    sys.exit(f"{entry}: defines no grade(transcript, workspace_path)")
  result = grade(transcript, workspace)
  if not isinstance(result, dict):
    sys.exit(f"{entry}: grade() returned {type(result).__name__}, expected a dict")
  # Coerce numpy scalars and the like; anything non-numeric is reported as-is for the caller to reject.
  clean = {}
  for k, v in result.items():
    try:
      clean[str(k)] = float(v)
    except (TypeError, ValueError):
      clean[str(k)] = repr(v)
  print()
  print(json.dumps(clean))


if __name__ == "__main__":
  main()
